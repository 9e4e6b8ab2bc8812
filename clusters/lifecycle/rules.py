"""The lifecycle's limits and small rules: deadlines, tokens, the cluster lock, and the
judgements on what an agent reports (its GPUs, its reachability row)."""

from __future__ import annotations

import re
from datetime import datetime, timedelta

from django.conf import settings

from clusters import secrets
from clusters.lifecycle import rounds
from clusters.machines.base import INSTALL_SECONDS as INSTALL_SECONDS
from clusters.models import Cluster, DueCluster, Node, give_up_after
from offers.models import MachineType, driver_at_least, size_words

Status = Cluster.Status
NodeStatus = Node.Status

# What the network step adds to its deadline for each wave of the batch's measurements: the
# nodes measure in rounds of pairs that never share a link (`clusters.lifecycle.rounds`, at most
# three rounds whatever the size), each round in waves of as many pairs as the location's fabric
# carries at once (`Location.measurements_at_once`; the whole round where it gives none), and a
# wave is a node's next check-in (the agent's
# RETRY_SECONDS, 5 s, while starting), its latency (5 TCP connects) and bandwidth (iperf3's
# 2-second run, or the 1-second stream), its /shared mount and its report: about 10 s on a
# healthy host. Every step stays capped at the node's give-up time.
MEASURE_TURN_SECONDS = 30
# How often a pending readiness check runs again.
CHECK_EVERY = timedelta(seconds=5)
# A per-node task that failed is tried again after this long.
RETRY_AFTER = timedelta(seconds=10)
# Starting a machine (connecting to it, bootstrapping it) is tried this many times before the
# node fails with `machine_failed`.
START_ATTEMPTS = 3
# Wiping a host is tried this many times before the host goes offline for staff.
RELEASE_ATTEMPTS = 3
# How long each kind of per-node work holds its lease before the next tick may hand it out
# again. Well inside the shortest step deadline it serves (RUNCRATE_MIN_STEP_SECONDS, 30 s): a
# worker killed while it held the work costs one lease, not the step. Work that runs longer
# (an install, a wipe, a slow bootstrap) renews its lease every third of it while it runs
# (clusters/lifecycle/work.py), so a live worker never loses it.
LEASE_SECONDS = {
    "start": 15,
    "agent": 10,
    "network": 10,
    "install": 30,
    "check": 15,
    "stop": 30,
    "replan": 15,
    "prune": 30,
    "drain": 30,
}
# The longest one piece of work may run at all: the broker's visibility timeout is set from it
# (config/settings.py), so an unacknowledged message is handed back only after its work
# could no longer be running.
LONGEST_WORK_SECONDS = 2 * 60 * 60
# How long a queued advance keeps others from being queued for the same cluster.
ADVANCE_PENDING_SECONDS = 30


# --- small rules -------------------------------------------------------------------------------


def step_deadline(*, start: datetime, seconds: float, cap: datetime | None) -> datetime:
    """`start + seconds`, never less than RUNCRATE_MIN_STEP_SECONDS, never past `cap` (None: an
    install's own time, which the node's give-up time does not cap)."""
    seconds = max(seconds, settings.RUNCRATE_MIN_STEP_SECONDS)
    deadline = start + timedelta(seconds=seconds)
    return deadline if cap is None else min(deadline, cap)


def node_give_up_at(node: Node, machine_type: MachineType) -> datetime:
    """Nothing waits for a node past 25 minutes from its reservation (45 on slow-boot types);
    for the nodes created with the cluster that is the cluster's own `give_up_at`. Stored
    deadlines are capped here; judged, the cap moves back by our own downtime like any
    deadline (`deadline_with_downtime`)."""
    return node.reserved_at + give_up_after(machine_type.slow_boot)


def running_deadline(node: Node, machine_type: MachineType, *, start: datetime) -> datetime:
    """The `running` step's deadline: 2 × boot from `start`, when the machine's start was
    handed to its driver (until then, its reservation)."""
    return step_deadline(
        start=start,
        seconds=2 * machine_type.boot_seconds,
        cap=node_give_up_at(node, machine_type),
    )


Downtime = list[tuple[datetime, datetime]]


def extended(deadline: datetime, *, since: datetime, downtime: Downtime) -> datetime:
    """`deadline`, counted from `since`, moved back by every span of our own downtime (merged,
    in order: `runcrate.models.our_downtime`) that falls after `since` and before the deadline
    as moved so far: the step's time counts only while we ran. A span that begins after the
    deadline changes nothing; one that is going on moves it past now."""
    for start, end in downtime:
        start = max(start, since)
        if end <= start:
            continue
        if start >= deadline:
            break
        deadline += end - start
    return deadline


def deadline_with_downtime(
    deadline: datetime,
    *,
    since: datetime,
    cap: datetime | None,
    reserved_at: datetime,
    downtime: Downtime,
) -> datetime:
    """A stored step deadline (counted from `since`, capped at `cap`, the node's give-up time
    from its reservation) as it is judged: moved back by our downtime since the step began; a
    deadline that is the cap moves with the cap, by our downtime since the reservation, so the
    25/45 minutes count only the machines' time too."""
    if cap is not None and deadline >= cap:
        return extended(cap, since=reserved_at, downtime=downtime)
    return extended(deadline, since=since, downtime=downtime)


def agent_token(node: Node) -> str:
    """The node's agent credential, derived rather than stored: only its hash is kept. The
    lifecycle's name for `clusters.secrets.agent_token` (the one derivation, which honours
    SECRET_KEY_FALLBACKS)."""
    return secrets.agent_token(node)


def token_hash(token: str) -> str:
    return secrets.token_hash(token)


def needs_work(cluster: Cluster, nodes: list[Node]) -> bool:
    """Whether the reconciler still has something to do for the cluster: it is still moving
    (provisioning, installing, terminating), a worker is starting or installing, or a node that
    ended still holds its host (to wipe). Kept in `Cluster.needs_work`, which the tick reads."""
    if cluster.status in (Status.PROVISIONING, Status.INSTALLING, Status.TERMINATING):
        return True
    return any(joining(cluster, n) or (n.holds_host and n.status in Node.RELEASED) for n in nodes)


def joining(cluster: Cluster, node: Node) -> bool:
    """Whether `node` is a machine joining a running cluster: starting, or joined and installing
    its software, as a worker added to a ready cluster or a replacement (which joins a degraded
    one too). A degraded cluster's own nodes left at `install` by a failed install are not."""
    if node.status == NodeStatus.STARTING:
        return True
    return (
        node.status == NodeStatus.JOINED
        and node.step == Node.Step.INSTALL
        and (cluster.status == Status.READY or node.replaces_id is not None)
    )


def set_needs_work(cluster: Cluster, due: bool) -> bool:
    """Set the locked cluster's `needs_work` (saved with the cluster by the caller) and write
    its DueCluster row to match, in the caller's transaction; returns whether it changed."""
    if cluster.needs_work == due:
        return False
    cluster.needs_work = due
    if due:
        DueCluster.objects.bulk_create([DueCluster(cluster_id=cluster.pk)], ignore_conflicts=True)
    else:
        DueCluster.objects.filter(cluster_id=cluster.pk).delete()
    return True


def lock_cluster(cluster_id: int) -> Cluster | None:
    return (
        Cluster.objects.select_for_update(of=("self",))
        .select_related("machine_type__gpu", "machine_type__location")
        .filter(pk=cluster_id)
        .first()
    )


# --- checks on what the agent reports ---------------------------------------------------


def gpu_line(gpu: dict) -> str:
    return ", ".join(str(gpu.get(k, "")) for k in ("name", "memory_total_mib", "uuid"))


def _words(name: str) -> set[str]:
    return {w for w in re.split(r"[^a-z0-9]+", name.lower()) if w}


def model_tokens(name: str) -> set[str]:
    """The words of a GPU's name that say which model it is: those with a digit that are not a
    memory size ("H100 SXM 80GB" -> {"h100"}; nvidia-smi's "NVIDIA H100 80GB HBM3" -> {"h100",
    "hbm3"}; "NVIDIA A100-SXM4-80GB" -> {"a100", "sxm4"}). A GPU passes the hardware check when
    every model word of the GPU model it is sold as appears in the name nvidia-smi reports."""
    return {w for w in _words(name) if re.search(r"\d", w) and not re.fullmatch(r"\d+gb", w)}


def hardware_problem(node: Node, machine_type: MachineType) -> str | None:
    """Why the GPUs the agent saw are not what the machine type sells, or None."""
    gpus = node.gpus or []
    expected = machine_type.gpus_per_machine
    model = machine_type.gpu
    if len(gpus) != expected:
        return f"{node.name} reports {len(gpus)} GPUs; {machine_type.slug} has {expected}."
    wanted = model_tokens(model.name)
    for gpu in gpus:
        seen = str(gpu.get("name", ""))
        if not wanted <= model_tokens(seen):
            return (
                f"{node.name} reports {seen or 'a GPU without a name'}; {machine_type.slug} "
                f"sells {model.name}."
            )
        memory_gib = float(gpu.get("memory_total_mib", 0)) / 1024
        if abs(memory_gib - model.memory_gib) > 0.1 * model.memory_gib:
            return (
                f"{node.name} reports {gpu.get('name')} with {memory_gib:.0f} GiB; "
                f"{machine_type.slug} sells {model.name} ({model.memory_gib} GiB)."
            )
    return driver_problem(node, machine_type)


def driver_problem(node: Node, machine_type: MachineType) -> str | None:
    """Why the NVIDIA driver nvidia-smi reports is older than the one the machine type sells
    (`driver_version`), or None; a type that states none is not checked."""
    sold = machine_type.driver_version
    if not sold:
        return None
    for gpu in node.gpus or []:
        reported = str(gpu.get("driver_version") or "")
        if not driver_at_least(reported, sold):
            return (
                f"{node.name} reports NVIDIA driver {reported or 'unknown'}; "
                f"{machine_type.slug} sells driver {sold} or newer."
            )
    return None


# A node's memory may read this much below what its machine type sells and still pass: the
# kernel and the firmware keep some of the RAM installed out of MemTotal (docs/lifecycle.md,
# "Acceptance before billing").
MEMORY_SHORTFALL_TOLERATED = 0.05


def machine_problem(node: Node, machine_type: MachineType) -> str | None:
    """Why the vCPUs or the memory the node's agent reported (inside `network`, with its
    measurement) fall short of what the machine type sells, or None. More than sold passes; a
    figure the type does not state is not checked."""
    measured = node.acceptance or {}
    vcpus, memory_mib = measured.get("vcpus"), measured.get("memory_mib")
    if machine_type.vcpus is not None:
        if vcpus is None:
            return (
                f"{node.name}'s agent reported no vCPU count; {machine_type.slug} sells "
                f"{machine_type.vcpus}."
            )
        if vcpus < machine_type.vcpus:
            return f"{node.name} has {vcpus} vCPUs; {machine_type.slug} sells {machine_type.vcpus}."
    if machine_type.memory_gib is not None:
        sold = size_words(machine_type.memory_gib)
        if memory_mib is None:
            return f"{node.name}'s agent reported no memory size; {machine_type.slug} sells {sold}."
        if memory_mib < minimum_memory_mib(machine_type.memory_gib):
            return (
                f"{node.name} has {memory_mib / 1024:,.0f} GiB of memory; "
                f"{machine_type.slug} sells {sold} (at least "
                f"{minimum_memory_mib(machine_type.memory_gib) / 1024:,.0f} GiB must show)."
            )
    return None


def minimum_memory_mib(memory_gib: int) -> float:
    """The least memory (MiB, as MemTotal reads) a node sold with `memory_gib` GiB passes with."""
    return memory_gib * 1024 * (1 - MEMORY_SHORTFALL_TOLERATED)


def reachability_matrix(nodes: list[Node]) -> str:
    """The N×N matrix of what each node's agent reached: ok, FAIL, or ? (not reported)."""
    names = [n.name for n in nodes if n.status != NodeStatus.ENDED or n.reachability]
    rows = {n.name: (n.reachability or {}) for n in nodes}
    corner = "from \\ to"
    width = max(len(corner), *(len(name) for name in names)) + 2
    lines = [corner.ljust(width) + "".join(name.ljust(width) for name in names)]
    for source in names:
        cells = []
        for target in names:
            if source == target:
                cells.append("-")
            elif target not in rows[source]:
                cells.append("?")
            else:
                cells.append("ok" if rows[source][target] else "FAIL")
        lines.append(source.ljust(width) + "".join(c.ljust(width) for c in cells))
    return "\n".join(line.rstrip() for line in lines)


def acceptance_minimum_mbit(machine_type: MachineType) -> float:
    """The least a worker must move to node-0: RUNCRATE_ACCEPTANCE_LINK_FRACTION of the machine
    type's expected link, never below RUNCRATE_ACCEPTANCE_MIN_MBIT."""
    share = settings.RUNCRATE_ACCEPTANCE_LINK_FRACTION * machine_type.expected_link_mbit
    return max(share, settings.RUNCRATE_ACCEPTANCE_MIN_MBIT)


def acceptance_problem(
    node: Node, machine_type: MachineType, batch: list[Node] | None = None
) -> str | None:
    """Why what the node's agent measured fails acceptance, or None. The batch measures in
    rounds (`clusters.lifecycle.rounds`): each node's own figure is its stream to one peer, no
    other measurement sharing either link. A slow figure names the node alone, with its peer
    and the peer's own figure, unless `rounds.slow_verdict` finds the peer the slow one (judged
    against the `batch` where given; without it the node's own figure stands). node-0 alone
    measures nothing. Where the cluster has a shared folder (virtual machines and bare metal),
    every other node must have mounted node-0's /shared. Every node, node-0 included, must
    first have the vCPUs and memory sold (`machine_problem`)."""
    problem = machine_problem(node, machine_type)
    if problem:
        return problem
    measured = node.acceptance or {}
    needs_shared = machine_type.machine_kind != MachineType.Kind.CONTAINER
    if node.index and needs_shared and not measured.get("shared"):
        why = measured.get("shared_error") or "its agent reported no mount"
        return f"{node.name} could not mount /shared from node-0 ({why})."
    if node.index == 0 and not measured.get("peer"):
        return None  # node-0 alone, or an agent from before the rounds: nothing measured
    peer = measured.get("peer") or "node-0"
    bandwidth = measured.get("bandwidth_mbit")
    if bandwidth is None:
        why = measured.get("error") or "its agent reported no measurement"
        return f"{node.name} could not measure its bandwidth to {peer} ({why})."
    minimum = acceptance_minimum_mbit(machine_type)
    if bandwidth >= minimum or _slow_verdict(node, batch, minimum) is False:
        return None
    return (
        f"{node.name} moves {bandwidth:,.0f} Mbit/s to {peer} over the private network, "
        f"measured alone{_peer_note(measured, batch)}; acceptance needs at least "
        f"{minimum:,.0f} Mbit/s ({machine_type.slug} machines have a "
        f"{machine_type.expected_link_mbit:,} Mbit/s link)."
    )


def acceptance_pending(node: Node, machine_type: MachineType, batch: list[Node]) -> bool:
    """Whether the node's slow figure waits for a figure of another round before anyone is
    named (`rounds.slow_verdict` answers None)."""
    bandwidth = (node.acceptance or {}).get("bandwidth_mbit")
    minimum = acceptance_minimum_mbit(machine_type)
    if bandwidth is None or bandwidth >= minimum:
        return False
    return _slow_verdict(node, batch, minimum) is None


def _slow_verdict(node: Node, batch: list[Node] | None, minimum: float) -> bool | None:
    if batch is None:
        return True
    figures = {
        n.index: (n.acceptance or {}).get("bandwidth_mbit")
        for n in batch
        if n.network_reported_at is not None
    }
    placed = rounds.placements([n.index for n in batch])
    return rounds.slow_verdict(node.index, figures, placed, minimum)


def _peer_note(measured: dict, batch: list[Node] | None) -> str:
    """In which round, and the peer's own figure: what tells the node's link from its peer's."""
    peer_name, number = measured.get("peer"), measured.get("round")
    if not peer_name or number is None:
        return ""
    note = f" in round {number}"
    peer = next((n for n in batch or [] if n.name == peer_name), None)
    if peer is None or peer.network_reported_at is None:
        return note
    figure = (peer.acceptance or {}).get("bandwidth_mbit")
    if figure is None:
        return f"{note}; {peer_name} measured no figure of its own"
    return f"{note}; {peer_name}'s own figure is {figure:,.0f} Mbit/s"


def measured_note(node: Node) -> str:
    measured = node.acceptance or {}
    if measured.get("bandwidth_mbit") is None:
        return ""
    peer = measured.get("peer") or "node-0"
    latency = measured.get("latency_ms")
    where = f" to {peer}" + (f" in round {measured['round']}" if measured.get("round") else "")
    return f"; {measured['bandwidth_mbit']:,.0f} Mbit/s" + (
        f" and {latency:.2f} ms{where}" if latency is not None else where
    )


def acceptance_report(nodes: list[Node], machine_type: MachineType, *, at: datetime) -> dict:
    """The cluster's acceptance report, kept before billing starts: what the machine type sells,
    and per node the GPUs its agent saw (with their driver), its vCPUs and memory, its
    reachability row, and latency and bandwidth to node-0."""
    return {
        "measured_at": at.isoformat(),
        "expected": {
            "gpu": machine_type.gpu.name,
            "gpus_per_machine": machine_type.gpus_per_machine,
            "memory_gib": machine_type.gpu.memory_gib,
            "link_mbit": machine_type.expected_link_mbit,
            "min_bandwidth_mbit": acceptance_minimum_mbit(machine_type),
            # Each machine's vCPUs, memory, driver (…) as sold: what every node is held to.
            "specs": machine_type.specs.as_dict(),
        },
        "nodes": [
            {
                "name": n.name,
                "gpus": [
                    {
                        "name": g.get("name", ""),
                        "memory_total_mib": g.get("memory_total_mib"),
                        "driver_version": g.get("driver_version") or None,
                    }
                    for g in n.gpus or []
                ],
                "vcpus": (n.acceptance or {}).get("vcpus"),
                "memory_mib": (n.acceptance or {}).get("memory_mib"),
                "reachability": dict(sorted((n.reachability or {}).items())),
                "latency_ms": (n.acceptance or {}).get("latency_ms"),
                "bandwidth_mbit": (n.acceptance or {}).get("bandwidth_mbit"),
                "method": (n.acceptance or {}).get("method"),
                # Which round measured it, against which peer (`clusters.lifecycle.rounds`).
                "round": (n.acceptance or {}).get("round"),
                "peer": (n.acceptance or {}).get("peer"),
                "shared": (n.acceptance or {}).get("shared"),
            }
            for n in sorted(nodes, key=lambda n: n.index)
        ],
    }


def with_node_names(text: str, nodes) -> str:
    """`text` as the cluster's owner reads it (events, the page, emails): the machines named by
    their node (node-0, node-1 …), never by the inventory's host names, which are the
    operator's and stay in the logs and in admin. `nodes` have their host loaded."""
    for node in nodes:
        if node.host_id is not None and node.host.name:
            pattern = rf"(?<![A-Za-z0-9_.-]){re.escape(node.host.name)}(?![A-Za-z0-9_-])"
            text = re.sub(pattern, node.name, text)
    return text
