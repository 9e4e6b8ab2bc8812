"""What a node's agent tells us (DESIGN.md "The agent"). The real agent's HTTP endpoints call
these functions, and the lifecycle records through them what a driver that plays the agent
(the simulated data center) reports.

They only record facts (when the agent checked in and which GPUs it saw; which peers it
reached) and enqueue the reconciler, which judges them against the node's deadlines.
"""

from __future__ import annotations

import hmac
import re
from dataclasses import dataclass, field
from typing import Any

from django.db import transaction
from django.utils import timezone

from clusters import lifecycle
from clusters.drivers.base import AgentCheckIn, AgentReport
from clusters.lifecycle import health as node_health
from clusters.models import Cluster, Node


class AgentRefused(Exception):
    """A report the node's agent must not retry as is."""

    STATUS = {
        "bad_token": 403,
        "node_released": 410,
        "invalid_report": 422,
        "too_many_reports": 429,
    }

    def __init__(self, code: str, message: str) -> None:
        super().__init__(message)
        self.code = code
        self.message = message

    @property
    def status(self) -> int:
        return self.STATUS.get(self.code, 400)


# An unknown node and a wrong token get the same answer: a caller learns nothing about which
# node ids exist, and the agent stops on either (403).
NOT_THIS_NODE = "No node with this id has this token."


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
    anything to judge (clusters/lifecycle/health.py `judge_gpu_report`)."""

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
        except (ValueError, OverflowError):  # "nan", "1e999"
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
        except (KeyError, TypeError, ValueError, OverflowError):
            raise AgentRefused(
                "invalid_report", "Each GPU needs a name and memory_total_mib (a whole number)."
            ) from None
    return cleaned


_WIREGUARD_KEY = re.compile(r"[A-Za-z0-9+/]{42}[AEIMQUYcgkosw480]=")
_METHODS = {"iperf3", "tcp-stream", "simulated"}
_SHARED_METHODS = {"nfs", "sshfs", "simulated"}


def _clean_wireguard_key(key: Any) -> str | None:
    if key is None or key == "":
        return None
    if not isinstance(key, str) or not _WIREGUARD_KEY.fullmatch(key):
        raise AgentRefused(
            "invalid_report", "wireguard_public_key must be a WireGuard public key (44 base64)."
        )
    return key


def _clean_acceptance(acceptance: Any) -> dict[str, Any]:
    """What the agent measured to node-0: latency (ms), bandwidth (Mbit/s), how, and why not."""
    if acceptance is None:
        return {}
    if not isinstance(acceptance, dict):
        raise AgentRefused("invalid_report", "acceptance must be an object.")
    cleaned: dict[str, Any] = {}
    for key in ("latency_ms", "bandwidth_mbit"):
        value = acceptance.get(key)
        if value is not None and (
            isinstance(value, bool) or not isinstance(value, int | float) or not 0 <= value < 1e9
        ):
            raise AgentRefused("invalid_report", f"acceptance.{key} must be a number ≥ 0 or null.")
        cleaned[key] = None if value is None else round(float(value), 3)
    method = acceptance.get("method")
    if method is not None and method not in _METHODS:
        raise AgentRefused(
            "invalid_report", f"acceptance.method must be one of {', '.join(sorted(_METHODS))}."
        )
    cleaned["method"] = method
    error = acceptance.get("error")
    if error is not None and not isinstance(error, str):
        raise AgentRefused("invalid_report", "acceptance.error must be a string or null.")
    cleaned["error"] = error[:300] if error else None
    # A worker's mount of node-0's /shared (made before it measured): how, or why not.
    if "shared" in acceptance:
        shared, shared_error = acceptance.get("shared"), acceptance.get("shared_error")
        if shared is not None and shared not in _SHARED_METHODS:
            raise AgentRefused(
                "invalid_report",
                f"acceptance.shared must be one of {', '.join(sorted(_SHARED_METHODS))} or null.",
            )
        if shared_error is not None and not isinstance(shared_error, str):
            raise AgentRefused(
                "invalid_report", "acceptance.shared_error must be a string or null."
            )
        cleaned["shared"] = shared
        cleaned["shared_error"] = shared_error[:300] if shared_error else None
    return cleaned


def agent_check_in(
    *, node: Node | int, token: str, gpus: Any, wireguard_key: Any = None, health: Any = None
) -> Node:
    """The agent is up on `node` and sees `gpus` (step `agent`); later calls are heartbeats.

    `wireguard_key` is the public key of the node's WireGuard interface, which its peers need
    (the private key never leaves the node). `health` is the health report the agent of a
    ready or degraded cluster's node adds every RUNCRATE_HEALTH_SECONDS (clean_health; judged
    by clusters/lifecycle/health.py in this transaction)."""
    cleaned = _clean_gpus(gpus)
    key = _clean_wireguard_key(wireguard_key)
    report = clean_health(health)
    with transaction.atomic():
        found = _locked_node(node, token)
        fields = _check_in(found, gpus=cleaned, wireguard_key=key)
        found.save(update_fields=fields + _record_health(found, report))
        _judge_health(found, report)
        if found.status == Node.Status.STARTING or len(fields) > 1:
            # A heartbeat of a node that has joined moves nothing: no advance for it.
            lifecycle.enqueue_advance(found.cluster_id)
    return found


def agent_report_network(
    *, node: Node | int, token: str, reachability: Any, acceptance: Any = None
) -> Node:
    """The agent's test of the private network: peer name -> reached (step `network`), and
    what it measured to node-0 (the acceptance report)."""
    measured = _clean_network_report(reachability, acceptance)
    with transaction.atomic():
        found = _locked_node(node, token)
        fields = _network_report(found, reachability=reachability, measured=measured)
        if fields:
            found.save(update_fields=fields)
            lifecycle.enqueue_advance(found.cluster_id)
    return found


# What a driver that plays the agent (the simulated data center) reports is recorded through
# these, on a node the write-back of its work has locked and read: the same checks and the
# same record as the endpoints above, saved with the write-back and followed by its advance.


def record_check_in(found: Node, *, token: str, gpus: Any, wireguard_key: Any = None) -> list[str]:
    """`agent_check_in` on a locked `found`, unsaved; returns the fields it changed."""
    cleaned = _clean_gpus(gpus)
    key = _clean_wireguard_key(wireguard_key)
    _require_token(found, token)
    return _check_in(found, gpus=cleaned, wireguard_key=key)


def record_network_report(
    found: Node, *, token: str, reachability: Any, acceptance: Any = None
) -> list[str]:
    """`agent_report_network` on a locked `found`, unsaved; returns the fields it changed."""
    measured = _clean_network_report(reachability, acceptance)
    _require_token(found, token)
    return _network_report(found, reachability=reachability, measured=measured)


def record_report(found: Node, *, token: str, report: AgentReport) -> list[str]:
    """What a driver that plays the agent reported (`Driver.agent_report`), recorded on a
    locked `found`, unsaved, as the endpoints record the real agent's; returns the fields it
    changed."""
    if isinstance(report, AgentCheckIn):
        return record_check_in(
            found, token=token, gpus=report.gpus, wireguard_key=report.wireguard_key
        )
    return record_network_report(
        found, token=token, reachability=report.reachability, acceptance=report.acceptance
    )


def _require_token(found: Node, token: str) -> None:
    expected = found.agent_token_hash
    if not token or not expected or not hmac.compare_digest(lifecycle.token_hash(token), expected):
        raise AgentRefused("bad_token", NOT_THIS_NODE)


def _check_in(found: Node, *, gpus: list[dict], wireguard_key: str | None) -> list[str]:
    fields = ["heartbeat_at"]
    now = timezone.now()
    found.heartbeat_at = now
    if found.agent_at is None:
        found.agent_at = now
        found.gpus = gpus
        fields += ["agent_at", "gpus"]
    if wireguard_key and wireguard_key != found.wireguard_key:
        found.wireguard_key = wireguard_key
        fields.append("wireguard_key")
    return fields


def measure_turn(node: Node) -> bool:
    """Whether `node`'s agent may test the network now (its check-in's answer, `measure_turn`).
    Every worker measures its bandwidth over the same link of node-0, so they take turns: a
    worker waits until each worker of a lower index still in step `network` has reported, and
    no two ever measure at once (a figure is then that worker's own link). node-0 measures
    nothing and never waits. A node that has reported does not measure again."""
    if (
        node.status != Node.Status.STARTING
        or node.step != Node.Step.NETWORK
        or node.network_reported_at is not None
    ):
        return False
    if node.index == 0:
        return True
    return not Node.objects.filter(
        cluster_id=node.cluster_id,
        status=Node.Status.STARTING,
        step=Node.Step.NETWORK,
        network_reported_at__isnull=True,
        index__gt=0,
        index__lt=node.index,
    ).exists()


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
    nodes = list(cluster.nodes.select_related("host").order_by("index"))
    assert found.health_at is not None  # stamped with the report
    node_health.judge_health(cluster, nodes, now=found.health_at)


def _clean_network_report(reachability: Any, acceptance: Any) -> dict[str, Any]:
    if not isinstance(reachability, dict) or not all(
        isinstance(k, str) and isinstance(v, bool) for k, v in reachability.items()
    ):
        raise AgentRefused("invalid_report", "reachability must map peer names to true or false.")
    return _clean_acceptance(acceptance)


def _network_report(found: Node, *, reachability: dict, measured: dict) -> list[str]:
    if found.status != Node.Status.STARTING:
        return []
    found.reachability = reachability
    found.acceptance = measured
    found.network_reported_at = timezone.now()
    return ["reachability", "acceptance", "network_reported_at"]
