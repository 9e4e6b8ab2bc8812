"""What the software's commands print on the simulated data center, in the real formats.

The simulated driver feeds these to the same parsers (`clusters.software.checks`) that read a
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
