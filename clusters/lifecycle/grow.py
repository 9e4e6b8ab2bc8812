"""Adding workers to a ready cluster, planned before it is done (issue 37, docs/lifecycle.md
"Adding workers").

- `require_workers` is every check of `add_workers` before it reserves: the count, the cluster's
  state (ready, not quoted), the size limit, the key's limits, the environment's budget and one
  hour of the grown cluster on the balance: the create's money rules, by the create's functions.
- `plan_add_workers` runs those checks and looks for enough free machines, reserving nothing:
  what the dashboard's confirm page, the API's plan, the CLI and the MCP server show before
  anything is spent.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from decimal import Decimal

from django.db import transaction
from django.utils import timezone

from accounts.models import ApiKey
from billing import balances
from clusters.errors import ClusterRefused
from clusters.lifecycle.reserve import require_balance, require_budget, require_key_limits
from clusters.lifecycle.rules import lock_cluster
from clusters.models import Cluster, Node
from offers.models import MAX_NODES
from offers.offers import offered_hosts
from runcrate.money import usd

Status = Cluster.Status


def require_count(count: object) -> int:
    """A count of workers is a whole number, at least one."""
    if isinstance(count, bool) or not isinstance(count, int) or count < 1:
        raise ClusterRefused("invalid_count", "Add at least one worker.", field="count")
    return count


def require_workers(
    locked: Cluster | None, *, count: int, api_key: ApiKey | None, now: datetime
) -> int:
    """Every check of adding `count` workers to the locked cluster, in the order `add_workers`
    runs them; returns the machines live now. Raises ClusterRefused, changing nothing."""
    if locked is None or not locked.can_add_workers:
        if locked is not None and locked.status == Status.READY:  # ready, but quoted
            raise ClusterRefused(
                "invalid_state",
                "A quoted cluster's size is part of the terms agreed with our team: request "
                "a quote to change it.",
                field="count",
            )
        raise ClusterRefused(
            "invalid_state",
            f"Workers can be added to a ready cluster; this one is "
            f"{locked.status if locked else 'gone'}.",
        )
    live = locked.nodes.filter(status__in=Node.LIVE).count()
    if live + count > MAX_NODES:
        raise ClusterRefused(
            "invalid_count",
            f"A cluster has at most {MAX_NODES} machines: this one has {live}, so at most "
            f"{MAX_NODES - live} more.",
            field="count",
        )
    require_key_limits(
        api_key=api_key, machine_type=locked.machine_type, machines=live + count, adding=count
    )
    require_budget(environment=locked.environment, now=now)
    require_balance(
        project=locked.project,
        price_per_hour=locked.price_per_machine_hour * (live + count),
        doing=f"a cluster of {live + count} machines",
    )
    return live


@dataclass(frozen=True)
class WorkersPlan:
    """What adding `count` workers would cost, checked and unreserved."""

    cluster: Cluster
    count: int
    machines_now: int
    machine_price_per_hour: Decimal

    @property
    def machines_after(self) -> int:
        return self.machines_now + self.count

    @property
    def added_price_per_hour(self) -> Decimal:
        return self.machine_price_per_hour * self.count

    @property
    def price_per_hour(self) -> Decimal:
        """The cluster now."""
        return self.machine_price_per_hour * self.machines_now

    @property
    def new_price_per_hour(self) -> Decimal:
        """The cluster once every added machine is up."""
        return self.machine_price_per_hour * self.machines_after

    @property
    def balance_needed(self) -> Decimal:
        """What the balance had to hold: one hour of the grown cluster (the create's rule)."""
        return balances.balance_needed(self.new_price_per_hour)

    @property
    def billing(self) -> str:
        """What adding them does to the bill, in one sentence."""
        each = "it is" if self.count == 1 else "each is"
        return (
            f"+{usd(self.added_price_per_hour)}/h: {each} billed from the moment it is up, at "
            f"{usd(self.machine_price_per_hour)}/h like the others, until the cluster is "
            f"terminated; the cluster then costs {usd(self.new_price_per_hour)}/h."
        )

    def as_dict(self) -> dict:
        return {
            "cluster_id": self.cluster.pk,
            "name": self.cluster.name,
            "count": self.count,
            "machine_price_per_hour": str(self.machine_price_per_hour),
            "added_price_per_hour": str(self.added_price_per_hour),
            "machines_now": self.machines_now,
            "price_per_hour": str(self.price_per_hour),
            "machines_after": self.machines_after,
            "new_price_per_hour": str(self.new_price_per_hour),
            "balance_needed": str(self.balance_needed),
            "billing": self.billing,
        }


def plan_add_workers(
    *, cluster: Cluster, count: object, api_key: ApiKey | None = None
) -> WorkersPlan:
    """Every check `add_workers` makes, in its order, and enough free machines of the
    cluster's type; nothing is reserved or changed."""
    checked = require_count(count)
    now = timezone.now()
    with transaction.atomic():
        locked = lock_cluster(cluster.pk)
        live = require_workers(locked, count=checked, api_key=api_key, now=now)
        assert locked is not None  # require_workers refuses a cluster that is gone
        free = offered_hosts().filter(machine_type=locked.machine_type_id).count()
        if free < checked:
            raise ClusterRefused(
                "not_enough_machines",
                f"{_free_words(free)} free right now and this needs {checked}; "
                "nothing was reserved. Add fewer workers, or try again later.",
                field="count",
            )
    return WorkersPlan(locked, checked, live, locked.price_per_machine_hour)


def _free_words(free: int) -> str:
    if free == 0:
        return "No machine of this type is"
    if free == 1:
        return "Only 1 machine of this type is"
    return f"Only {free} machines of this type are"
