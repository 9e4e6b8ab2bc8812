"""The simulated data center's metrics (issue 23, docs/metrics.md): what its machines' agents
would report, through the agent's own path, so the demo's Metrics tab, `runcrate clusters top`
and the MCP server read figures as they would from real machines.

A simulated machine has no agent to run nvidia-smi: every RUNCRATE_METRICS_SECONDS the beat
(`clusters.tasks.simulate_metrics`) calls `report`, which writes for each live node of a ready
or degraded cluster on the simulated driver the report its agent would send
(`metrics.clean_report`, then `metrics.store`). The figures agree with everything else the demo
shows (issue 37, docs/clusters.md "Demo machines"): no one can log in to a simulated machine,
its Slurm queue, Ray jobs and pods are empty, so nothing runs on its GPUs and they read idle, as
nvidia-smi reads an idle GPU: 0% utilisation, a few MiB of memory held by the driver, the idle
clock, power near the board's floor and a temperature that drifts a degree or two with the
clock. The idle notice (clusters/telemetry/idle.py) says so after its 30 minutes, as it would
for a real idle cluster. The figures are a function of the node and the clock alone, so a test
that moves the clock knows them.

A host with the `gpu` fault (the demo's: docs/lifecycle.md, "Repair") fails as a GPU does: once
its cluster has run GPU_FAILS_AFTER_SECONDS, GPU 0 of its machine reports uncorrectable ECC
errors, judged as any agent's report is (the node unhealthy, drained, and replaced where the
cluster's repair policy says so); its replacement, on a sound host, is healthy.

Real (ssh) machines are left to their agents. This is not a driver (clusters/machines/ must not
import clusters.telemetry.metrics' dependencies); it only reads which hosts are simulated.
"""

from __future__ import annotations

import math
from datetime import datetime
from typing import Any

from django.utils import timezone

from clusters.models import Cluster, Node
from clusters.telemetry import metrics
from clusters.telemetry.agent_service import ReportingNode
from offers.models import Host

# An idle GPU as nvidia-smi reads it: what the driver holds of its memory, and its power
# (a share of the board's limit) and temperature at rest.
IDLE_MEMORY_MIB = 4
IDLE_POWER_SHARE = 0.1
IDLE_TEMPERATURE_C = 31.0
DRIFT_SECONDS = 600  # the period of an idle GPU's temperature drift
# Each GPU model's board power limit (W), as nvidia-smi's power.limit reads on its usual board.
POWER_LIMIT_W = {
    "h100-sxm": 700.0,
    "h200": 700.0,
    "b200": 1000.0,
    "a100-sxm": 400.0,
    "l40s": 350.0,
    "rtx-6000-ada": 300.0,
    "rtx-4090": 450.0,
}
DEFAULT_POWER_LIMIT_W = 400.0
IDLE_SM_CLOCK_MHZ = 345
# The host's own figures, at rest: the agent's reports and the private network's keepalives
# move a few KB a second; /shared holds next to nothing on a fresh cluster.
NETWORK_BYTES_PER_SECOND = 2_000
HOST_MEMORY_MIB = 2_064_384  # 2 TiB
HOST_MEMORY_USED_SHARE = 0.02
IDLE_CPU_PERCENT = 1.0
DISK_GIB = 900.0
# A host with the `gpu` fault: its GPU 0 fails this long after its cluster joined.
GPU_FAILS_AFTER_SECONDS = 10 * 60
FAILED_GPU_ECC_ERRORS = 2


def utilization(node_id: int, gpu_index: int, moment: datetime) -> float:
    """A simulated GPU's utilisation (%) at `moment`: 0, since nothing runs on it (no one can
    log in to a simulated machine, and its scheduler's queue is empty)."""
    return 0.0


def temperature(node_id: int, gpu_index: int, moment: datetime) -> float:
    """An idle GPU's temperature (°C): IDLE_TEMPERATURE_C drifting by up to 1.5 degrees, each GPU
    a little shifted, and a degree apart by its slot."""
    angle = 2 * math.pi * (moment.timestamp() / DRIFT_SECONDS + gpu_index / 8 + node_id / 3)
    return round(IDLE_TEMPERATURE_C + gpu_index % 3 + 1.5 * math.sin(angle), 1)


def gpu_report(
    node_id: int,
    gpu_index: int,
    moment: datetime,
    *,
    memory_total_mib: int,
    power_limit_w: float,
    ecc_uncorrected: int = 0,
) -> dict[str, Any]:
    """One GPU's figures, as the agent sends them (docs/metrics.md): an idle GPU's."""
    return {
        "index": gpu_index,
        "utilization_percent": utilization(node_id, gpu_index, moment),
        "memory_used_mib": IDLE_MEMORY_MIB,
        "memory_total_mib": memory_total_mib,
        "temperature_c": temperature(node_id, gpu_index, moment),
        "power_w": round(power_limit_w * IDLE_POWER_SHARE, 1),
        "power_limit_w": power_limit_w,
        "sm_clock_mhz": IDLE_SM_CLOCK_MHZ,
        "throttle": ["gpu_idle"],
        "ecc_corrected": 0,
        "ecc_uncorrected": ecc_uncorrected,
        "retired_pages_pending": False,
        "remapped_rows_pending": False,
    }


def node_report(node: Node, moment: datetime) -> dict[str, Any]:
    """What `node`'s agent would send at `moment`: its GPUs (as many as its check-in counted,
    of the memory it reported) and its own figures."""
    machine_type = node.cluster.machine_type
    seen = node.gpus or [{} for _ in range(machine_type.gpus_per_machine)]
    fallback_mib = machine_type.gpu.memory_gib * 1024
    limit = POWER_LIMIT_W.get(machine_type.gpu.slug, DEFAULT_POWER_LIMIT_W)
    since = node.cluster.joined_at or node.cluster.created_at
    failed = gpu_failed(node, moment, since=since)
    gpus = [
        gpu_report(
            node.pk,
            index,
            moment,
            memory_total_mib=int(gpu.get("memory_total_mib") or fallback_mib),
            power_limit_w=limit,
            ecc_uncorrected=FAILED_GPU_ECC_ERRORS if failed and index == 0 else 0,
        )
        for index, gpu in enumerate(seen)
    ]
    moved = max(int((moment - since).total_seconds()), 0) * NETWORK_BYTES_PER_SECOND
    return {
        "gpus": gpus,
        "node": {
            "cpu_percent": IDLE_CPU_PERCENT,
            "memory_used_mib": int(HOST_MEMORY_MIB * HOST_MEMORY_USED_SHARE),
            "memory_total_mib": HOST_MEMORY_MIB,
            "disk_root_used_gib": 41.5,
            "disk_root_total_gib": DISK_GIB,
            "disk_shared_used_gib": 0.1,
            "disk_shared_total_gib": DISK_GIB,
            "network_rx_bytes": moved,
            "network_tx_bytes": moved * 9 // 10,
        },
    }


def gpu_failed(node: Node, moment: datetime, *, since: datetime) -> bool:
    """Whether `node`'s host has the `gpu` fault and its GPU 0 has failed by `moment`."""
    elapsed = (moment - since).total_seconds()
    return (
        node.host is not None
        and node.host.fault == Host.Fault.GPU
        and (elapsed >= GPU_FAILS_AFTER_SECONDS)
    )


def _sender(node: Node) -> ReportingNode:
    """The node as the GPU health judgement reads a report's sender (what the agent's own
    report path reads in one query: here, from the rows already loaded)."""
    cluster = node.cluster
    return ReportingNode(
        node_id=node.pk,
        cluster_id=cluster.pk,
        node_status=node.status,
        cluster_status=cluster.status,
        token_hash=node.agent_token_hash,
        accepted_gpus=len(node.gpus or []),
        gpu_health=node.gpu_health or {},
        gpu_problems_open=any(
            key.startswith(f"gpu:{node.name}:") for key in (cluster.health_problems or {})
        ),
        machine_gpus=cluster.machine_type.gpus_per_machine,
    )


def reporting_nodes() -> list[Node]:
    """The simulated machines whose agent would report now: live nodes of a ready or degraded
    cluster (`metrics.recording`, the agent's own rule) on the simulated driver. One query."""
    nodes = (
        Node.objects.filter(
            status__in=Node.LIVE,
            host__driver=Host.Driver.SIMULATED,
            cluster__status__in=Cluster.BILLED,
        )
        .select_related("host", "cluster__machine_type__gpu")
        .order_by("cluster_id", "index", "pk")
    )
    return [
        node
        for node in nodes
        if metrics.recording(cluster_status=node.cluster.status, node_status=node.status)
    ]


def report(*, now: datetime | None = None) -> int:
    """Write the report of every simulated machine that would report now (`reporting_nodes`),
    checked as the agent's is and stored all together through `metrics.store_many`; returns the
    nodes reported. One query to find them and `store_many`'s two, whatever their number (the
    health judgement adds queries only for a node with something to say)."""
    now = now or timezone.now()
    nodes = reporting_nodes()
    cleaned = [(node, *metrics.clean_report(node_report(node, now))) for node in nodes]
    metrics.store_many(
        [metrics.Report(node.pk, node.cluster_id, gpus, host) for node, gpus, host in cleaned],
        at=now,
    )
    for node, gpus, _ in cleaned:
        # Judged as an agent's report is: a healthy report of a healthy node costs nothing.
        metrics.judge_gpu_health(_sender(node), gpus, at=now)
    return len(nodes)
