"""The connection details and commands are exact text that users paste: compare them whole."""

import io
import json

import paramiko

from clusters.connect import (
    ClusterShape,
    NodeAccess,
    hostfile,
    kubeconfig,
    launch_commands,
    node_environment,
    node_plan,
    ssh_command,
    ssh_config,
)


def shape(
    *,
    nodes: int,
    gpus: int,
    kind: str = "bare_metal",
    gateway: str | None = None,
    software: str = "none",
) -> ClusterShape:
    return ClusterShape(
        cluster_id=42,
        name="train",
        nodes=tuple(
            NodeAccess(index=i, address=None if gateway else f"203.0.113.{10 + i}")
            for i in range(nodes)
        ),
        gpus_per_node=gpus,
        machine_kind=kind,
        software=software,
        gateway=gateway,
    )


def test_it_writes_a_hostfile_line_per_node_with_its_gpus():
    assert hostfile(shape(nodes=2, gpus=1)) == "node-0 slots=1\nnode-1 slots=1\n"
    lines = hostfile(shape(nodes=16, gpus=8)).splitlines()
    assert len(lines) == 16
    assert lines[0] == "node-0 slots=8" and lines[15] == "node-15 slots=8"


def test_it_connects_directly_where_hosts_have_a_public_address():
    s = shape(nodes=2, gpus=1)
    assert ssh_command(s, s.nodes[1]) == "ssh root@203.0.113.11"
    assert ssh_config(s) == (
        "# Runcrate cluster train: save as ~/.ssh/config.d/train or append\n"
        "\n"
        "Host node-0\n"
        "    HostName 203.0.113.10\n"
        "    User root\n"
        "\n"
        "Host node-1\n"
        "    HostName 203.0.113.11\n"
        "    User root\n"
    )


def test_it_jumps_through_the_gateway_where_hosts_have_none():
    s = shape(nodes=2, gpus=8, gateway="gw.fra-1.runcrate.net:2222")
    assert ssh_command(s, s.nodes[0]) == "ssh -J c42@gw.fra-1.runcrate.net:2222 root@node-0"
    assert ssh_config(s).endswith(
        "Host node-1\n"
        "    HostName node-1\n"
        "    User root\n"
        "    ProxyJump c42@gw.fra-1.runcrate.net:2222\n"
    )


def test_it_writes_an_ssh_config_that_paramiko_reads_as_intended():
    for s in (shape(nodes=16, gpus=8), shape(nodes=2, gpus=1, gateway="gw.example.net:22")):
        config = paramiko.SSHConfig()
        config.parse(io.StringIO(ssh_config(s)))
        assert config.get_hostnames() >= {n.name for n in s.nodes}
        for node in s.nodes:
            entry = config.lookup(node.name)
            assert entry["user"] == "root"
            assert entry["hostname"] == (node.address or node.name)
            assert entry.get("proxyjump") == s.jump


def test_it_fills_the_launch_commands_for_two_single_gpu_machines():
    commands = launch_commands(shape(nodes=2, gpus=1))
    assert commands["torchrun"] == (
        "torchrun --nnodes=2 --nproc-per-node=1 --rdzv-backend=c10d "
        "--rdzv-endpoint=node-0:29500 --rdzv-id=train train.py"
    )
    assert commands["mpirun"] == (
        "mpirun -np 2 --hostfile /shared/hostfile --map-by ppr:1:node "
        "-x MASTER_ADDR=node-0 -x MASTER_PORT=29500 python train.py"
    )
    assert commands["deepspeed"] == (
        "deepspeed --hostfile /shared/hostfile --num_nodes 2 --num_gpus 1 "
        "--master_addr node-0 --master_port 29500 train.py"
    )
    assert commands["nccl_test"] == (
        "mpirun -np 2 --hostfile /shared/hostfile --map-by ppr:1:node "
        "-x NCCL_DEBUG=WARN /opt/nccl-tests/build/all_reduce_perf -b 8 -e 1G -f 2 -g 1"
    )


def test_it_fills_the_launch_commands_for_sixteen_eight_gpu_containers():
    commands = launch_commands(shape(nodes=16, gpus=8, kind="container"))
    assert commands["torchrun"].startswith("torchrun --nnodes=16 --nproc-per-node=8 ")
    # Containers share no folder: the hostfile lies on each node's own disk.
    assert commands["mpirun"] == (
        "mpirun -np 128 --hostfile /etc/runcrate/hostfile --map-by ppr:8:node "
        "-x MASTER_ADDR=node-0 -x MASTER_PORT=29500 python train.py"
    )
    assert "--num_nodes 16 --num_gpus 8" in commands["deepspeed"]


def test_it_gives_every_node_its_rank_and_the_world_size():
    s = shape(nodes=16, gpus=8)
    assert node_environment(s, s.nodes[3]) == {
        "MASTER_ADDR": "node-0",
        "MASTER_PORT": "29500",
        "NODE_RANK": "3",
        "NNODES": "16",
        "GPUS_PER_NODE": "8",
        "WORLD_SIZE": "128",
    }


def test_it_exports_shared_from_the_head_except_on_containers():
    bare = shape(nodes=2, gpus=8)
    assert node_plan(bare, bare.nodes[0])["mounts"] == [
        {"path": "/shared", "export": True, "source": None}
    ]
    assert node_plan(bare, bare.nodes[1])["mounts"] == [
        {"path": "/shared", "export": False, "source": "node-0"}
    ]
    containers = shape(nodes=2, gpus=8, kind="container")
    assert node_plan(containers, containers.nodes[1])["mounts"] == []
    # A volume shows on the head only, on containers too.
    assert node_plan(containers, containers.nodes[0], volume=True)["mounts"] == [
        {"path": "/shared/volume", "volume": True}
    ]
    plan = node_plan(bare, bare.nodes[1])
    assert plan["hosts"] == {"node-0": "10.77.0.1", "node-1": "10.77.0.2"}
    assert plan["environment"]["NODE_RANK"] == "1"


def test_it_points_the_kubeconfig_at_the_head(settings):
    settings.SECRET_KEY = "k" * 50
    direct = json.loads(kubeconfig(shape(nodes=2, gpus=8, kind="vm")))
    assert direct["clusters"][0]["cluster"]["server"] == "https://203.0.113.10:6443"
    assert direct["current-context"] == "train"
    token = direct["users"][0]["user"]["token"]
    assert len(token) == 64
    behind = json.loads(kubeconfig(shape(nodes=2, gpus=8, kind="vm", gateway="gw.x.net:22")))
    assert behind["clusters"][0]["cluster"]["server"] == "https://c42.gw.x.net:6443"
    settings.SECRET_KEY = "z" * 50
    assert json.loads(kubeconfig(shape(nodes=2, gpus=8)))["users"][0]["user"]["token"] != token
