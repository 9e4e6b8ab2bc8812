"""What a node's agent tells us (DESIGN.md "The agent"): the real agent's HTTP endpoints call
these functions. They find the node its token names (locked, or for a metrics report read
once), record what it says through the lifecycle (clusters/lifecycle/observe.py, the same
record the simulated data center's reports take), keep and judge its health reports, and
enqueue the reconciler, which judges the facts against the node's deadlines.
"""

from __future__ import annotations

import hmac
import re
from dataclasses import dataclass, field
from typing import Any

from django.db import transaction
from django.db.models import F
from django.utils import timezone

from clusters import lifecycle
from clusters.lifecycle import rounds
from clusters.lifecycle.observe import (
    NOT_THIS_NODE,
    AgentRefused,
    check_in,
    clean_gpus,
    clean_network_report,
    clean_wireguard_key,
    network_report,
    parse_nvidia_smi,
    record_report,
)
from clusters.models import Cluster, Node, private_ip
from clusters.telemetry import health as node_health


def _locked_node(node: Node | int, token: str) -> Node:
    """The node whose agent holds `token`, read after its cluster's row is locked.

    The token is checked first, so a caller without it never waits on (or holds) the cluster's
    lock: a known node with a wrong token and an unknown node id cost the same, one read of the
    node's token hash (an id that cannot exist reads id 0, which finds nothing) and one
    constant-time compare, and neither locks anything. Only then is the cluster locked and the
    node read again, its token checked against that locked read (a reimage may have replaced
    it in between)."""
    node_id = node.pk if isinstance(node, Node) else node
    possible = isinstance(node_id, int) and 0 < node_id < 2**63
    row = (
        Node.objects.filter(pk=node_id if possible else 0)
        .values_list("cluster_id", "agent_token_hash")
        .first()
    )
    cluster_id, expected = row if row is not None else (None, "")
    if not _token_matches(token, expected) or cluster_id is None:
        raise AgentRefused("bad_token", NOT_THIS_NODE)
    locked = lifecycle.lock_cluster(cluster_id)
    found = Node.objects.filter(pk=node_id).first() if locked is not None else None
    if found is None or found.agent_token_hash != expected:
        raise AgentRefused("bad_token", NOT_THIS_NODE)
    assert locked is not None  # a node is looked for only under its locked cluster
    found.cluster = locked  # the locked row: the health judgement and the answer read it
    if found.status in (Node.Status.FAILED, Node.Status.ENDED):
        raise AgentRefused("node_released", "This node was released; stop the agent.")
    return found


@dataclass(frozen=True)
class ReportingNode:
    """Who sent a metrics report: the node, its cluster, and both statuses, as one read saw
    them (`reporting_node`); and what its GPU health judgement needs to know whether there is
    anything to judge (clusters/telemetry/health.py `judge_gpu_report`)."""

    node_id: int
    cluster_id: int
    node_status: str
    cluster_status: str
    token_hash: str = ""
    accepted_gpus: int = 0  # the GPUs its agent saw at acceptance (`Node.gpus`)
    gpu_health: dict[str, Any] = field(default_factory=dict)  # the conditions kept on it
    gpu_problems_open: bool = False  # its cluster has open GPU problems naming it
    machine_gpus: int = 0  # the GPUs its machine has (the cluster's machine type's)


def reporting_node(node: int, token: str) -> ReportingNode:
    """The node whose agent holds `token`, for a report that only adds rows of its own (the
    metrics): one read of the node and its cluster's status, the check-in's token check and its
    refusals (a wrong token or an unknown node alike, then a released node), and no lock: such
    a report changes nothing another writer reads, so it never waits on the cluster's row. The
    same read brings what the GPU health judgement asks first (the node's accepted GPUs, its
    GPU conditions, its cluster's open problems) and the GPUs its machine has, so a healthy
    report needs no other."""
    possible = isinstance(node, int) and 0 < node < 2**63
    row = (
        Node.objects.filter(pk=node if possible else 0)
        .values_list(
            "cluster_id",
            "agent_token_hash",
            "status",
            "cluster__status",
            "index",
            "gpus",
            "gpu_health",
            "cluster__health_problems",
            "cluster__machine_type__gpus_per_machine",
        )
        .first()
    )
    (
        cluster_id,
        expected,
        status,
        cluster_status,
        index,
        gpus,
        gpu_health,
        problems,
        machine_gpus,
    ) = row if row is not None else (None, "", "", "", 0, [], {}, {}, 0)
    if not _token_matches(token, expected) or cluster_id is None:
        raise AgentRefused("bad_token", NOT_THIS_NODE)
    if status in (Node.Status.FAILED, Node.Status.ENDED):
        raise AgentRefused("node_released", "This node was released; stop the agent.")
    gpu_problem = f"gpu:{Node(index=index).name}:"
    return ReportingNode(
        node_id=node,
        cluster_id=cluster_id,
        node_status=status,
        cluster_status=cluster_status,
        token_hash=expected,
        accepted_gpus=len(gpus) if isinstance(gpus, list) else 0,
        gpu_health=gpu_health or {},
        gpu_problems_open=any(key.startswith(gpu_problem) for key in problems or {}),
        machine_gpus=machine_gpus,
    )


def _token_matches(token: str, expected: str) -> bool:
    """Whether `token` hashes to `expected`. The hash is computed and compared (as bytes, in
    constant time) even when there is no token or no node, so every refusal costs the same."""
    given = lifecycle.token_hash(token or "").encode()
    matches = hmac.compare_digest(given, (expected or "-" * 64).encode())
    return bool(token and expected and matches)


def agent_check_in(
    *, node: Node | int, token: str, gpus: Any, wireguard_key: Any = None, health: Any = None
) -> Node:
    """The agent is up on `node` and sees `gpus` (step `agent`); later calls are heartbeats.

    `wireguard_key` is the public key of the node's WireGuard interface, which its peers need
    (the private key never leaves the node). `health` is the health report the agent of a
    ready or degraded cluster's node adds every RUNCRATE_HEALTH_SECONDS (clean_health; judged
    by clusters/telemetry/health.py in this transaction)."""
    cleaned = clean_gpus(gpus)
    key = clean_wireguard_key(wireguard_key)
    report = clean_health(health)
    with transaction.atomic():
        found = _locked_node(node, token)
        fields = check_in(found, gpus=cleaned, wireguard_key=key)
        found.save(update_fields=fields + _record_health(found, report))
        _judge_health(found, report)
        if len(fields) > 1:
            # A bare heartbeat moves nothing (the reconciler never reads a starting node's
            # heartbeat; its deadlines are the tick's): no advance for it, so the check-ins of
            # agents waiting to measure (every second) cost no pass over the cluster each.
            lifecycle.enqueue_advance(found.cluster_id)
    return found


def agent_report_network(
    *, node: Node | int, token: str, reachability: Any, acceptance: Any = None
) -> Node:
    """The agent's test of the private network: peer name -> reached (step `network`), and
    what it measured to node-0 (the acceptance report)."""
    measured = clean_network_report(reachability, acceptance)
    with transaction.atomic():
        found = _locked_node(node, token)
        fields = network_report(found, reachability=reachability, measured=measured)
        if fields:
            found.save(update_fields=fields)
            lifecycle.enqueue_advance(found.cluster_id)
    return found


def _measuring(node: Node) -> bool:
    return (
        node.status == Node.Status.STARTING
        and node.step == Node.Step.NETWORK
        and node.network_reported_at is None
    )


# How many measurements the cluster's location carries at once (rounds.wave_of).
_AT_ONCE = "cluster__machine_type__location__measurements_at_once"


def measure_turn(node: Node) -> bool:
    """Whether `node`'s agent may test the network now (its check-in's answer, `measure_turn`).
    The batch measures in rounds (`clusters.lifecycle.rounds`): pairs that never share a
    machine's link, each round in waves of at most the location's `measurements_at_once`
    (all of it where the location gives none). A node's wave is open once every node that sends
    in an earlier wave has reported (or left step `network`). A node that has reported does
    not measure again."""
    if not _measuring(node):
        return False
    batch = list(
        Node.objects.filter(cluster_id=node.cluster_id, status=Node.Status.STARTING)
        .annotate(at_once=F(_AT_ONCE))
        .only("pk", "index", "status", "step", "network_reported_at")
    )
    at_once = batch[0].at_once if batch else None
    waves = rounds.wave_of([n.index for n in batch], at_once)
    mine = waves.get(node.index)
    if mine is None:
        return node.index == 0  # node-0 alone measures nothing, and never waits
    return not any(
        _measuring(other) and other.index in waves and waves[other.index] < mine for other in batch
    )


# From its first check-in until it has reported its network (its step moving on to `network`,
# its peers knowing it, its round), a node's agent checks in this often instead of every 5 s,
# so it starts measuring within a second of being let:
# one check-in per node per second, as slow as one every 5 s at 80 nodes and more
# (`WAITING_CHECK_INS_PER_SECOND` at most of a cluster's nodes).
WAITING_CHECK_IN_SECONDS = 1.0
WAITING_CHECK_INS_PER_SECOND = 16.0


def check_in_seconds(node: Node, nodes: int) -> float | None:
    """How soon `node`'s agent checks in again (the answer's `check_in_seconds`): soon while it
    is starting and has not reported its network (`nodes`: the cluster's live nodes), else None
    (the agent's own interval: 5 s while starting, its heartbeat once joined)."""
    if node.status != Node.Status.STARTING or node.network_reported_at is not None:
        return None
    return min(5.0, max(WAITING_CHECK_IN_SECONDS, nodes / WAITING_CHECK_INS_PER_SECOND))


def measure_peer(node: Node) -> dict[str, str] | None:
    """The peer `node`'s agent measures to in its round (`measure_peer`: name and private
    address), or None where it measures nothing now."""
    if not _measuring(node):
        return None
    indices = Node.objects.filter(
        cluster_id=node.cluster_id, status=Node.Status.STARTING
    ).values_list("index", flat=True)
    mine = rounds.placements(list(indices)).get(node.index)
    if mine is None:
        return None
    return {"name": f"node-{mine.peer}", "private_ip": private_ip(mine.peer)}


_PEER_NAME = re.compile(r"node-[0-9]{1,3}")
_SERVICE_NAME = re.compile(r"[a-z][a-z0-9_.-]{0,31}")
MAX_HEALTH_PEERS = 300
MAX_HEALTH_SERVICES = 20


def clean_health(health: Any) -> dict[str, Any] | None:
    """A health report as the agent sends it (`peers`: name -> reached, `services`: name ->
    running, `shared`: null or {path, mounted, answers, error}, `interface_up`: absent or whether
    its private network's interface is up), checked and cut to what is
    kept; None when there is none. A report of another shape is refused (422), saying what."""
    if health is None:
        return None
    if not isinstance(health, dict):
        raise AgentRefused("invalid_report", "health must be an object.")
    cleaned: dict[str, Any] = {}
    for key, pattern, most, what in (
        ("peers", _PEER_NAME, MAX_HEALTH_PEERS, "peer names (node-N)"),
        ("services", _SERVICE_NAME, MAX_HEALTH_SERVICES, "service names"),
    ):
        value = health.get(key, {})
        if (
            not isinstance(value, dict)
            or len(value) > most
            or not all(
                isinstance(k, str) and pattern.fullmatch(k) and isinstance(v, bool)
                for k, v in value.items()
            )
        ):
            raise AgentRefused(
                "invalid_report",
                f"health.{key} must map at most {most} {what} to true or false.",
            )
        cleaned[key] = dict(sorted(value.items()))
    shared = health.get("shared")
    if shared is not None:
        if not isinstance(shared, dict):
            raise AgentRefused("invalid_report", "health.shared must be an object or null.")
        path, error = shared.get("path", "/shared"), shared.get("error")
        if not isinstance(path, str) or not path.startswith("/") or len(path) > 200:
            raise AgentRefused("invalid_report", "health.shared.path must be an absolute path.")
        if not isinstance(shared.get("mounted"), bool):
            raise AgentRefused("invalid_report", "health.shared.mounted must be true or false.")
        if shared.get("answers") is not None and not isinstance(shared["answers"], bool):
            raise AgentRefused(
                "invalid_report", "health.shared.answers must be true, false or null."
            )
        if error is not None and not isinstance(error, str):
            raise AgentRefused("invalid_report", "health.shared.error must be a string or null.")
        shared = {
            "path": path,
            "mounted": shared["mounted"],
            "answers": shared.get("answers"),
            "error": error[:300] if error else None,
        }
    cleaned["shared"] = shared
    # Whether the node's private network interface is up (an agent without a WireGuard
    # interface leaves it out).
    interface_up = health.get("interface_up")
    if interface_up is not None:
        if not isinstance(interface_up, bool):
            raise AgentRefused(
                "invalid_report", "health.interface_up must be true, false or absent."
            )
        cleaned["interface_up"] = interface_up
    return cleaned


def _record_health(found: Node, report: dict[str, Any] | None) -> list[str]:
    """Keep the report on a watched node (a ready or degraded cluster's joined one); a report
    from any other is dropped. Returns the fields changed."""
    if report is None or not node_health.watched(found.cluster, found):
        return []
    found.health = report
    found.health_at = timezone.now()
    return ["health", "health_at"]


def _judge_health(found: Node, report: dict[str, Any] | None) -> None:
    """Judge the cluster's reports, with its nodes read once, only when there may be something to
    say: this report shows a problem, or the cluster has problems that may be gone. A healthy
    report of a healthy cluster costs no query."""
    cluster = found.cluster
    if report is None or not node_health.watched(cluster, found):
        return
    open_problems = cluster.status == Cluster.Status.DEGRADED and cluster.health_problems
    if not node_health.report_has_problem(report) and not open_problems:
        return
    nodes = list(cluster.nodes.select_related("host").order_by("index", "pk"))
    assert found.health_at is not None  # stamped with the report
    node_health.judge_health(cluster, nodes, now=found.health_at)


__all__ = [
    "AgentRefused",
    "ReportingNode",
    "agent_check_in",
    "agent_report_network",
    "clean_health",
    "measure_peer",
    "measure_turn",
    "parse_nvidia_smi",
    "record_report",
    "reporting_node",
]
