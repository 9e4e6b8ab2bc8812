"""Drivers: the registry, the simulated data center (a pure function of the clock and the
host's fault), and the agent's service functions that both the real agent and it call."""

from datetime import timedelta

import pytest

from clusters.lifecycle import agent_token
from clusters.machines import get_driver
from clusters.machines.base import DriverError, MachineState
from clusters.machines.registry import UnavailableDriver
from clusters.machines.simulated import SimulatedDriver
from clusters.machines.ssh import SshDriver
from clusters.models import Cluster, Node
from clusters.telemetry.agent_service import (
    AgentRefused,
    agent_check_in,
    agent_report_network,
    parse_nvidia_smi,
)
from offers.models import Host
from tests.clusters.lifecycle_kit import (
    T0,
    Sim,
    assert_failed_cleanly,
    at,
    create,
    inventory,
    node,
)

BOOT = 180


def started_node(project, *, fault="", hosts=2):
    machine_type = inventory(hosts=hosts, boot_seconds=BOOT, faults={0: fault})
    with Sim() as sim:
        cluster = create(project, machine_type)
        sim.tick()  # starts the machines
    return node(cluster, 0)


def test_it_picks_the_driver_a_host_is_registered_with(db):
    assert isinstance(get_driver(Host(driver="simulated")), SimulatedDriver)
    assert isinstance(get_driver(Host(driver="ssh")), SshDriver)
    unavailable = get_driver(Host(driver="ec2"))  # a cloud API driver: not built yet
    assert isinstance(unavailable, UnavailableDriver)


def test_it_fails_a_cluster_on_hosts_whose_driver_is_not_available(project, clock):
    machine_type = inventory(hosts=2, boot_seconds=BOOT)
    Host.objects.filter(machine_type=machine_type).update(driver="ec2")
    with Sim() as sim:
        cluster = create(project, machine_type)
        sim.tick()
    assert_failed_cleanly(cluster, machine_type)
    assert cluster.failure_reason == "machine_failed"
    assert "'ec2' driver is not available" in cluster.failure_message


def test_it_boots_a_simulated_machine_in_its_boot_time(project, clock):
    driver = SimulatedDriver()
    n = started_node(project)
    assert driver.observe(n, now=at(BOOT - 1)).state == MachineState.BOOTING
    running = driver.observe(n, now=at(BOOT))
    assert running.state == MachineState.RUNNING and running.since == at(BOOT)
    # the same question gets the same answer: nothing but the clock moves it
    assert driver.observe(n, now=at(BOOT + 1000)).since == at(BOOT)
    assert not driver.agent_due(n, now=at(BOOT * 1.25 - 1))
    assert driver.agent_due(n, now=at(BOOT * 1.25))


def test_it_divides_the_boot_time_by_the_simulation_speed(project, clock, settings):
    settings.RUNCRATE_SIM_SPEED = 60
    n = started_node(project)
    assert SimulatedDriver().observe(n, now=at(3)).state == MachineState.RUNNING


def test_it_simulates_each_fault(project, clock):
    driver = SimulatedDriver()
    never = started_node(project, fault="boot")
    assert driver.observe(never, now=at(BOOT * 10)).state == MachineState.BOOTING

    crash = started_node(project, fault="crash")
    assert driver.observe(crash, now=at(BOOT)).state == MachineState.RUNNING
    failed = driver.observe(crash, now=at(BOOT * 1.125))
    assert failed.state == MachineState.FAILED and failed.since == at(BOOT * 1.125)
    assert not driver.agent_due(crash, now=at(BOOT * 2))

    mute = started_node(project, fault="agent")
    assert driver.observe(mute, now=at(BOOT * 2)).state == MachineState.RUNNING
    assert not driver.agent_due(mute, now=at(BOOT * 2))

    cut = started_node(project, fault="network", hosts=3)
    peers = ["node-1", "node-2"]
    assert driver.reachability(cut, peers=peers) == {"node-1": False, "node-2": True}
    healthy = node(cut.cluster, 1)
    assert driver.reachability(healthy, peers=["node-0", "node-2"]) == {
        "node-0": True,
        "node-2": True,
    }


def test_it_reports_gpus_as_nvidia_smi_sees_them(project, clock):
    n = started_node(project)
    gpus = SimulatedDriver().agent_gpus(n)
    assert len(gpus) == 8
    assert gpus[0]["name"] == "NVIDIA H100 SXM 80GB"
    assert 80 * 1024 * 0.95 < gpus[0]["memory_total_mib"] <= 80 * 1024
    assert len({g["uuid"] for g in gpus}) == 8


# --- the agent's service functions --------------------------------------------------------


def test_it_records_an_agent_check_in_with_its_gpus(project, clock):
    n = started_node(project)
    csv = "NVIDIA H100 80GB HBM3, 81559, GPU-1b2c, 550.54.15\n" * 8
    with Sim():
        agent_check_in(node=n.pk, token=agent_token(n), gpus=csv)
        clock.shift(timedelta(seconds=30))
        agent_check_in(node=n, token=agent_token(n), gpus=[])  # a heartbeat
    n.refresh_from_db()
    assert n.agent_at == T0
    assert len(n.gpus) == 8 and n.gpus[0]["memory_total_mib"] == 81559
    assert n.heartbeat_at == at(30)


def test_it_refuses_an_agent_with_a_wrong_token_or_a_released_node(project, clock):
    n = started_node(project)
    with pytest.raises(AgentRefused) as wrong:
        agent_check_in(node=n.pk, token="not-the-token", gpus=[])
    assert wrong.value.code == "bad_token" and wrong.value.status == 403
    other = node(n.cluster, 1)
    with pytest.raises(AgentRefused):
        agent_check_in(node=n.pk, token=agent_token(other), gpus=[])
    with pytest.raises(AgentRefused) as unknown:
        agent_check_in(node=999_999, token="x", gpus=[])
    # The same answer as a wrong token: nothing tells which node ids exist.
    assert (unknown.value.code, unknown.value.status, unknown.value.message) == (
        wrong.value.code,
        wrong.value.status,
        wrong.value.message,
    )

    Node.objects.filter(pk=n.pk).update(status=Node.Status.ENDED)
    with pytest.raises(AgentRefused) as released:
        agent_check_in(node=n.pk, token=agent_token(n), gpus=[])
    assert released.value.code == "node_released"
    n.refresh_from_db()
    assert n.agent_at is None


@pytest.mark.parametrize(
    ("report", "why"),
    [
        ("NVIDIA H100, 81559, GPU-1\n", "has 3 fields, not 4"),
        ("NVIDIA H100, lots, GPU-1, 550\n", "is not a number"),
        ([{"name": "NVIDIA H100"}], "memory_total_mib"),
        ({"gpus": 8}, "list of objects"),
    ],
)
def test_it_refuses_a_gpu_report_it_cannot_read(project, clock, report, why):
    n = started_node(project)
    with pytest.raises(AgentRefused) as refused:
        agent_check_in(node=n.pk, token=agent_token(n), gpus=report)
    assert refused.value.code == "invalid_report"
    assert why in refused.value.message


def test_it_records_a_network_report_and_refuses_a_malformed_one(project, clock):
    n = started_node(project)
    with Sim():
        agent_report_network(node=n.pk, token=agent_token(n), reachability={"node-1": True})
    n.refresh_from_db()
    assert n.reachability == {"node-1": True} and n.network_reported_at == T0
    with pytest.raises(AgentRefused):
        agent_report_network(node=n.pk, token=agent_token(n), reachability={"node-1": "yes"})


def test_it_parses_nvidia_smi_csv():
    assert parse_nvidia_smi("A100-SXM4-80GB, 81920, GPU-abc, 535.104.05\n\n") == [
        {
            "name": "A100-SXM4-80GB",
            "memory_total_mib": 81920,
            "uuid": "GPU-abc",
            "driver_version": "535.104.05",
        }
    ]


def test_it_counts_a_check_in_made_before_the_deadline_though_seen_later(project, clock):
    # A real agent checks in on its own (the simulated one never does here: fault `agent`);
    # the reconciler judges the check-in's own time against the deadline.
    machine_type = inventory(hosts=2, boot_seconds=BOOT, faults={0: "agent", 1: "agent"})
    with Sim() as sim:
        cluster = create(project, machine_type)
        sim.run_until(clock, at(BOOT))
        for n in cluster.nodes.all():
            agent_check_in(node=n.pk, token=agent_token(n), gpus=SimulatedDriver().agent_gpus(n))
        sim.dispatcher.advances.clear()
        clock.move_to(at(BOOT * 2 - 1))  # the next tick comes just before the agent deadline
        sim.tick()
    cluster.refresh_from_db()
    assert cluster.status == Cluster.Status.READY
    assert node(cluster, 0).agent_at == at(BOOT)
    assert node(cluster, 0).network_at == at(BOOT * 2 - 1)


def test_the_ssh_driver_refuses_a_host_registered_with_another_user_before_connecting(
    project, clock
):
    n = started_node(project)
    n.host.driver, n.host.user, n.host.address = "ssh", "ubuntu", "203.0.113.7"
    with pytest.raises(DriverError) as refused:
        SshDriver().start(n, agent_token="t", plan={})
    assert refused.value.reason == "machine_failed"
    assert "user 'ubuntu'" in refused.value.message and "logs in as root" in refused.value.message


def test_a_failed_sync_back_is_tried_again_before_the_release_gives_up():
    """The stop that cannot sync a volume back is retried (node-0 keeps the files) and then
    wipes anyway, always before the release's own attempts run out (the host would go
    offline with the volume never synced)."""
    from clusters.lifecycle.rules import RELEASE_ATTEMPTS
    from clusters.machines import storage

    assert 1 < storage.SYNC_ATTEMPTS < RELEASE_ATTEMPTS
