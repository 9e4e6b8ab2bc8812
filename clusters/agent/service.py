"""What a node's agent tells us (DESIGN.md "The agent"). The real agent's HTTP endpoints and
the simulated driver call these same functions.

They only record facts (when the agent checked in and which GPUs it saw; which peers it
reached) and enqueue the reconciler, which judges them against the node's deadlines.
"""

from __future__ import annotations

import hmac
from typing import Any

from django.db import transaction
from django.utils import timezone

from clusters import lifecycle
from clusters.models import Node


class AgentRefused(Exception):
    """A report the node's agent must not retry as is."""

    STATUS = {"unknown_node": 404, "bad_token": 403, "node_released": 410, "invalid_report": 422}

    def __init__(self, code: str, message: str) -> None:
        super().__init__(message)
        self.code = code
        self.message = message

    @property
    def status(self) -> int:
        return self.STATUS.get(self.code, 400)


def _locked_node(node: Node | int, token: str) -> Node:
    node_id = node.pk if isinstance(node, Node) else node
    cluster_id = Node.objects.filter(pk=node_id).values_list("cluster_id", flat=True).first()
    if cluster_id is None or lifecycle.lock_cluster(cluster_id) is None:
        raise AgentRefused("unknown_node", "No such node.")
    found = Node.objects.get(pk=node_id)
    expected = found.agent_token_hash
    if not token or not expected or not hmac.compare_digest(lifecycle.token_hash(token), expected):
        raise AgentRefused("bad_token", "The node token does not match this node.")
    if found.status in (Node.Status.FAILED, Node.Status.ENDED):
        raise AgentRefused("node_released", "This node was released; stop the agent.")
    return found


def parse_nvidia_smi(csv: str) -> list[dict[str, Any]]:
    """Rows of `nvidia-smi --query-gpu=name,memory.total,uuid,driver_version --format=csv,
    noheader,nounits` as dictionaries."""
    gpus = []
    for number, line in enumerate(csv.splitlines(), start=1):
        if not line.strip():
            continue
        fields = [f.strip() for f in line.split(",")]
        if len(fields) != 4:
            raise AgentRefused(
                "invalid_report", f"GPU line {number} has {len(fields)} fields, not 4: {line!r}"
            )
        name, memory, uuid, driver = fields
        try:
            memory_mib = int(float(memory))
        except ValueError:
            raise AgentRefused(
                "invalid_report", f"GPU line {number}: memory {memory!r} is not a number."
            ) from None
        gpus.append(
            {"name": name, "memory_total_mib": memory_mib, "uuid": uuid, "driver_version": driver}
        )
    return gpus


def _clean_gpus(gpus: Any) -> list[dict[str, Any]]:
    if isinstance(gpus, str):
        return parse_nvidia_smi(gpus)
    if not isinstance(gpus, list) or not all(isinstance(g, dict) for g in gpus):
        raise AgentRefused("invalid_report", "gpus must be a list of objects (or nvidia-smi CSV).")
    cleaned = []
    for gpu in gpus:
        try:
            cleaned.append(
                {
                    "name": str(gpu["name"])[:100],
                    "memory_total_mib": int(gpu["memory_total_mib"]),
                    "uuid": str(gpu.get("uuid", ""))[:100],
                    "driver_version": str(gpu.get("driver_version", ""))[:40],
                }
            )
        except (KeyError, TypeError, ValueError):
            raise AgentRefused(
                "invalid_report", "Each GPU needs a name and memory_total_mib (a whole number)."
            ) from None
    return cleaned


def agent_check_in(*, node: Node | int, token: str, gpus: Any) -> Node:
    """The agent is up on `node` and sees `gpus` (step `agent`); later calls are heartbeats."""
    cleaned = _clean_gpus(gpus)
    now = timezone.now()
    with transaction.atomic():
        found = _locked_node(node, token)
        fields = ["driver_state"]
        if found.agent_at is None:
            found.agent_at = now
            found.gpus = cleaned
            fields += ["agent_at", "gpus"]
        found.driver_state["agent_seen_at"] = now.isoformat()
        found.save(update_fields=fields)
        lifecycle.enqueue_advance(found.cluster_id)
    return found


def agent_report_network(*, node: Node | int, token: str, reachability: Any) -> Node:
    """The agent's test of the private network: peer name -> reached (step `network`)."""
    if not isinstance(reachability, dict) or not all(
        isinstance(k, str) and isinstance(v, bool) for k, v in reachability.items()
    ):
        raise AgentRefused("invalid_report", "reachability must map peer names to true or false.")
    now = timezone.now()
    with transaction.atomic():
        found = _locked_node(node, token)
        if found.status == Node.Status.STARTING:
            found.reachability = reachability
            found.network_reported_at = now
            found.save(update_fields=["reachability", "network_reported_at"])
            lifecycle.enqueue_advance(found.cluster_id)
    return found
