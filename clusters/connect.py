"""How to connect to a cluster and run on it (SPEC §6): SSH, the hostfile, launch commands,
the environment every node gets, shared storage, per-software examples and the kubeconfig.

Everything here is a pure function of a `ClusterShape`, so the page, the API, the ready email
and the node plan that drivers apply all print exactly the same text. `shape_for(cluster)` reads
the one cluster's rows into a shape. Nothing here ever prints a command that cannot work: a
node with neither an address of its own nor a gateway in front of it has no SSH command
(`ssh_command` raises `NoRoute`) and is left out of the SSH config until it has one.
"""

import base64
import json
import re
from dataclasses import dataclass, field
from datetime import UTC, datetime

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import NameOID

from clusters import secrets

SSH_USER = "root"
MASTER_PORT = 29500
RAY_CLIENT_PORT = 10001
RAY_DASHBOARD_PORT = 8265
RAY_TOKEN_COMMAND = "ray get-auth-token"  # on node-0: the cluster's token (Ray's token auth)
SOFTWARE_NAMES = {"slurm": "Slurm", "kubernetes": "Kubernetes", "ray": "Ray"}
KUBE_API_PORT = 6443
# node-0's firewall lets only sshd in on its public address (docs/security.md), so the API is
# reached through an SSH tunnel to node-0, on a local port of its own per cluster (below the
# ephemeral ports of Linux, macOS and Windows), so two clusters' tunnels can be open at once.
KUBE_TUNNEL_PORTS = range(20000, 30000)
# The cluster CA's validity: fixed, so the certificate is the same every time it is made.
KUBE_CA_VALID = (datetime(2025, 1, 1, tzinfo=UTC), datetime(2045, 1, 1, tzinfo=UTC))
_P256_ORDER = 0xFFFFFFFF00000000FFFFFFFFFFFFFFFFBCE6FAADA7179E84F3B9CAC2FC632551
SLURM_PARTITION = "gpu"
SHARED_DIR = "/shared"
LOCAL_HOSTFILE = "/etc/runcrate/hostfile"
VOLUME_DIR = f"{SHARED_DIR}/volume"
NCCL_TESTS = "/opt/nccl-tests/build/all_reduce_perf"
ETHERNET_GBITS = "1-2 Gbit/s"


# `NAME-node-i` always ends in `-node-` and digits; a cluster's own name that ends so (or is
# `node-N`) is not declared for its head, so names of different clusters never meet.
_NODE_NAME_ENDING = re.compile(r"(?:^|-)node-[0-9]+\Z")


class NoRoute(ValueError):
    """A node that has no public address (yet) at a location without an SSH gateway."""


@dataclass(frozen=True)
class NodeAccess:
    index: int
    address: str | None  # where SSH reaches it (behind a gateway: where the gateway forwards)
    port: int = 22
    host_key: str | None = None  # its pinned host key, where its driver pins one
    # How it mounts node-0's /shared, as its agent reported at join (nfs, sshfs, simulated).
    shared_method: str | None = None

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
    volume: str | None = None  # the attached volume's name, or None
    gateway_host_key: str | None = None  # the gateway's pinned host key, where known
    # Whether the software runs: running, installing, or failed (its install did not pass on
    # every node: the cluster is degraded), with the node it failed on.
    software_state: str = "running"
    software_failed_on: str | None = None
    # how the machines are joined: Ethernet for self-serve, InfiniBand or RoCE where quoted
    interconnect: str = "ethernet"
    interconnect_label: str = "Ethernet"
    # The key the cluster's secrets are derived under (`clusters.secrets.cluster_key`, so a
    # key rotation changes none of them); "" for the current SECRET_KEY.
    secret_key: str = field(default="", repr=False)

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

    def host_key_alias(self, node: NodeAccess) -> str:
        """The name users' known_hosts keep a node's key under: one per cluster and node, so a
        second cluster's node-0 (behind the same gateway, at the same address) never clashes."""
        return f"runcrate-c{self.cluster_id}-{node.name}"

    def ssh_host(self, node: NodeAccess) -> str:
        """The node's name in the SSH config on the user's computer: `NAME-node-i`, scoped by
        the cluster, so two clusters' configs included together never share a name. Inside the
        cluster (hostfile, /etc/hosts, MASTER_ADDR) the node stays `node-i`."""
        return f"{self.name}-{node.name}"

    def ssh_hosts(self, node: NodeAccess) -> tuple[str, ...]:
        """Every name the SSH config declares for `node`: `NAME-node-i`, and for the head the
        cluster's own name too, unless that name ends in `node-N` itself (a cluster called
        `node-1`, or `train-node-1`, which is another cluster's worker), so no name is ever
        a bare `node-N` nor another cluster's node."""
        if node.index == 0 and not _NODE_NAME_ENDING.search(self.name):
            return (self.name, self.ssh_host(node))
        return (self.ssh_host(node),)

    def reachable(self, node: NodeAccess) -> bool:
        """Whether `node` can be reached over SSH: through the gateway, or at its address."""
        return bool(self.gateway or node.address)


def shape_for(cluster, *, planning: bool = False) -> ClusterShape:
    """The cluster as users connect to it. Before the cluster joins that is every node that is
    starting or up; once it has joined, the nodes that joined (a worker still starting is not in
    the hostfile until it is up). `planning=True` keeps starting nodes in any case: a node plan
    is made for a node that is starting.

    Reads `cluster.nodes.all()` (prefetch it) and the attached volume (`cluster.volumes`)."""
    machine_type = cluster.machine_type
    wanted = ("starting", "joined") if planning or cluster.joined_at is None else ("joined",)
    every_node = list(cluster.nodes.all())
    nodes = [n for n in every_node if n.status in wanted]
    founder = next((n for n in every_node if n.index == 0), None)
    gateway = machine_type.location.ssh_gateway or None
    volume = next(iter(cluster.volumes.all()), None)
    state, failed_on = _software_state(cluster)
    return ClusterShape(
        cluster_id=cluster.pk,
        name=cluster.name,
        nodes=tuple(
            NodeAccess(
                index=n.index,
                address=n.public_address or None,
                port=n.public_port,
                host_key=n.host_key or None,
                shared_method=(n.acceptance or {}).get("shared"),
            )
            for n in sorted(nodes, key=lambda n: n.index)
        ),
        gpus_per_node=machine_type.gpus_per_machine,
        machine_kind=machine_type.machine_kind,
        software=cluster.software,
        gateway=gateway,
        volume=volume.name if volume else None,
        gateway_host_key=machine_type.location.ssh_gateway_host_key or None,
        software_state=state,
        software_failed_on=failed_on,
        interconnect=machine_type.interconnect,
        interconnect_label=machine_type.get_interconnect_display(),
        secret_key=secrets.cluster_key(founder),
    )


def _software_state(cluster) -> tuple[str, str | None]:
    """running | installing | failed, and the node a failed install names."""
    if cluster.status == "installing":
        return "installing", None
    # Degraded because the software did not install: the one the page offers a retry for.
    if cluster.can_retry_install:
        return "failed", cluster.failure_node or None
    return "running", None


def software_status(shape: ClusterShape) -> str | None:
    """A sentence when the cluster's software is not running (None when it runs, or there is
    none): the connect panel and the API say it above the software's commands."""
    if shape.software == "none" or shape.software_state == "running":
        return None
    software = SOFTWARE_NAMES.get(shape.software, shape.software)
    if shape.software_state == "installing":
        return (
            f"{software} is still installing: its commands below work once the cluster is "
            "ready. SSH and the private network work now."
        )
    where = f" on {shape.software_failed_on}" if shape.software_failed_on else ""
    return (
        f"{software} is not running: its install failed{where}, so its commands below do not "
        "work yet. SSH, the hostfile and the private network work; retry the install, or "
        "terminate the cluster."
    )


# --- SSH ----------------------------------------------------------------------------------


def ssh_command(shape: ClusterShape, node: NodeAccess, *, options: str = "") -> str:
    """`ssh root@ADDRESS`, or `ssh -J cID@GATEWAY root@ADDRESS` (`-p PORT` off port 22), with
    `options` (e.g. a port forward) after `ssh`; raises NoRoute for a node that has neither an
    address nor a gateway."""
    port = f"-p {node.port} " if node.port != 22 else ""
    if options:
        port = f"{options} {port}"
    if shape.gateway:
        # Behind the gateway a node's address (where the gateway forwards to) is reachable only
        # through it; without one known yet, the gateway resolves the node's name.
        return f"ssh -J {shape.jump} {port}{SSH_USER}@{node.address or node.name}"
    if node.address:
        return f"ssh {port}{SSH_USER}@{node.address}"
    raise NoRoute(f"{node.name} has no public address yet and its location has no SSH gateway.")


def ssh_config(shape: ClusterShape) -> str:
    """A config with a Host entry per node for the user's computer: `ssh NAME` (or
    `ssh NAME-node-0`) reaches the head, `ssh NAME-node-i` each node (`ClusterShape.ssh_hosts`).
    No entry is a bare `node-i`: with two clusters' configs included, a `Host node-0` in each
    had ssh take the address from one and the ProxyJump from the other. Each entry keeps its
    host key under its own alias (`HostKeyAlias`), which `known_hosts` gives. A node with no
    route yet is a comment, not an entry."""
    lines = [
        f"# Runcrate cluster {shape.name}: save as ~/.ssh/config.d/{shape.name} and put",
        "# `Include config.d/*` at the top of ~/.ssh/config (or append this file to it).",
        f"# {ssh_names(shape)}",
    ]
    if any(node.host_key for node in shape.nodes):
        lines.append(
            "# Add the cluster's known_hosts (download it beside this file) to ~/.ssh/known_hosts:"
        )
        lines.append("# the machines' keys are pinned, so ssh never asks you to trust one.")
    for node in shape.nodes:
        if not shape.reachable(node):
            lines += ["", f"# {node.name}: no public address yet; download again once it runs."]
            continue
        lines += [
            "",
            f"Host {' '.join(shape.ssh_hosts(node))}",
            f"    HostName {node.address or node.name}",
            f"    User {SSH_USER}",
        ]
        if node.port != 22:
            lines.append(f"    Port {node.port}")
        lines.append(f"    HostKeyAlias {shape.host_key_alias(node)}")
        if shape.gateway:
            lines.append(f"    ProxyJump {shape.jump}")
    return "\n".join(lines) + "\n"


def ssh_names(shape: ClusterShape) -> str:
    """How the SSH config names the machines, in one plain sentence: the config's header, the
    ready email, the CLI and the connect API (`ssh_names`) say the same."""
    if not shape.nodes:
        return "Each machine gets its entry here once it starts."
    head, *others = shape.ssh_hosts(shape.head)
    also = f" (or ssh {others[0]})" if others else ""
    sentence = f"Then ssh {head}{also} reaches node-0, the head"
    if shape.size == 1:
        return f"{sentence}."
    workers = f"ssh {shape.ssh_host(shape.nodes[1])}"
    if shape.size > 2:
        workers += f" … ssh {shape.ssh_host(shape.nodes[-1])}"
    return f"{sentence}, and {workers} the other nodes."


def known_hosts(shape: ClusterShape) -> str:
    """known_hosts lines for the cluster's pinned host keys: each node under its
    `HostKeyAlias`, and the location's gateway under its address. Empty where no key is
    pinned (the simulated data center)."""
    lines = [
        f"{shape.host_key_alias(node)} {node.host_key}" for node in shape.nodes if node.host_key
    ]
    if shape.gateway and shape.gateway_host_key:
        host, _, port = shape.gateway.rpartition(":")
        name = host if port == "22" else f"[{host.strip('[]')}]:{port}"
        lines.append(f"{name} {shape.gateway_host_key}")
    return "".join(f"{line}\n" for line in lines)


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
    # OpenMPI refuses to start as root unless told to; users log in as root.
    as_root = " --allow-run-as-root" if SSH_USER == "root" else ""
    return {
        "torchrun": (
            f"torchrun --nnodes={n} --nproc-per-node={g} --rdzv-backend=c10d "
            f"--rdzv-endpoint={shape.head.name}:{MASTER_PORT} --rdzv-id={shape.name} train.py"
        ),
        "mpirun": (
            f"mpirun{as_root} -np {shape.world_size} --hostfile {hostfile_path} "
            f"--map-by ppr:{g}:node -x MASTER_ADDR={shape.head.name} -x MASTER_PORT={MASTER_PORT} "
            "python train.py"
        ),
        "deepspeed": (
            f"deepspeed --hostfile {hostfile_path} --num_nodes {n} --num_gpus {g} "
            f"--master_addr {shape.head.name} --master_port {MASTER_PORT} train.py"
        ),
        "nccl_test": (
            f"mpirun{as_root} -np {shape.world_size} --hostfile {hostfile_path} "
            f"--map-by ppr:{g}:node -x NCCL_DEBUG=WARN {NCCL_TESTS} -b 8 -e 1G -f 2 -g 1"
        ),
    }


def expected_bandwidth(interconnect: str = "ethernet", label: str = "Ethernet") -> str:
    """What the network between the machines gives, as the page and the connect API say it."""
    if interconnect != "ethernet":
        return (
            f"The machines are joined over {label}, as agreed in the quote: NCCL carries the "
            "traffic between GPUs over it. The encrypted private network (10.77.0.0/24) "
            "carries SSH, the hostfile and the software."
        )
    return (
        f"On the Ethernet private network expect about {ETHERNET_GBITS} between machines: "
        "all_reduce_perf reports a bus bandwidth of roughly 0.1-0.25 GB/s across nodes, while "
        "GPUs inside one machine talk at NVLink/PCIe speed."
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
    """node-0's API server as the kubeconfig names it: the local end of the SSH tunnel
    (`kube_tunnel`), whether node-0 is reached at its own address or through a gateway: its
    firewall lets nothing but sshd in from outside. Raises NoRoute while the head has neither."""
    if not shape.reachable(shape.head):
        raise NoRoute(
            f"{shape.head.name} has no public address yet and its location has no SSH gateway."
        )
    return f"https://127.0.0.1:{kube_tunnel_port(shape)}"


def kube_tunnel_port(shape: ClusterShape) -> int:
    return KUBE_TUNNEL_PORTS.start + shape.cluster_id % len(KUBE_TUNNEL_PORTS)


def kube_tunnel(shape: ClusterShape) -> str | None:
    """The SSH tunnel to node-0's API (which listens on its private address only) that the
    kubeconfig needs open; None while node-0 has neither an address nor a gateway. k3s's
    serving certificate names 127.0.0.1."""
    if not shape.reachable(shape.head):
        return None
    forward = f"-N -L {kube_tunnel_port(shape)}:{shape.head.private_ip}:{KUBE_API_PORT}"
    return ssh_command(shape, shape.head, options=forward)


def _cluster_secret(shape: ClusterShape, purpose: str) -> bytes:
    """32 bytes derived from the key the cluster was created under (`shape.secret_key`),
    `purpose` and the cluster's id: stored nowhere (clusters/secrets.py)."""
    return secrets.cluster_secret(shape.secret_key, purpose, str(shape.cluster_id))


def kube_token(shape: ClusterShape) -> str:
    """The cluster admin's bearer token, derived from the secret key so nothing is stored."""
    return _cluster_secret(shape, "kubernetes-admin").hex()


@dataclass(frozen=True)
class KubeCa:
    certificate: str  # PEM: in the kubeconfig, and k3s's server-ca.crt
    key: str  # PEM (SEC1): k3s's server-ca.key, on node-0 only


def kube_ca(shape: ClusterShape) -> KubeCa:
    """The CA of the cluster's API server (EC P-256): its key derived from the secret key and
    the cluster, its certificate signed with RFC 6979's deterministic ECDSA over a fixed serial
    and validity, so the same bytes come out every time and nothing is stored. k3s is given
    both before its first start and signs its serving certificate with them."""
    scalar = int.from_bytes(_cluster_secret(shape, "kubernetes-ca")) % (_P256_ORDER - 1) + 1
    key = ec.derive_private_key(scalar, ec.SECP256R1())
    serial = int.from_bytes(_cluster_secret(shape, "kubernetes-ca-serial")[:16]) >> 1 or 1
    name = x509.Name(
        [
            x509.NameAttribute(NameOID.ORGANIZATION_NAME, "Runcrate"),
            x509.NameAttribute(NameOID.COMMON_NAME, f"{shape.name} Kubernetes CA"[:64]),
        ]
    )
    public = key.public_key()
    certificate = (
        x509.CertificateBuilder()
        .subject_name(name)
        .issuer_name(name)
        .public_key(public)
        .serial_number(serial)
        .not_valid_before(KUBE_CA_VALID[0])
        .not_valid_after(KUBE_CA_VALID[1])
        .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
        .add_extension(
            x509.KeyUsage(
                digital_signature=True,
                content_commitment=False,
                key_encipherment=False,
                data_encipherment=False,
                key_agreement=False,
                key_cert_sign=True,
                crl_sign=True,
                encipher_only=False,
                decipher_only=False,
            ),
            critical=True,
        )
        .add_extension(x509.SubjectKeyIdentifier.from_public_key(public), critical=False)
        .sign(key, hashes.SHA256(), ecdsa_deterministic=True)
    )
    return KubeCa(
        certificate=certificate.public_bytes(serialization.Encoding.PEM).decode(),
        key=key.private_bytes(
            serialization.Encoding.PEM,
            serialization.PrivateFormat.TraditionalOpenSSL,
            serialization.NoEncryption(),
        ).decode(),
    )


def kubeconfig(shape: ClusterShape) -> str:
    """The admin's kubeconfig: node-0's API, verified against the cluster's own CA."""
    ca = base64.b64encode(kube_ca(shape).certificate.encode()).decode()
    config = {
        "apiVersion": "v1",
        "kind": "Config",
        "clusters": [
            {
                "name": shape.name,
                "cluster": {"server": kube_api_server(shape), "certificate-authority-data": ca},
            }
        ],
        "users": [{"name": f"{shape.name}-admin", "user": {"token": kube_token(shape)}}],
        "contexts": [
            {"name": shape.name, "context": {"cluster": shape.name, "user": f"{shape.name}-admin"}}
        ],
        "current-context": shape.name,
    }
    return _yaml(config)


def _yaml(value, indent: int = 0) -> str:
    """Block-style YAML, as kubectl writes a kubeconfig, of dicts, lists and strings. Every
    string is double-quoted the way JSON quotes it, which YAML reads the same, so no value
    (a name, a token, an address) can change the document's structure."""
    pad = " " * indent
    lines = []
    if isinstance(value, dict):
        for key, item in value.items():
            if isinstance(item, (dict, list)):
                lines.append(f"{pad}{key}:\n{_yaml(item, indent + 2)}")
            else:
                lines.append(f"{pad}{key}: {json.dumps(item)}\n")
    elif isinstance(value, list):
        for item in value:
            body = _yaml(item, indent + 2) if isinstance(item, (dict, list)) else None
            if body is None:
                lines.append(f"{pad}- {json.dumps(item)}\n")
            else:
                lines.append(f"{pad}- {body[indent + 2 :]}")
    return "".join(lines)


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


def ray_dashboard_tunnel(shape: ClusterShape) -> str | None:
    """The SSH tunnel that brings node-0's Ray dashboard (and job API), which listens on
    node-0's private address only, to this computer's 127.0.0.1:8265. None while node-0 has
    neither an address nor a gateway."""
    if not shape.reachable(shape.head):
        return None
    forward = f"-N -L {RAY_DASHBOARD_PORT}:{shape.head.private_ip}:{RAY_DASHBOARD_PORT}"
    return ssh_command(shape, shape.head, options=forward)


def ray_token_env(shape: ClusterShape) -> str | None:
    """The shell line that gives this computer's `ray` commands the cluster's token (Ray's
    token authentication), read from node-0; None while node-0 has no route."""
    if not shape.reachable(shape.head):
        return None
    return (
        "export RAY_AUTH_MODE=token "
        f"RAY_AUTH_TOKEN=$({ssh_command(shape, shape.head)} {RAY_TOKEN_COMMAND})"
    )


def ray_info(shape: ClusterShape) -> dict[str, str | None]:
    head = shape.head.name
    local = f"http://127.0.0.1:{RAY_DASHBOARD_PORT}"
    return {
        "head_address": f"{head}:6379",
        "client_address": f"ray://{head}:{RAY_CLIENT_PORT}",
        "dashboard": f"http://{head}:{RAY_DASHBOARD_PORT}",
        "dashboard_tunnel": ray_dashboard_tunnel(shape),
        "dashboard_local": local,
        "job_submit": (
            f"ray job submit --address http://{head}:{RAY_DASHBOARD_PORT} "
            "--working-dir . -- python script.py"
        ),
        "auth": (
            "Ray asks for the cluster's token (token authentication): the nodes' own ray "
            f"commands have it; `{RAY_TOKEN_COMMAND}` on node-0 prints it, for the dashboard's "
            "sign-in and for ray on your computer."
        ),
        "token_command": RAY_TOKEN_COMMAND,
        "token_env": ray_token_env(shape),
        "job_submit_local": (
            f"ray job submit --address {local} --working-dir . -- python script.py"
        ),
    }


# --- the node plan: what a driver applies to each node --------------------------------------


def node_plan(shape: ClusterShape, node: NodeAccess) -> dict:
    """What a driver applies to `node`: its hostname and private address, every peer in
    /etc/hosts, the environment (/etc/environment), the mounts and the hostfile.

    `/shared` is exported by node-0 over the private network and mounted by every other node,
    on virtual machines and bare metal; containers share no folder. An attached volume is
    synced into `/shared/volume` on node-0 only (on containers too)."""
    is_head = node.index == 0
    mounts = []
    if shape.has_shared_folder:
        mounts.append(
            {
                "path": SHARED_DIR,
                "export": is_head,
                "source": None if is_head else "node-0",
                # Which one runs (NFS where the kernels have it, else sshfs): known once the
                # worker's agent has mounted it.
                "method": None if is_head else node.shared_method,
            }
        )
    if shape.volume and is_head:
        mounts.append({"path": VOLUME_DIR, "volume": shape.volume})
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


# --- shared storage ----------------------------------------------------------------------------


def storage(shape: ClusterShape) -> dict:
    """Where files are shared (SPEC §6), in words and paths, for the page and the API."""
    if shape.has_shared_folder:
        summary = (
            f"Every node mounts {SHARED_DIR}, exported from node-0 over the private network"
            f"{_shared_methods(shape)}; the hostfile is {shape.hostfile_path}."
        )
    else:
        summary = (
            "Containers share no folder: each node keeps its own disk, with the hostfile at "
            f"{shape.hostfile_path}."
        )
    volume = None
    if shape.volume:
        volume = {"name": shape.volume, "path": VOLUME_DIR, "node": shape.head.name}
        where = "node-0" if shape.has_shared_folder else "node-0 only"
        summary += (
            f" Volume {shape.volume} is synced into {VOLUME_DIR} on {where} and back to the "
            "volume, so its files outlive the cluster."
        )
    wiped = f", {SHARED_DIR} included," if shape.has_shared_folder else ""
    summary += f" Everything else on the machines{wiped} is deleted when the cluster ends."
    return {
        "shared": SHARED_DIR if shape.has_shared_folder else None,
        "hostfile_path": shape.hostfile_path,
        "volume": volume,
        "summary": summary,
    }


def _shared_methods(shape: ClusterShape) -> str:
    methods = sorted({n.shared_method for n in shape.nodes[1:] if n.shared_method})
    names = {"nfs": "NFS", "sshfs": "sshfs", "simulated": "simulated NFS"}
    return f" ({', '.join(names.get(m, m) for m in methods)})" if methods else ""


# --- everything at once: the connect panel and GET /api/v1/clusters/{id}/connect ---------------


def software_details(shape: ClusterShape) -> dict | None:
    """The examples for the cluster's software, or None for `none`."""
    details = _software_commands(shape)
    if details is not None:
        details["state"] = shape.software_state
        details["status"] = software_status(shape)
    return details


def _software_commands(shape: ClusterShape) -> dict | None:
    if shape.software == "slurm":
        return {"name": "slurm", **slurm_examples(shape)}
    if shape.software == "kubernetes":
        try:
            server = kube_api_server(shape)
        except NoRoute:
            server = None
        return {
            "name": "kubernetes",
            "api_server": server,
            "tunnel": kube_tunnel(shape),
            "kubeconfig": kubeconfig(shape) if server else None,
            "gpu_pod": kubernetes_gpu_pod(shape),
            "apply": "kubectl apply -f gpu-check.yaml && kubectl logs -f gpu-check",
        }
    if shape.software == "ray":
        return {"name": "ray", **ray_info(shape)}
    return None


def details(shape: ClusterShape) -> dict:
    """Everything a user needs to connect and run, as plain data: SSH per node, the SSH config,
    the hostfile, the launch commands, each node's environment, storage and the software."""
    ssh = []
    for node in shape.nodes:
        command = ssh_command(shape, node) if shape.reachable(node) else None
        ssh.append(
            {
                "node": node.name,
                "hosts": list(shape.ssh_hosts(node)),
                "role": "head" if node.index == 0 else "worker",
                "private_ip": node.private_ip,
                "address": node.address,
                "command": command,
            }
        )
    return {
        "ssh_user": SSH_USER,
        "gateway": shape.gateway,
        "ssh": ssh,
        "ssh_config": ssh_config(shape),
        "ssh_names": ssh_names(shape),
        "known_hosts": known_hosts(shape),
        "hostfile": {"path": shape.hostfile_path, "content": hostfile(shape)},
        "commands": launch_commands(shape) if shape.nodes else {},
        "bandwidth": expected_bandwidth(shape.interconnect, shape.interconnect_label),
        "environment": [
            {"node": node.name, "variables": node_environment(shape, node)} for node in shape.nodes
        ],
        "storage": storage(shape) if shape.nodes else None,
        "software": software_details(shape) if shape.nodes else None,
    }
