"""Unhealthy machines of ready clusters (issue 18, D8; docs/lifecycle.md, "Unhealthy machines").

Every RUNCRATE_HEALTH_SECONDS the agent of a joined node of a ready or degraded cluster adds a
health report to its heartbeat (`health_request` says what to check; the agent service cleans
what comes back and stores it on the node): which of the other joined machines it reaches over
the private network, whether sshd and the cluster's software daemons run, and whether a mounted
/shared answers. `judge_health` reads the cluster's reports together, in the heartbeat's
transaction on the locked cluster, and:

- a problem not seen before (a node cut off from the others, a daemon gone, /shared hung) writes
  one `node_unhealthy` event naming the node and what (which sends the "degraded" email), and a
  ready cluster becomes `degraded` with that failure; a problem already announced writes nothing
  more, however many heartbeats report it;
- a problem gone writes one `node_healthy` event; once none is left, a cluster that only this
  made degraded is `ready` again (one degraded for another reason, an install or a lost
  machine, stays degraded: that reason still holds).

Nothing here bills or ends anything: the machines stay up and billed, as on any degraded cluster,
and the user decides. A report is judged only while fresh (3 × RUNCRATE_HEALTH_SECONDS), and
nothing is judged while a worker joins (the private network is changing then).

GPU health (issue 23, docs/metrics.md "GPU health") is judged here too, from the metrics reports
(`clusters.telemetry.metrics.record`): `gpu_conditions` reads what a report shows wrong with its
GPUs (an
uncorrectable ECC error, pages pending retirement or rows pending remapping, a hardware or
thermal slowdown, fewer GPUs than the node's acceptance counted), `judge_gpu_report` keeps them
on the node (`Node.gpu_health`, each with the server's time it was first seen) and judges the
cluster, and `find_problems` turns each condition that counts (a slowdown only once it lasted
more than SLOWDOWN_SECONDS) into a `Problem` like any other: one event and one email when it
begins, one event when it ends.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

from django.conf import settings
from django.db import transaction

from clusters import policy
from clusters.lifecycle import repair
from clusters.lifecycle.rules import joining, lock_cluster
from clusters.lifecycle.steps import drain
from clusters.lifecycle.unit import UnitOfWork, read_nodes
from clusters.models import Cluster, Event, Node
from runcrate.durations import span

Status = Cluster.Status
NodeStatus = Node.Status
Reason = Event.Reason

# The daemons each software runs, on every node and on the head alone
# (clusters/machines/software/host).
SERVICES: dict[str, tuple[tuple[str, ...], tuple[str, ...]]] = {
    Cluster.Software.NONE: ((), ()),
    Cluster.Software.SLURM: (("slurmd", "munged"), ("slurmctld",)),
    Cluster.Software.RAY: (("raylet",), ("gcs_server",)),
    Cluster.Software.KUBERNETES: (("k3s",), ()),
}
# A report older than this many health intervals says nothing about now.
FRESH_INTERVALS = 3


def watched(cluster: Cluster, node: Node) -> bool:
    return policy.is_running(cluster.status) and node.status == NodeStatus.JOINED


def expected_services(cluster: Cluster, node: Node) -> list[str]:
    """sshd, and the software's daemons once the node installed it (a node whose install failed
    is not asked about daemons it never ran)."""
    services = ["sshd"]
    if node.step == Node.Step.DONE:
        everywhere, head = SERVICES.get(cluster.software, ((), ()))
        services += [*everywhere, *(head if node.index == 0 else ())]
    if node.drained and cluster.software == Cluster.Software.RAY:
        # Draining a Ray worker stops its raylet (steps/drain.py): not a problem of its own.
        services.remove("raylet")
    return services


def health_request(cluster: Cluster, node: Node, peers: list[Node]) -> dict | None:
    """What the node's agent checks and reports with its heartbeats (the check-in's answer), or
    None while its cluster is not watched: the other joined machines' private addresses (probed
    on the agent's probe port) and the services that must run."""
    if not watched(cluster, node):
        return None
    return {
        "peers": {p.name: p.private_ip for p in peers if p.status == NodeStatus.JOINED},
        "services": expected_services(cluster, node),
    }


def report_has_problem(report: dict) -> bool:
    """Whether one cleaned report, on its own, shows anything wrong."""
    shared = report.get("shared") or {}
    return (
        not all(report.get("peers", {}).values())
        or not all(report.get("services", {}).values())
        or (shared.get("mounted") is True and shared.get("answers") is False)
        or shared.get("mounted") is False
        or report.get("interface_up") is False
    )


@dataclass(frozen=True)
class Problem:
    key: str  # what stays the same while it lasts: "network", "service:node-2:slurmd"
    node: str  # the machine it names
    message: str  # "node-1 cannot reach node-0, node-2 over the private network"
    healed: str  # what the node_healthy event says once it is gone


def find_problems(cluster: Cluster, nodes: list[Node], *, now: datetime) -> list[Problem]:
    """What the fresh reports of the cluster's joined machines show wrong now, in order: the
    private network, then per machine its services and /shared."""
    joined = [n for n in nodes if n.status == NodeStatus.JOINED]
    names = {n.name for n in joined}
    cutoff = now - timedelta(seconds=FRESH_INTERVALS * settings.RUNCRATE_HEALTH_SECONDS)
    fresh = [n for n in joined if n.health and n.health_at is not None and n.health_at >= cutoff]
    problems: list[Problem] = []
    for node in fresh:
        expected = set(expected_services(cluster, node))
        for service, running in sorted(node.health.get("services", {}).items()):
            if not running and service in expected:
                problems.append(
                    Problem(
                        f"service:{node.name}:{service}",
                        node.name,
                        f"{service} is not running on {node.name}",
                        f"{service} runs again on {node.name}",
                    )
                )
        if node.health.get("interface_up") is False:
            problems.append(
                Problem(
                    f"interface:{node.name}",
                    node.name,
                    f"{node.name}'s private network interface is down",
                    f"{node.name}'s private network interface is up again",
                )
            )
        shared = node.health.get("shared") or {}
        path = shared.get("path") or "/shared"
        if shared.get("mounted") is True and shared.get("answers") is False:
            why = f" ({shared['error']})" if shared.get("error") else ""
            problems.append(
                Problem(
                    f"shared:{node.name}",
                    node.name,
                    f"{path} does not answer on {node.name}{why}",
                    f"{path} answers again on {node.name}",
                )
            )
        elif shared.get("mounted") is False and (node.acceptance or {}).get("shared"):
            problems.append(
                Problem(
                    f"shared:{node.name}",
                    node.name,
                    f"{path} is no longer mounted on {node.name}",
                    f"{path} is mounted again on {node.name}",
                )
            )
    for node in joined:
        problems += gpu_problems(node, now=now)
    # The machines' own problems help name the one the private network lost: a machine whose
    # interface is down, whose /shared hangs or whose daemons stopped is the likelier end.
    suspects = {p.node for p in problems}
    network = _network_problem(fresh, names, {n.name: n.index for n in joined}, suspects)
    return [network, *problems] if network is not None else problems


def _network_problem(
    fresh: list[Node], names: set[str], index: dict[str, int], suspects: frozenset[str] | set[str]
) -> Problem | None:
    """The pairs of joined machines that cannot reach each other (either one said so), named by
    the machine most of them involve: a machine cut off from the others is in every failing
    pair, whichever end reported it. Among equals (the two machines of a pair), the one with a
    problem of its own in `suspects` (its private interface down, its /shared hung, a daemon
    stopped: two machines that cannot reach each other look the same from either end) comes
    first, then the one the others cannot
    reach (its own report may not be in yet), then the later node."""
    pairs: set[frozenset[str]] = set()
    named_by_others: dict[str, int] = dict.fromkeys(names, 0)
    for node in fresh:
        for peer, reached in node.health.get("peers", {}).items():
            if not reached and peer in names and peer != node.name:
                pairs.add(frozenset((node.name, peer)))
                named_by_others[peer] += 1
    if not pairs:
        return None
    parts, culprits = [], []
    while pairs:
        degree: dict[str, int] = {}
        for pair in pairs:
            for name in pair:
                degree[name] = degree.get(name, 0) + 1
        culprit = max(
            degree, key=lambda n: (degree[n], n in suspects, named_by_others[n], index[n])
        )
        others = sorted(
            (next(iter(p - {culprit})) for p in pairs if culprit in p), key=index.__getitem__
        )
        pairs = {p for p in pairs if culprit not in p}
        culprits.append(culprit)
        parts.append(f"{culprit} cannot reach {', '.join(others)} over the private network")
    return Problem(
        "network",
        culprits[0],
        "; ".join(parts),
        f"{' and '.join(culprits)} {'reaches' if len(culprits) == 1 else 'reach'} every other "
        "machine again over the private network",
    )


def judge_health(cluster: Cluster, nodes: list[Node], *, now: datetime) -> bool:
    """Compare what the reports show with what was announced, on the locked `cluster` and its
    `nodes` (all of them, read with the lock): events for what is new and what is gone, the
    cluster degraded or ready again. Returns whether anything was written."""

    if not policy.is_running(cluster.status):
        return False
    if _worker_joining(cluster, nodes):
        return False
    found = {p.key: p for p in find_problems(cluster, nodes, now=now)}
    # A ready cluster has nothing announced (it would be degraded): what a degraded one had is
    # announced again once it is ready (after a retried install, say).
    known = dict(cluster.health_problems or {}) if cluster.status == Status.DEGRADED else {}
    new = [p for key, p in found.items() if key not in known]
    gone = [known[key] for key in known if key not in found]
    stored = _stored(cluster, found, now=now)
    if stored == (cluster.health_problems or {}) and not new and not gone:
        return False
    by_name = {n.name: n for n in nodes}
    work = UnitOfWork(cluster=cluster, nodes=nodes, now=now)
    cluster.health_problems = stored
    work.cluster_dirty = True
    ours = cluster.status == Status.READY or cluster.failure_reason == Reason.NODE_UNHEALTHY
    if new:
        _announce(work, new, by_name)
    # A gone node (lost, a failed worker) heals nothing: its own event said what happened.
    healed = [p for p in gone if by_name.get(p["node"]) and by_name[p["node"]].status == "joined"]
    if healed:
        again = ""
        if not found and ours and cluster.status == Status.DEGRADED:
            work.set_status(Status.READY)
            cluster.clear_failure()
            again = " Every machine is healthy again: the cluster is ready."
        work.event(
            Reason.NODE_HEALTHY,
            _sentences(p["healed"] for p in healed) + again,
            node=by_name[healed[0]["node"]],
        )
    if ours and found and cluster.status == Status.DEGRADED:
        _record_failure(cluster, list(found.values()))
    _drain_as_found(work, found.values())
    work.flush()
    return True


def _drain_as_found(work: UnitOfWork, found) -> None:
    """Every worker an open problem names is out of its software's scheduling, and every
    drained one no problem names any more is back in; the head's scheduler is told
    (clusters/lifecycle/steps/drain.py)."""
    named: dict[str, list[str]] = {}
    for problem in found:
        named.setdefault(problem.node, []).append(problem.message)
    for node in work.nodes:
        if node.status != NodeStatus.JOINED or node.index == 0:
            continue
        if node.name in named:
            drain.mark_drained(work, node, "; ".join(named[node.name]))
        else:
            drain.mark_undrained(work, node)
    drain.drain(work)


def _announce(work: UnitOfWork, new: list[Problem], by_name: dict[str, Node]) -> None:
    """New problems: the cluster degraded, and one `node_unhealthy` event naming them (and the
    email, unless the `auto` repair policy will replace them: its one email tells then)."""
    cluster, now = work.cluster, work.now
    if cluster.status == Status.READY:
        work.set_status(Status.DEGRADED)
    worst = by_name[new[0].node]
    named = [by_name[p.node] for p in new]
    auto = repair.auto_replaces_unhealthy(cluster, work.nodes, named, now=now)
    then = (
        f"if it is still unhealthy in {repair.grace_words()}, it is replaced automatically "
        "(the cluster's repair policy), and you get one email saying so."
        if auto
        else "it is ready again by itself once every machine is healthy, or terminate it."
    )
    work.event(
        Reason.NODE_UNHEALTHY,
        f"{_sentences(p.message for p in new)} The cluster is degraded: its machines keep "
        f"running and billed; {then}",
        node=worst,
        step=worst.step,
    )
    if auto:
        # Told by the replacement's one email (or the refusal's), not by one of its own;
        # a problem that clears within the grace period was the product's to handle.
        work.events[-1].emailed_at = now


def _stored(cluster: Cluster, found: dict[str, Problem], *, now: datetime) -> dict:
    """The problems as `Cluster.health_problems` keeps them, each with when it was first seen
    (kept while it lasts: the `auto` repair policy replaces a machine whose problems outlast
    its grace period, clusters/lifecycle/repair.py)."""
    since = {key: (p.get("since") or "") for key, p in (cluster.health_problems or {}).items()}
    return {
        key: {
            "node": p.node,
            "message": p.message,
            "healed": p.healed,
            "since": since.get(key) or now.isoformat(),
        }
        for key, p in found.items()
    }


def _worker_joining(cluster: Cluster, nodes: list[Node]) -> bool:
    """Whether a worker (or a replacement) is joining, which its peers are still adding:
    health waits for it."""
    return any(joining(cluster, n) for n in nodes)


def _record_failure(cluster: Cluster, found: list[Problem]) -> None:
    """A cluster degraded by health says so in its failure fields: the first problem's node,
    and every problem's message."""
    cluster.failure_reason = Reason.NODE_UNHEALTHY
    cluster.failure_node = found[0].node
    cluster.failure_step = ""
    cluster.failure_message = _sentences(p.message for p in found)


# --- GPU health (issue 23) ------------------------------------------------------------------

# The throttle reasons that mean the GPU is slowed down by a fault or by heat (nvidia-smi's
# names, clusters/telemetry/metrics.py THROTTLE_REASONS), in words. A power cap, an idle GPU or an
# application clock is the GPU doing as told, and says nothing about its health.
GPU_SLOWDOWNS = {
    "hw_slowdown": "hardware slowdown",
    "hw_thermal_slowdown": "hardware thermal slowdown",
    "sw_thermal_slowdown": "software thermal slowdown",
    "hw_power_brake_slowdown": "hardware power brake slowdown",
}
# A slowdown counts once it lasted longer than this (a brief one is the GPU protecting itself).
SLOWDOWN_SECONDS = 60
# The conditions of a GPU's own, by what they are called in `Node.gpu_health`.
ECC = "ecc_uncorrected"
RETIRED = "retired_pages_pending"
REMAPPED = "remapped_rows_pending"
MISSING = "missing"


@dataclass(frozen=True)
class GpuCondition:
    """One thing a metrics report shows wrong: `what` (ECC, RETIRED, REMAPPED, a name of
    GPU_SLOWDOWNS, or MISSING) of GPU `gpu` (None for MISSING, which names no GPU: nvidia-smi
    numbers the GPUs it still sees from 0), and its figure (the uncorrectable errors, or the
    GPUs reported)."""

    gpu: int | None
    what: str
    count: int | None = None

    @property
    def key(self) -> str:
        """What stays the same while it lasts: "3:ecc_uncorrected", "missing"."""
        return self.what if self.gpu is None else f"{self.gpu}:{self.what}"


def gpu_conditions(gpus: Iterable[dict[str, Any]], *, accepted: int) -> list[GpuCondition]:
    """What one cleaned metrics report's GPUs (clusters/telemetry/metrics.py `clean_report`'s rows,
    with
    `throttle` as a list of names) show wrong, given the `accepted` GPUs the node's agent saw
    at acceptance (`Node.gpus`). A figure the driver could not read (None) shows nothing."""
    found, reported = [], 0
    for gpu in gpus:
        reported += 1
        index = gpu["index"]
        if gpu.get(ECC):
            found.append(GpuCondition(index, ECC, int(gpu[ECC])))
        for flag in (RETIRED, REMAPPED):
            if gpu.get(flag):
                found.append(GpuCondition(index, flag))
        active = gpu.get("throttle") or ()
        found += [GpuCondition(index, name) for name in GPU_SLOWDOWNS if name in active]
    if reported < accepted:
        found.append(GpuCondition(None, MISSING, reported))
    return found


def merged_gpu_health(
    known: dict[str, Any], conditions: list[GpuCondition], *, now: datetime
) -> dict[str, Any]:
    """`Node.gpu_health` after a report showing `conditions`: key -> {gpu, what, count, since},
    where `since` is when the condition was first seen on the server's clock (kept while it
    lasts: a report without it ends it)."""
    health = {}
    for condition in conditions:
        since = (known.get(condition.key) or {}).get("since") or now.isoformat()
        health[condition.key] = {
            "gpu": condition.gpu,
            "what": condition.what,
            "count": condition.count,
            "since": since,
        }
    return health


def gpu_problems(node: Node, *, now: datetime) -> list[Problem]:
    """The node's GPU conditions (`Node.gpu_health`) that count now, as problems: each at once,
    a slowdown once it lasted more than SLOWDOWN_SECONDS."""
    problems = []
    for key, condition in sorted((node.gpu_health or {}).items()):
        what, gpu, count = condition.get("what"), condition.get("gpu"), condition.get("count")
        lasted = now - datetime.fromisoformat(condition["since"])
        if what in GPU_SLOWDOWNS and lasted.total_seconds() <= SLOWDOWN_SECONDS:
            continue
        words = _gpu_words(node, what=what, gpu=gpu, count=count, lasted=lasted)
        if words is not None:
            problems.append(Problem(f"gpu:{node.name}:{key}", node.name, *words))
    return problems


def _gpu_words(
    node: Node, *, what: str | None, gpu: int | None, count: int | None, lasted: timedelta
) -> tuple[str, str] | None:
    """A GPU condition's message and what its node_healthy event says, or None for one this
    version does not know (a condition a later version kept)."""
    name = f"{node.name} GPU {gpu}"
    if what == ECC:
        return (
            f"{name}: {count} uncorrectable ECC error{'' if count == 1 else 's'}",
            f"{name} reports no uncorrectable ECC errors again",
        )
    if what == RETIRED:
        return (
            f"{name}: memory pages pending retirement (a GPU reset retires them)",
            f"{name} has no memory pages pending retirement again",
        )
    if what == REMAPPED:
        return (
            f"{name}: memory rows pending remapping (a GPU reset remaps them)",
            f"{name} has no memory rows pending remapping again",
        )
    if what in GPU_SLOWDOWNS:
        slowdown = GPU_SLOWDOWNS[what]
        return f"{name}: {slowdown} for {span(lasted)}", f"{name}: the {slowdown} ended"
    if what == MISSING:
        accepted = len(node.gpus or [])
        return (
            f"{node.name} reports {count} GPU{'' if count == 1 else 's'}, {accepted} at acceptance",
            f"{node.name} reports its {accepted} GPUs again",
        )
    return None


def gpu_problem_messages(cluster: Cluster) -> list[str]:
    """What the cluster's open GPU problems say (the page's banner), in the order announced:
    only a degraded cluster has open problems."""
    if cluster.status != Status.DEGRADED:
        return []
    return [
        problem["message"]
        for key, problem in (cluster.health_problems or {}).items()
        if key.startswith("gpu:")
    ]


def judge_gpu_report(
    *, node_id: int, cluster_id: int, token_hash: str, conditions: list[GpuCondition], now: datetime
) -> bool:
    """A metrics report of `node_id` showed `conditions` (or its node has some kept): keep them
    on the node and judge its cluster, on the locked cluster as the check-in does. The caller
    (clusters/telemetry/metrics.py `record`) comes here only then, so a healthy report of a healthy
    node
    costs nothing. The token is checked again on the locked read (a reimage may have replaced
    it since the report's unlocked one). Returns whether the cluster changed."""

    with transaction.atomic():
        cluster = lock_cluster(cluster_id)
        if cluster is None:
            return False
        nodes = read_nodes(cluster)
        node = next((n for n in nodes if n.pk == node_id), None)
        if node is None or node.agent_token_hash != token_hash or not watched(cluster, node):
            return False
        health = merged_gpu_health(node.gpu_health or {}, conditions, now=now)
        if health != node.gpu_health:
            node.gpu_health = health
            Node.objects.filter(pk=node.pk).update(gpu_health=health)
        return judge_health(cluster, nodes, now=now)


def _sentences(parts) -> str:
    """Each part a sentence; they begin with a node's name or a daemon's, kept as they are."""
    return " ".join(f"{part}." for part in parts)
