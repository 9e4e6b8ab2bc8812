"""What the software's commands print on the simulated data center, in the real formats.

The simulated driver feeds these to the same parsers (`clusters.machines.software.checks`) that
read a
real cluster, so every simulated install exercises them. A node whose software is still
settling prints what a real one does at that moment: Slurm `idle*` (slurmd not responding
yet), Kubernetes `Ready: False` with the `not-ready` taint, Ray absent from the alive list.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass


@dataclass(frozen=True)
class SimNode:
    name: str
    private_ip: str
    gpus: int
    gpu_slug: str
    ready: bool
    is_head: bool = False


def _node_id(name: str, ip: str) -> str:
    return hashlib.sha256(f"{name}/{ip}".encode()).hexdigest()[:56]


def sinfo(nodes: list[SimNode]) -> str:
    gres_type = lambda n: n.gpu_slug.split("-")[0]  # noqa: E731
    lines = [
        f"{n.name}|{'idle' if n.ready else 'idle*'}|gpu:{gres_type(n)}:{n.gpus}(S:0-1)"
        for n in nodes
    ]
    return "\n".join(lines) + "\n"


def kubectl_get_nodes(nodes: list[SimNode]) -> str:
    items = []
    for n in nodes:
        taints = (
            [] if n.ready else [{"key": "node.kubernetes.io/not-ready", "effect": "NoSchedule"}]
        )
        items.append(
            {
                "apiVersion": "v1",
                "kind": "Node",
                "metadata": {
                    "name": n.name,
                    "labels": {
                        "kubernetes.io/hostname": n.name,
                        "nvidia.com/gpu.product": n.gpu_slug,
                        **({"node-role.kubernetes.io/control-plane": ""} if n.is_head else {}),
                    },
                },
                "spec": {"taints": taints} if taints else {},
                "status": {
                    "addresses": [
                        {"type": "InternalIP", "address": n.private_ip},
                        {"type": "Hostname", "address": n.name},
                    ],
                    "allocatable": {
                        "cpu": "96",
                        "memory": "1056757896Ki",
                        "nvidia.com/gpu": str(n.gpus) if n.ready else "0",
                        "pods": "110",
                    },
                    "conditions": [
                        {"type": "MemoryPressure", "status": "False"},
                        {"type": "DiskPressure", "status": "False"},
                        {"type": "PIDPressure", "status": "False"},
                        {
                            "type": "Ready",
                            "status": "True" if n.ready else "False",
                            "reason": "KubeletReady" if n.ready else "KubeletNotReady",
                        },
                    ],
                },
            }
        )
    return json.dumps({"apiVersion": "v1", "kind": "List", "items": items}, indent=2)


def ray_list_nodes(nodes: list[SimNode]) -> str:
    alive = [
        {
            "node_id": _node_id(n.name, n.private_ip),
            "node_ip": n.private_ip,
            "is_head_node": n.is_head,
            "state": "ALIVE",
            "state_message": None,
            "node_name": n.private_ip,
            "resources_total": {
                "CPU": 96.0,
                "GPU": float(n.gpus),
                "memory": 858993459200.0,
                f"node:{n.private_ip}": 1.0,
                **({"node:__internal_head__": 1.0} if n.is_head else {}),
            },
            "labels": {"ray.io/node_id": _node_id(n.name, n.private_ip)},
        }
        for n in nodes
        if n.ready
    ]
    return json.dumps(alive, indent=2)


OUTPUTS = {"slurm": sinfo, "kubernetes": kubectl_get_nodes, "ray": ray_list_nodes}


def install_log(*, software: str, node: str, ok: bool) -> str:
    steps = {
        "slurm": ["installing munge, slurmd", "writing /etc/slurm/slurm.conf", "starting slurmd"],
        "kubernetes": ["installing containerd, kubelet", "kubeadm join", "nvidia device plugin"],
        "ray": ["installing ray[default]", "ray start", "registering GPUs"],
    }[software]
    lines = [f"[{node}] {step} ... ok" for step in steps[:-1]]
    if ok:
        lines.append(f"[{node}] {steps[-1]} ... ok")
    else:
        lines.append(f"[{node}] {steps[-1]} ... FAILED")
        lines.append(f"[{node}] error: {software} service exited with status 1")
    return "\n".join(lines) + "\n"


# The simulated Ethernet between machines: a bus bandwidth plateau of 0.2 GB/s (1.6 Gbit/s,
# what the simulated agents measure at join), reached once messages dwarf the latency.
SIM_LINK_GBS = 0.2


def all_reduce_perf(*, nodes: list[str], gpus: int, gpu_name: str) -> str:
    """What nccl-tests' all_reduce_perf prints for one rank per machine (`-g gpus`, 8 B to
    128 MiB, doubling) across `nodes` on the simulated Ethernet: deterministic figures."""
    ranks = len(nodes) * gpus
    factor = 2 * (ranks - 1) / ranks
    latency_us = 60 + 20 * len(nodes)
    lines = [
        "# nccl-tests version 2.13.9 nccl-headers=21903 nccl-library=21903",
        "# Collective test starting: all_reduce_perf",
        f"# nThread 1 nGpus {gpus} minBytes 8 maxBytes 134217728 step: 2(factor) warmup iters: 5 "
        "iters: 20 agg iters: 1 validation: 1 graph: 0",
        "#",
        "# Using devices",
    ]
    for n, node in enumerate(nodes):
        for device in range(gpus):
            rank = n * gpus + device
            lines.append(
                f"#  Rank {rank:2d} Group  0 Pid {41000 + n * 100:6d} on {node:>10} device "
                f"{device:2d} [0x{0x18 + 16 * device:02x}] {gpu_name}"
            )
    lines += [
        "#",
        "#                                                              out-of-place          "
        "             in-place          ",
        "#       size         count      type   redop    root     time   algbw   busbw #wrong  "
        "   time   algbw   busbw #wrong",
        "#        (B)    (elements)                               (us)  (GB/s)  (GB/s)         "
        "   (us)  (GB/s)  (GB/s)       ",
    ]
    busbws = []
    size = 8
    while size <= 128 * 1024 * 1024:
        columns = f"{size:12d}  {size // 4:12d}  {'float':>8}  {'sum':>6}  {-1:6d}"
        for extra in (0.0, 0.02):  # in place is a hair faster
            time_us = (latency_us + size * factor / (SIM_LINK_GBS * 1e3)) * (1 - extra)
            algbw = size / time_us / 1e3
            busbw = algbw * factor
            busbws.append(busbw)
            columns += f"  {_nccl_time(time_us):>7}  {algbw:6.2f}  {busbw:6.2f}  {0:5d}"
        lines.append(columns)
        size *= 2
    lines += [
        "# Out of bounds values : 0 OK",
        f"# Avg bus bandwidth    : {sum(busbws) / len(busbws):g} ",
        "#",
        "# Collective test concluded: all_reduce_perf",
        "#",
    ]
    return "\n".join(lines) + "\n"


def _nccl_time(us: float) -> str:
    """nccl-tests' time column: fewer decimals as the number grows."""
    if us >= 10_000:
        return f"{us:.0f}"
    return f"{us:.1f}" if us >= 100 else f"{us:.2f}"
