"""What drivers are given and what they report back for connecting: the node plan at start
(and again at install), and the public address each machine is reached at once it runs."""

from clusters import connect, lifecycle
from clusters.machines.simulated import SimulatedDriver, simulated_public_address
from clusters.models import Cluster
from offers.models import Host, MachineType
from tests.clusters.lifecycle_kit import Sim, at, create, inventory, node

BOOT = 180


def test_it_derives_a_documentation_address_from_the_host_id():
    assert simulated_public_address(Host(pk=1)) == "203.0.113.1"
    assert simulated_public_address(Host(pk=254)) == "203.0.113.254"
    assert simulated_public_address(Host(pk=255)) == "198.51.100.1"
    assert simulated_public_address(Host(pk=509)) == "192.0.2.1"
    assert simulated_public_address(Host(pk=763)) == "203.0.113.1"  # 762 addresses, then again
    # An address the operator gave the host wins.
    assert simulated_public_address(Host(pk=1, address="gpu-7.example.net")) == "gpu-7.example.net"


def test_it_hands_every_node_its_plan_when_its_machine_starts(project, clock):
    machine_type = inventory(hosts=3, boot_seconds=BOOT, kind=MachineType.Kind.BARE_METAL, gpus=4)
    with Sim() as sim:
        cluster = create(project, machine_type, nodes=3, software="slurm")
        sim.tick()

    plans = [node(cluster, i).driver_state["plan"] for i in range(3)]
    assert [p["hostname"] for p in plans] == ["node-0", "node-1", "node-2"]
    assert plans[2]["hosts"] == {
        "node-0": "10.77.0.1",
        "node-1": "10.77.0.2",
        "node-2": "10.77.0.3",
    }
    assert plans[2]["environment"]["NODE_RANK"] == "2"
    assert plans[2]["environment"]["WORLD_SIZE"] == "12"
    assert plans[0]["mounts"] == [
        {"path": "/shared", "export": True, "source": None, "method": None}
    ]
    assert plans[1]["mounts"] == [
        {"path": "/shared", "export": False, "source": "node-0", "method": None}
    ]
    assert plans[1]["hostfile"]["content"] == "node-0 slots=4\nnode-1 slots=4\nnode-2 slots=4\n"
    assert plans[0]["software"] == "slurm"


def test_it_gives_the_installer_every_nodes_plan(project, clock, monkeypatch):
    seen = {}
    install = SimulatedDriver.install

    def spy(self, node, *, plan):
        seen[node.name] = plan.node_plans
        return install(self, node, plan=plan)

    monkeypatch.setattr(SimulatedDriver, "install", spy)
    machine_type = inventory(hosts=2, boot_seconds=BOOT)
    with Sim() as sim:
        cluster = create(project, machine_type, software="ray")
        sim.run_until(clock, at(BOOT * 2))

    cluster.refresh_from_db()
    assert cluster.status == Cluster.Status.READY
    assert set(seen) == {"node-0", "node-1"}
    assert seen["node-1"]["node-1"]["environment"]["NODE_RANK"] == "1"
    assert seen["node-1"]["node-0"]["role"] == "head"


def test_it_records_the_address_a_running_machine_is_reached_at(project, clock):
    machine_type = inventory(hosts=2, boot_seconds=BOOT)
    with Sim() as sim:
        cluster = create(project, machine_type)
        sim.run_until(clock, at(BOOT - 1))
        assert node(cluster, 0).public_address == ""  # still booting: no address yet
        sim.run_until(clock, at(BOOT * 2))

    cluster.refresh_from_db()
    assert cluster.status == Cluster.Status.READY
    hosts = [node(cluster, i).host for i in range(2)]
    addresses = [node(cluster, i).public_address for i in range(2)]
    assert addresses == [simulated_public_address(host) for host in hosts]
    shape = connect.shape_for(
        Cluster.objects.prefetch_related("nodes", "volumes").get(pk=cluster.pk)
    )
    assert [connect.ssh_command(shape, n) for n in shape.nodes] == [
        f"ssh root@{address}" for address in addresses
    ]


def test_it_gives_no_public_address_behind_a_gateway(project, clock):
    machine_type = inventory(hosts=2, boot_seconds=BOOT)
    machine_type.location.ssh_gateway = "gw.example.net:22"
    machine_type.location.save()
    with Sim() as sim:
        cluster = create(project, machine_type)
        sim.run_until(clock, at(BOOT * 2))

    assert [node(cluster, i).public_address for i in range(2)] == ["", ""]
    shape = connect.shape_for(
        Cluster.objects.prefetch_related("nodes", "volumes").get(pk=cluster.pk)
    )
    assert (
        connect.ssh_command(shape, shape.head)
        == f"ssh -J c{cluster.pk}@gw.example.net:22 root@node-0"
    )


def test_it_plans_a_worker_with_the_nodes_already_up(project, clock):
    machine_type = inventory(hosts=3, boot_seconds=BOOT)
    with Sim() as sim:
        cluster = create(project, machine_type)
        sim.run_until(clock, at(BOOT * 2))
        lifecycle.add_workers(cluster=cluster, count=1)
        sim.tick()

    plan = node(cluster, 2).driver_state["plan"]
    assert plan["hosts"] == {"node-0": "10.77.0.1", "node-1": "10.77.0.2", "node-2": "10.77.0.3"}
    assert plan["environment"]["NNODES"] == "3"
