"""How to connect to a cluster and run on it (SPEC §6): SSH, the hostfile, launch commands,
the environment every node gets, per-software examples and the kubeconfig.

Everything here is a pure function of a `ClusterShape`, so the page, the API, the ready email
and the node plan that drivers apply all print exactly the same text. `shape_for(cluster)` reads
the one cluster's rows into a shape.
"""

import hashlib
import hmac
import json
from dataclasses import dataclass

from django.conf import settings

SSH_USER = "root"
MASTER_PORT = 29500
RAY_CLIENT_PORT = 10001
RAY_DASHBOARD_PORT = 8265
KUBE_API_PORT = 6443
SLURM_PARTITION = "gpu"
SHARED_DIR = "/shared"
LOCAL_HOSTFILE = "/etc/runcrate/hostfile"
NCCL_TESTS = "/opt/nccl-tests/build/all_reduce_perf"
ETHERNET_GBITS = "1-2 Gbit/s"


@dataclass(frozen=True)
class NodeAccess:
    index: int
    address: str | None  # its own public address; None when reached through the gateway

    @property
    def name(self) -> str:
        return f"node-{self.index}"

    @property
    def private_ip(self) -> str:
        return f"10.77.0.{self.index + 1}"


@dataclass(frozen=True)
class ClusterShape:
    cluster_id: int
    name: str
    nodes: tuple[NodeAccess, ...]
    gpus_per_node: int
    machine_kind: str  # vm, bare_metal, container
    software: str  # none, slurm, kubernetes, ray
    gateway: str | None  # "host:port" of the location's SSH gateway, or None

    @property
    def size(self) -> int:
        return len(self.nodes)

    @property
    def world_size(self) -> int:
        return self.size * self.gpus_per_node

    @property
    def head(self) -> NodeAccess:
        return self.nodes[0]

    @property
    def has_shared_folder(self) -> bool:
        return self.machine_kind != "container"

    @property
    def hostfile_path(self) -> str:
        return f"{SHARED_DIR}/hostfile" if self.has_shared_folder else LOCAL_HOSTFILE

    @property
    def jump(self) -> str | None:
        """The ProxyJump spec: the gateway knows the cluster by the jump user."""
        return f"c{self.cluster_id}@{self.gateway}" if self.gateway else None


def shape_for(cluster) -> ClusterShape:
    machine_type = cluster.machine_type
    nodes = [n for n in cluster.nodes.all() if n.status in ("starting", "joined")]
    gateway = machine_type.location.ssh_gateway or None
    return ClusterShape(
        cluster_id=cluster.pk,
        name=cluster.name,
        nodes=tuple(
            NodeAccess(index=n.index, address=None if gateway else (n.host.address or None))
            for n in nodes
        ),
        gpus_per_node=machine_type.gpus_per_machine,
        machine_kind=machine_type.machine_kind,
        software=cluster.software,
        gateway=gateway,
    )


# --- SSH ----------------------------------------------------------------------------------


def ssh_command(shape: ClusterShape, node: NodeAccess) -> str:
    if node.address:
        return f"ssh {SSH_USER}@{node.address}"
    return f"ssh -J {shape.jump} {SSH_USER}@{node.name}"


def ssh_config(shape: ClusterShape) -> str:
    """A config with a Host entry per node, so `ssh node-0` works from the user's computer."""
    lines = [f"# Runcrate cluster {shape.name}: save as ~/.ssh/config.d/{shape.name} or append"]
    for node in shape.nodes:
        lines += ["", f"Host {node.name}", f"    HostName {node.address or node.name}"]
        lines.append(f"    User {SSH_USER}")
        if not node.address:
            lines.append(f"    ProxyJump {shape.jump}")
    return "\n".join(lines) + "\n"


def hostfile(shape: ClusterShape) -> str:
    return "".join(f"{node.name} slots={shape.gpus_per_node}\n" for node in shape.nodes)


# --- the environment and the launch commands ------------------------------------------------


def node_environment(shape: ClusterShape, node: NodeAccess) -> dict[str, str]:
    return {
        "MASTER_ADDR": shape.head.name,
        "MASTER_PORT": str(MASTER_PORT),
        "NODE_RANK": str(node.index),
        "NNODES": str(shape.size),
        "GPUS_PER_NODE": str(shape.gpus_per_node),
        "WORLD_SIZE": str(shape.world_size),
    }


def launch_commands(shape: ClusterShape) -> dict[str, str]:
    n, g, hostfile_path = shape.size, shape.gpus_per_node, shape.hostfile_path
    return {
        "torchrun": (
            f"torchrun --nnodes={n} --nproc-per-node={g} --rdzv-backend=c10d "
            f"--rdzv-endpoint={shape.head.name}:{MASTER_PORT} --rdzv-id={shape.name} train.py"
        ),
        "mpirun": (
            f"mpirun -np {shape.world_size} --hostfile {hostfile_path} --map-by ppr:{g}:node "
            f"-x MASTER_ADDR={shape.head.name} -x MASTER_PORT={MASTER_PORT} python train.py"
        ),
        "deepspeed": (
            f"deepspeed --hostfile {hostfile_path} --num_nodes {n} --num_gpus {g} "
            f"--master_addr {shape.head.name} --master_port {MASTER_PORT} train.py"
        ),
        "nccl_test": (
            f"mpirun -np {shape.world_size} --hostfile {hostfile_path} --map-by ppr:{g}:node "
            f"-x NCCL_DEBUG=WARN {NCCL_TESTS} -b 8 -e 1G -f 2 -g 1"
        ),
    }


def expected_bandwidth() -> str:
    return (
        f"On the Ethernet private network expect about {ETHERNET_GBITS} between machines: "
        "all_reduce_perf reports a bus bandwidth of roughly 0.1-0.25 GB/s across nodes, while "
        "GPUs inside one machine talk at NVLink/PCIe speed. For InfiniBand or RoCE, request a "
        "quote."
    )


# --- software --------------------------------------------------------------------------------


def slurm_examples(shape: ClusterShape) -> dict[str, str]:
    n, g = shape.size, shape.gpus_per_node
    return {
        "partition": SLURM_PARTITION,
        "sbatch": (
            f"sbatch --partition={SLURM_PARTITION} --nodes={n} --ntasks-per-node={g} "
            f"--gpus-per-node={g} job.sh"
        ),
        "srun": (
            f"srun --partition={SLURM_PARTITION} --nodes={n} --ntasks-per-node=1 "
            f"--gpus-per-node={g} nvidia-smi -L"
        ),
        "squeue": "squeue --long",
    }


def kube_api_server(shape: ClusterShape) -> str:
    head = shape.head
    if head.address:
        return f"https://{head.address}:{KUBE_API_PORT}"
    gateway_host = (shape.gateway or "").rsplit(":", 1)[0]
    return f"https://c{shape.cluster_id}.{gateway_host}:{KUBE_API_PORT}"


def kube_token(shape: ClusterShape) -> str:
    """The cluster admin's bearer token, derived from the secret key so nothing is stored."""
    message = f"kubernetes-admin:{shape.cluster_id}".encode()
    return hmac.new(settings.SECRET_KEY.encode(), message, hashlib.sha256).hexdigest()


def kubeconfig(shape: ClusterShape) -> str:
    # JSON is valid YAML, and json.dumps quotes every value safely.
    config = {
        "apiVersion": "v1",
        "kind": "Config",
        "clusters": [
            {
                "name": shape.name,
                "cluster": {"server": kube_api_server(shape), "insecure-skip-tls-verify": True},
            }
        ],
        "users": [{"name": f"{shape.name}-admin", "user": {"token": kube_token(shape)}}],
        "contexts": [
            {"name": shape.name, "context": {"cluster": shape.name, "user": f"{shape.name}-admin"}}
        ],
        "current-context": shape.name,
    }
    return json.dumps(config, indent=2) + "\n"


def kubernetes_gpu_pod(shape: ClusterShape) -> str:
    return (
        "apiVersion: v1\n"
        "kind: Pod\n"
        "metadata:\n"
        "  name: gpu-check\n"
        "spec:\n"
        "  restartPolicy: Never\n"
        "  containers:\n"
        "    - name: cuda\n"
        "      image: nvcr.io/nvidia/cuda:12.6.2-base-ubuntu24.04\n"
        '      command: ["nvidia-smi", "-L"]\n'
        "      resources:\n"
        "        limits:\n"
        f'          nvidia.com/gpu: "{shape.gpus_per_node}"\n'
    )


def ray_info(shape: ClusterShape) -> dict[str, str]:
    head = shape.head.name
    return {
        "head_address": f"{head}:6379",
        "client_address": f"ray://{head}:{RAY_CLIENT_PORT}",
        "dashboard": f"http://{head}:{RAY_DASHBOARD_PORT}",
        "job_submit": (
            f"ray job submit --address http://{head}:{RAY_DASHBOARD_PORT} "
            "--working-dir . -- python script.py"
        ),
    }


# --- the node plan: what a driver applies to each node --------------------------------------


def node_plan(shape: ClusterShape, node: NodeAccess, *, volume: bool = False) -> dict:
    is_head = node.index == 0
    mounts = []
    if shape.has_shared_folder:
        mounts.append(
            {"path": SHARED_DIR, "export": is_head, "source": None if is_head else "node-0"}
        )
    if volume and is_head:
        mounts.append({"path": f"{SHARED_DIR}/volume", "volume": True})
    return {
        "hostname": node.name,
        "private_ip": node.private_ip,
        "hosts": {peer.name: peer.private_ip for peer in shape.nodes},
        "environment": node_environment(shape, node),
        "mounts": mounts,
        "hostfile": {"path": shape.hostfile_path, "content": hostfile(shape)},
        "software": shape.software,
        "role": "head" if is_head else "worker",
    }
