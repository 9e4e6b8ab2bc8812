"""The plan of a create (`POST /api/v1/clusters/plan`, docs/api.md "Planning a create"): what
creating a cluster would do, decided by the create's own checks (`lifecycle.plan_create`) and
reserving nothing, and the `plan_token` that binds a later create to exactly that body.

The token is Django's signed, timestamped value (`django.core.signing`), signed with the
server's SECRET_KEY and verified against SECRET_KEY_FALLBACKS too, so a token issued by one web
process, replica or client process is honoured by any other, and across a key rotation. It
carries the project, the API key (or none, for a session) and a digest of the body; it lasts
PLAN_TTL.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass
from datetime import datetime, timedelta
from decimal import ROUND_DOWN, Decimal
from typing import Any

from django.core import signing
from django.utils import timezone

from accounts.models import ApiKey, Environment, Project, User
from billing import balances, policy, usage
from billing.access import can_manage_billing
from clusters import connect, estimates, lifecycle
from clusters.errors import ClusterRefused
from clusters.models import Cluster
from offers.offers import ETHERNET_NOT_FOR, ETHERNET_SUITS, Offer
from runcrate.durations import in_words

PLAN_TTL = timedelta(minutes=10)
_SALT = "runcrate.clusters.plan"


def body_digest(body: dict[str, Any]) -> str:
    """The digest of a create's body (every field but `plan_token`, defaults filled in): the
    same body always gives the same digest, whatever the order of its keys."""
    text = json.dumps(body, sort_keys=True, separators=(",", ":"), default=str)
    return hashlib.sha256(text.encode()).hexdigest()


def issue_token(*, project: Project, api_key: ApiKey | None, body: dict[str, Any]) -> str:
    value = {"p": project.pk, "k": api_key.pk if api_key else None, "b": body_digest(body)}
    return signing.dumps(value, salt=_SALT)


def check_token(
    token: str,
    *,
    project: Project,
    api_key: ApiKey | None,
    body: dict[str, Any],
    plan_path: str = "POST /api/v1/clusters/plan",
) -> None:
    """Refuse a create (or a replacement: `plan_path` names its plan) whose `plan_token` is not
    a plan of exactly this body, for this project and key (`plan_mismatch`), or is older than
    PLAN_TTL (`plan_expired`)."""
    try:
        value = signing.loads(token, salt=_SALT, max_age=PLAN_TTL)
    except signing.SignatureExpired:
        raise ClusterRefused(
            "plan_expired",
            f"This plan_token is older than {in_words(PLAN_TTL.total_seconds())}: plan again "
            f"({plan_path}) and send it with the new token. Nothing was reserved.",
        ) from None
    except signing.BadSignature:
        raise ClusterRefused(
            "plan_mismatch",
            f"This plan_token is not one this server gave: plan again ({plan_path}) and send "
            "it with the token it answers. Nothing was reserved.",
        ) from None
    if value != {"p": project.pk, "k": api_key.pk if api_key else None, "b": body_digest(body)}:
        raise ClusterRefused(
            "plan_mismatch",
            "This plan_token was given for something else (another body, machine, project or "
            "API key): send exactly what was planned, or plan this one. Nothing was reserved.",
        )


@dataclass(frozen=True)
class Plan:
    """What a create of `body` would start and cost, checked as the create checks it."""

    body: dict[str, Any]
    checked: lifecycle.Checked
    offer: Offer
    balance: Decimal | None  # None for whoever may not see billing (SPEC §5)
    running_per_hour: Decimal | None
    balance_needed: Decimal
    ready_estimate: timedelta
    token: str
    expires_at: datetime

    @property
    def price_per_hour(self) -> Decimal:
        return self.checked.price_per_machine_hour * self.offer.nodes

    @property
    def hours_covered(self) -> Decimal | None:
        """The hours the balance pays for this cluster beside what already runs (the runway,
        billing/policy.py), rounded down to the cent: a plan never promises a minute more."""
        if self.balance is None or self.running_per_hour is None:
            return None
        hours = policy.runway_hours(self.balance, self.price_per_hour + self.running_per_hour)
        return (hours or Decimal(0)).quantize(Decimal("0.01"), rounding=ROUND_DOWN)


def plan(
    *,
    project: Project,
    user: User,
    environment: Environment,
    api_key: ApiKey | None,
    body: dict[str, Any],
) -> Plan:
    """Plan a create of `body` (the create's fields: offer_id, nodes, name, software,
    ssh_key_ids, member_ids, volume_id; `environment` already found): every check the create
    runs, or its refusal (ClusterRefused, exactly as the create raises it). Writes nothing."""
    checked = lifecycle.plan_create(
        project=project,
        environment=environment,
        offer_slug=body["offer_id"],
        nodes=body["nodes"],
        name=body["name"],
        software=body["software"],
        ssh_key_ids=body["ssh_key_ids"],
        member_ids=body["member_ids"],
        volume_id=body["volume_id"],
        api_key=api_key,
        user=user,
    )
    assert checked.offer is not None  # a self-serve create always has its offer
    sees_billing = can_manage_billing(user=user, project=project) and (
        api_key is None or api_key.has_scope(ApiKey.Scope.BILLING)
    )
    # Read only for whoever is shown it (SPEC §5): the others' plan costs no balance query.
    summary = usage.summary(project_id=project.pk) if sees_billing else None
    machine_type = checked.machine_type
    price = checked.price_per_machine_hour * body["nodes"]
    return Plan(
        body=body,
        checked=checked,
        offer=checked.offer,
        balance=summary.balance if summary else None,
        running_per_hour=summary.burn_rate if summary else None,
        balance_needed=balances.balance_needed(price),
        ready_estimate=estimates.time_to_ready(
            boot_seconds=machine_type.boot_seconds, software=body["software"]
        ),
        token=issue_token(project=project, api_key=api_key, body=body),
        expires_at=timezone.now() + PLAN_TTL,
    )


def network_terms(interconnect: str) -> dict[str, str]:
    """What the network between the machines gives and suits, as a plan says it."""
    terms = {"interconnect": interconnect, "expected": connect.expected_bandwidth(interconnect)}
    if interconnect == "ethernet":
        terms |= {"suits": ETHERNET_SUITS, "not_for": ETHERNET_NOT_FOR}
    return terms


def workers_body(
    cluster: Cluster, count: int, *, machines_now: int | None = None
) -> dict[str, Any]:
    """What an add-workers plan_token binds (the API's plan, the dashboard's confirm page): the
    cluster, how many machines, and how many it has up now (`machines_now`, else read): once
    they were added the same token is refused, so a retry or a second click never adds twice."""
    if machines_now is None:
        machines_now = Cluster.machines_up_in(cluster.nodes.all())
    return {"workers": cluster.pk, "count": count, "machines": machines_now}
