"""The connection details and commands are exact text that users paste: compare them whole."""

import io
import json
import subprocess

import paramiko
import pytest
from django.utils import timezone

from clusters.connect import (
    ClusterShape,
    NodeAccess,
    NoRoute,
    details,
    hostfile,
    known_hosts,
    kube_api_server,
    kubernetes_gpu_pod,
    launch_commands,
    node_environment,
    node_plan,
    ray_info,
    shape_for,
    slurm_examples,
    ssh_command,
    ssh_config,
    storage,
)
from clusters.models import Cluster, Node
from tests.factories import ClusterFactory, LocationFactory, MachineTypeFactory

GATEWAY = "gw.fra-1.runcrate.net:2222"


def shape(
    *,
    nodes: int,
    gpus: int,
    kind: str = "bare_metal",
    gateway: str | None = None,
    software: str = "none",
    volume: str | None = None,
    addresses: bool = True,
) -> ClusterShape:
    return ClusterShape(
        cluster_id=42,
        name="train",
        nodes=tuple(
            NodeAccess(index=i, address=f"203.0.113.{10 + i}" if addresses else None)
            for i in range(nodes)
        ),
        gpus_per_node=gpus,
        machine_kind=kind,
        software=software,
        gateway=gateway,
        volume=volume,
    )


# --- two single-GPU bare-metal machines with public addresses ---------------------------------


def test_it_writes_a_hostfile_line_per_node_with_its_gpus():
    assert hostfile(shape(nodes=2, gpus=1)) == "node-0 slots=1\nnode-1 slots=1\n"
    assert hostfile(shape(nodes=16, gpus=8)) == "".join(f"node-{i} slots=8\n" for i in range(16))
    assert hostfile(shape(nodes=16, gpus=8)).splitlines()[15] == "node-15 slots=8"


def test_it_connects_directly_where_hosts_have_a_public_address():
    s = shape(nodes=2, gpus=1)
    assert ssh_command(s, s.nodes[0]) == "ssh root@203.0.113.10"
    assert ssh_command(s, s.nodes[1]) == "ssh root@203.0.113.11"
    assert ssh_config(s) == (
        "# Runcrate cluster train: save as ~/.ssh/config.d/train and put\n"
        "# `Include config.d/*` at the top of ~/.ssh/config (or append this file to it).\n"
        "# Then ssh train (or ssh train-node-0) reaches node-0, the head, and ssh train-node-1 "
        "the other nodes.\n"
        "\n"
        "Host train train-node-0\n"
        "    HostName 203.0.113.10\n"
        "    User root\n"
        "    HostKeyAlias runcrate-c42-node-0\n"
        "\n"
        "Host train-node-1\n"
        "    HostName 203.0.113.11\n"
        "    User root\n"
        "    HostKeyAlias runcrate-c42-node-1\n"
    )


def test_it_fills_the_launch_commands_for_two_single_gpu_machines():
    assert launch_commands(shape(nodes=2, gpus=1)) == {
        "torchrun": (
            "torchrun --nnodes=2 --nproc-per-node=1 --rdzv-backend=c10d "
            "--rdzv-endpoint=node-0:29500 --rdzv-id=train train.py"
        ),
        # OpenMPI refuses to start as root without being told: users log in as root.
        "mpirun": (
            "mpirun --allow-run-as-root -np 2 --hostfile /shared/hostfile --map-by ppr:1:node "
            "-x MASTER_ADDR=node-0 -x MASTER_PORT=29500 python train.py"
        ),
        "deepspeed": (
            "deepspeed --hostfile /shared/hostfile --num_nodes 2 --num_gpus 1 "
            "--master_addr node-0 --master_port 29500 train.py"
        ),
        "nccl_test": (
            "mpirun --allow-run-as-root -np 2 --hostfile /shared/hostfile --map-by ppr:1:node "
            "-x NCCL_DEBUG=WARN /opt/nccl-tests/build/all_reduce_perf -b 8 -e 1G -f 2 -g 1"
        ),
    }


def test_it_gives_every_node_its_rank_and_the_world_size():
    s = shape(nodes=2, gpus=1)
    assert node_environment(s, s.nodes[1]) == {
        "MASTER_ADDR": "node-0",
        "MASTER_PORT": "29500",
        "NODE_RANK": "1",
        "NNODES": "2",
        "GPUS_PER_NODE": "1",
        "WORLD_SIZE": "2",
    }


def test_it_plans_each_node_whole():
    s = shape(nodes=2, gpus=1, software="slurm")
    assert node_plan(s, s.nodes[1]) == {
        "hostname": "node-1",
        "private_ip": "10.77.0.2",
        "hosts": {"node-0": "10.77.0.1", "node-1": "10.77.0.2"},
        "environment": {
            "MASTER_ADDR": "node-0",
            "MASTER_PORT": "29500",
            "NODE_RANK": "1",
            "NNODES": "2",
            "GPUS_PER_NODE": "1",
            "WORLD_SIZE": "2",
        },
        "mounts": [{"path": "/shared", "export": False, "source": "node-0", "method": None}],
        "hostfile": {"path": "/shared/hostfile", "content": "node-0 slots=1\nnode-1 slots=1\n"},
        "software": "slurm",
        "role": "worker",
    }


# --- sixteen eight-GPU containers behind a gateway ---------------------------------------------


def test_it_jumps_through_the_gateway_where_hosts_have_no_address():
    s = shape(nodes=16, gpus=8, kind="container", gateway=GATEWAY, addresses=False)
    assert ssh_command(s, s.nodes[0]) == "ssh -J c42@gw.fra-1.runcrate.net:2222 root@node-0"
    assert ssh_command(s, s.nodes[15]) == "ssh -J c42@gw.fra-1.runcrate.net:2222 root@node-15"
    config = ssh_config(s)
    assert config.count("\nHost ") == 16
    assert (
        "\n"
        "Host train train-node-0\n"
        "    HostName node-0\n"
        "    User root\n"
        "    HostKeyAlias runcrate-c42-node-0\n"
        "    ProxyJump c42@gw.fra-1.runcrate.net:2222\n"
        "\n"
    ) in config
    assert config.endswith(
        "\n"
        "Host train-node-15\n"
        "    HostName node-15\n"
        "    User root\n"
        "    HostKeyAlias runcrate-c42-node-15\n"
        "    ProxyJump c42@gw.fra-1.runcrate.net:2222\n"
    )


def test_it_prefers_the_gateway_when_a_location_has_one():
    # Behind a gateway the node's address is the one the gateway forwards to (the cluster's
    # jump user may open only its own hosts); the jump always goes through the gateway.
    s = shape(nodes=2, gpus=8, gateway=GATEWAY)
    assert ssh_command(s, s.nodes[1]) == "ssh -J c42@gw.fra-1.runcrate.net:2222 root@203.0.113.11"
    unknown = ClusterShape(**{**s.__dict__, "nodes": (NodeAccess(index=0, address=None),)})
    assert ssh_command(unknown, unknown.nodes[0]) == (
        "ssh -J c42@gw.fra-1.runcrate.net:2222 root@node-0"
    )


def test_it_fills_the_launch_commands_for_sixteen_eight_gpu_containers():
    assert launch_commands(shape(nodes=16, gpus=8, kind="container")) == {
        "torchrun": (
            "torchrun --nnodes=16 --nproc-per-node=8 --rdzv-backend=c10d "
            "--rdzv-endpoint=node-0:29500 --rdzv-id=train train.py"
        ),
        # Containers share no folder: the hostfile lies on each node's own disk.
        "mpirun": (
            "mpirun --allow-run-as-root -np 128 --hostfile /etc/runcrate/hostfile "
            "--map-by ppr:8:node -x MASTER_ADDR=node-0 -x MASTER_PORT=29500 python train.py"
        ),
        "deepspeed": (
            "deepspeed --hostfile /etc/runcrate/hostfile --num_nodes 16 --num_gpus 8 "
            "--master_addr node-0 --master_port 29500 train.py"
        ),
        "nccl_test": (
            "mpirun --allow-run-as-root -np 128 --hostfile /etc/runcrate/hostfile "
            "--map-by ppr:8:node -x NCCL_DEBUG=WARN /opt/nccl-tests/build/all_reduce_perf "
            "-b 8 -e 1G -f 2 -g 1"
        ),
    }
    s = shape(nodes=16, gpus=8)
    assert node_environment(s, s.nodes[3])["WORLD_SIZE"] == "128"
    assert node_environment(s, s.nodes[3])["NODE_RANK"] == "3"


def test_it_writes_an_ssh_config_that_paramiko_reads_as_intended():
    shapes = (
        shape(nodes=16, gpus=8),
        shape(nodes=2, gpus=1, gateway="gw.example.net:22", addresses=False),
        shape(nodes=16, gpus=8, kind="container", gateway=GATEWAY, addresses=False),
    )
    for s in shapes:
        config = paramiko.SSHConfig()
        config.parse(io.StringIO(ssh_config(s)))
        assert config.get_hostnames() - {"*"} == {"train"} | {f"train-{n.name}" for n in s.nodes}
        for node in s.nodes:
            for alias in (f"train-{node.name}",) + (("train",) if node.index == 0 else ()):
                entry = config.lookup(alias)
                assert entry["user"] == "root"
                assert entry["hostname"] == (node.name if s.gateway else node.address)
                assert entry.get("proxyjump") == s.jump


# --- shared storage: containers against bare metal, and a volume ------------------------------


def test_it_exports_shared_from_the_head_except_on_containers():
    bare = shape(nodes=2, gpus=8)
    assert node_plan(bare, bare.nodes[0])["mounts"] == [
        {"path": "/shared", "export": True, "source": None, "method": None}
    ]
    assert node_plan(bare, bare.nodes[1])["mounts"] == [
        {"path": "/shared", "export": False, "source": "node-0", "method": None}
    ]
    containers = shape(nodes=2, gpus=8, kind="container")
    assert node_plan(containers, containers.nodes[0])["mounts"] == []
    assert node_plan(containers, containers.nodes[1])["hostfile"]["path"] == (
        "/etc/runcrate/hostfile"
    )


def test_it_mounts_an_attached_volume_on_the_head_only():
    bare = shape(nodes=2, gpus=8, volume="datasets")
    assert node_plan(bare, bare.nodes[0])["mounts"] == [
        {"path": "/shared", "export": True, "source": None, "method": None},
        {"path": "/shared/volume", "volume": "datasets"},
    ]
    assert node_plan(bare, bare.nodes[1])["mounts"] == [
        {"path": "/shared", "export": False, "source": "node-0", "method": None}
    ]
    containers = shape(nodes=2, gpus=8, kind="container", volume="datasets")
    assert node_plan(containers, containers.nodes[0])["mounts"] == [
        {"path": "/shared/volume", "volume": "datasets"}
    ]
    assert node_plan(containers, containers.nodes[1])["mounts"] == []


def test_it_says_where_files_are_shared():
    assert storage(shape(nodes=2, gpus=8, volume="datasets")) == {
        "shared": "/shared",
        "hostfile_path": "/shared/hostfile",
        "volume": {"name": "datasets", "path": "/shared/volume", "node": "node-0"},
        "summary": (
            "Every node mounts /shared, exported from node-0 over the private network; the "
            "hostfile is /shared/hostfile. Volume datasets is synced into /shared/volume on "
            "node-0 and back to the volume, so its files outlive the cluster. Everything else "
            "on the machines, /shared included, is deleted when the cluster ends."
        ),
    }
    assert storage(shape(nodes=2, gpus=8, kind="container")) == {
        "shared": None,
        "hostfile_path": "/etc/runcrate/hostfile",
        "volume": None,
        "summary": (
            "Containers share no folder: each node keeps its own disk, with the hostfile at "
            "/etc/runcrate/hostfile. Everything else on the machines is deleted when the "
            "cluster ends."
        ),
    }
    on_containers = storage(shape(nodes=2, gpus=8, kind="container", volume="datasets"))
    assert "synced into /shared/volume on node-0 only" in on_containers["summary"]


# --- software ----------------------------------------------------------------------------------


def test_it_fills_the_slurm_examples_with_the_partition():
    assert slurm_examples(shape(nodes=16, gpus=8)) == {
        "partition": "gpu",
        "sbatch": "sbatch --partition=gpu --nodes=16 --ntasks-per-node=8 --gpus-per-node=8 job.sh",
        "srun": (
            "srun --partition=gpu --nodes=16 --ntasks-per-node=1 --gpus-per-node=8 nvidia-smi -L"
        ),
        "squeue": "squeue --long",
    }


def test_it_points_ray_at_the_head():
    assert ray_info(shape(nodes=2, gpus=1)) == {
        "head_address": "node-0:6379",
        "client_address": "ray://node-0:10001",
        "dashboard": "http://node-0:8265",
        # The dashboard listens on node-0's private address, where the tunnel leads.
        "dashboard_tunnel": "ssh -N -L 8265:10.77.0.1:8265 root@203.0.113.10",
        "dashboard_local": "http://127.0.0.1:8265",
        "job_submit": (
            "ray job submit --address http://node-0:8265 --working-dir . -- python script.py"
        ),
        "auth": (
            "Ray asks for the cluster's token (token authentication): the nodes' own ray "
            "commands have it; `ray get-auth-token` on node-0 prints it, for the dashboard's "
            "sign-in and for ray on your computer."
        ),
        "token_command": "ray get-auth-token",
        "token_env": (
            "export RAY_AUTH_MODE=token RAY_AUTH_TOKEN=$(ssh root@203.0.113.10 ray get-auth-token)"
        ),
        "job_submit_local": (
            "ray job submit --address http://127.0.0.1:8265 --working-dir . -- python script.py"
        ),
    }


def test_it_tunnels_the_ray_dashboard_through_the_gateway_and_never_without_a_route():
    behind = ray_info(shape(nodes=2, gpus=1, gateway=GATEWAY, addresses=False))
    assert behind["dashboard_tunnel"] == (
        f"ssh -J c42@{GATEWAY} -N -L 8265:10.77.0.1:8265 root@node-0"
    )
    assert behind["token_env"] == (
        f"export RAY_AUTH_MODE=token RAY_AUTH_TOKEN=$(ssh -J c42@{GATEWAY} root@node-0 "
        "ray get-auth-token)"
    )
    nowhere = ray_info(shape(nodes=2, gpus=1, addresses=False))
    assert (nowhere["dashboard_tunnel"], nowhere["token_env"]) == (None, None)


def test_it_says_when_the_software_is_not_running():
    failed = ClusterShape(
        **{
            **shape(nodes=2, gpus=1, software="slurm").__dict__,
            "software_state": "failed",
            "software_failed_on": "node-1",
        }
    )
    software = details(failed)["software"]
    assert software["state"] == "failed"
    assert software["status"].startswith("Slurm is not running: its install failed on node-1")
    installing = ClusterShape(**{**failed.__dict__, "software_state": "installing"})
    assert details(installing)["software"]["status"].startswith("Slurm is still installing")
    running = details(shape(nodes=2, gpus=1, software="ray"))["software"]
    assert running["state"] == "running" and running["status"] is None


def test_it_asks_kubernetes_for_every_gpu_of_a_machine():
    pod = kubernetes_gpu_pod(shape(nodes=2, gpus=8))
    assert pod.endswith('        limits:\n          nvidia.com/gpu: "8"\n')
    assert '      command: ["nvidia-smi", "-L"]\n' in pod


# --- never a command that cannot work ---------------------------------------------------------


def test_it_never_prints_a_command_for_a_node_without_an_address_or_a_gateway():
    s = ClusterShape(
        cluster_id=42,
        name="train",
        nodes=(NodeAccess(index=0, address="203.0.113.10"), NodeAccess(index=1, address=None)),
        gpus_per_node=8,
        machine_kind="vm",
        software="kubernetes",
        gateway=None,
    )
    with pytest.raises(NoRoute, match="node-1 has no public address yet"):
        ssh_command(s, s.nodes[1])
    config = ssh_config(s)
    assert "Host node-1" not in config and "None" not in config
    assert "# node-1: no public address yet; download again once it runs." in config
    connect = details(s)
    assert [row["command"] for row in connect["ssh"]] == ["ssh root@203.0.113.10", None]
    assert "None" not in json.dumps({k: v for k, v in connect.items() if k != "ssh"})

    headless = ClusterShape(**{**s.__dict__, "nodes": (NodeAccess(index=0, address=None),)})
    with pytest.raises(NoRoute):
        kube_api_server(headless)
    assert details(headless)["software"]["kubeconfig"] is None


def test_it_gathers_everything_for_the_panel_and_the_api():
    connect = details(shape(nodes=2, gpus=1, software="ray"))
    assert connect["ssh"][1] == {
        "node": "node-1",
        "hosts": ["train-node-1"],
        "role": "worker",
        "private_ip": "10.77.0.2",
        "address": "203.0.113.11",
        "command": "ssh root@203.0.113.11",
    }
    assert connect["ssh"][0]["hosts"] == ["train", "train-node-0"]
    assert connect["ssh_names"] == (
        "Then ssh train (or ssh train-node-0) reaches node-0, the head, and ssh train-node-1 "
        "the other nodes."
    )
    assert connect["hostfile"] == {
        "path": "/shared/hostfile",
        "content": "node-0 slots=1\nnode-1 slots=1\n",
    }
    assert connect["environment"][1]["variables"]["NODE_RANK"] == "1"
    assert connect["software"]["head_address"] == "node-0:6379"
    assert set(connect["commands"]) == {"torchrun", "mpirun", "deepspeed", "nccl_test"}
    assert "1-2 Gbit/s" in connect["bandwidth"]


# --- shape_for reads a cluster's rows -------------------------------------------------------


def test_it_reaches_nodes_at_the_address_their_driver_reported(db):
    now = timezone.now()
    cluster = ClusterFactory(
        machine_type=MachineTypeFactory(location=LocationFactory(ssh_gateway="")),
        status=Cluster.Status.READY,
        joined_at=now,
        machines=True,
        machines__status=Node.Status.JOINED,
    )
    cluster.nodes.filter(index=0).update(public_address="203.0.113.7")
    cluster.nodes.filter(index=1).update(public_address="203.0.113.8")
    s = shape_for(cluster)
    assert [ssh_command(s, node) for node in s.nodes] == [
        "ssh root@203.0.113.7",
        "ssh root@203.0.113.8",
    ]

    behind = ClusterFactory(
        machine_type=MachineTypeFactory(location=LocationFactory(ssh_gateway="gw.example:22")),
        status=Cluster.Status.READY,
        joined_at=now,
        machines=True,
        machines__status=Node.Status.JOINED,
        machines__public_address="203.0.113.9",
    )
    s = shape_for(behind)
    # Behind a gateway, the address is the one the gateway forwards to (its jump user may only
    # open that): a stock sshd cannot tell one cluster's node-0 from another's by name.
    assert ssh_command(s, s.nodes[0]) == f"ssh -J c{behind.pk}@gw.example:22 root@203.0.113.9"
    assert "    HostName 203.0.113.9\n" in ssh_config(s)


def test_it_leaves_a_worker_out_of_the_hostfile_until_it_joins(db):
    cluster = ClusterFactory(
        size=3,
        status=Cluster.Status.READY,
        joined_at=timezone.now(),
        machines=True,
        machines__status=Node.Status.JOINED,
    )
    cluster.nodes.filter(index=2).update(status=Node.Status.STARTING, is_worker=True)
    assert hostfile(shape_for(cluster)) == "node-0 slots=8\nnode-1 slots=8\n"
    planned = shape_for(cluster, planning=True)
    assert [n.name for n in planned.nodes] == ["node-0", "node-1", "node-2"]


def test_a_node_on_another_ssh_port_gets_it_in_the_command_and_the_config():
    s = shape(nodes=2, gpus=1)
    other = ClusterShape(
        **{**s.__dict__, "nodes": (NodeAccess(index=0, address="203.0.113.10", port=2222),)}
    )
    assert ssh_command(other, other.nodes[0]) == "ssh -p 2222 root@203.0.113.10"
    assert "    Port 2222\n" in ssh_config(other)
    behind = ClusterShape(**{**other.__dict__, "gateway": GATEWAY})
    assert ssh_command(behind, behind.nodes[0]) == (
        "ssh -J c42@gw.fra-1.runcrate.net:2222 -p 2222 root@203.0.113.10"
    )
    assert "Port" not in ssh_config(s)


def test_it_offers_known_hosts_lines_for_the_pinned_keys_under_each_alias():
    s = shape(nodes=2, gpus=1)
    assert known_hosts(s) == ""  # the simulated data center pins no key
    pinned = ClusterShape(
        **{
            **s.__dict__,
            "nodes": (
                NodeAccess(index=0, address="203.0.113.10", host_key="ssh-ed25519 AAAA0"),
                NodeAccess(index=1, address="203.0.113.11", host_key="ssh-ed25519 AAAA1"),
            ),
            "gateway": GATEWAY,
            "gateway_host_key": "ssh-ed25519 GATE",
        }
    )
    assert known_hosts(pinned) == (
        "runcrate-c42-node-0 ssh-ed25519 AAAA0\n"
        "runcrate-c42-node-1 ssh-ed25519 AAAA1\n"
        "[gw.fra-1.runcrate.net]:2222 ssh-ed25519 GATE\n"
    )
    assert "Add the cluster's known_hosts" in ssh_config(pinned)


def test_the_real_ssh_client_reads_the_config_as_meant(tmp_path):
    # `ssh -G` prints the options ssh would use for a host, without connecting anywhere.
    s = ClusterShape(
        **{
            **shape(nodes=2, gpus=1).__dict__,
            "nodes": (
                NodeAccess(index=0, address="203.0.113.10"),
                NodeAccess(index=1, address="203.0.113.11", port=2222),
            ),
            "gateway": GATEWAY,
        }
    )
    config = tmp_path / "config"
    config.write_text(ssh_config(s))

    def options(host: str) -> dict[str, str]:
        done = subprocess.run(
            ["ssh", "-G", "-F", str(config), host], capture_output=True, text=True, check=True
        )
        return dict(line.split(" ", 1) for line in done.stdout.splitlines() if " " in line)

    node1 = options("train-node-1")
    assert (node1["hostname"], node1["port"], node1["user"]) == ("203.0.113.11", "2222", "root")
    assert node1["hostkeyalias"] == "runcrate-c42-node-1"
    assert node1["proxyjump"] == "c42@gw.fra-1.runcrate.net:2222"
    assert options("train-node-0")["hostkeyalias"] == "runcrate-c42-node-0"
