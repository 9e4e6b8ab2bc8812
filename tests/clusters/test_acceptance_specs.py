"""Acceptance holds each node to what its machine type sells (docs/lifecycle.md, "Acceptance
before billing"; clusters/lifecycle/rules.py): the GPU count and the driver nvidia-smi reports
(`hardware_problem`, step `agent`), the vCPUs and memory the agent reports with its measurement
(`machine_problem` through `acceptance_problem`, step `network`, node-0 included). Boundaries
are tested, so a looser rule is caught."""

import pytest
from django.utils import timezone

from billing.models import UsageRecord
from clusters.lifecycle.observe import AgentRefused, clean_network_report
from clusters.lifecycle.rules import (
    MEMORY_SHORTFALL_TOLERATED,
    acceptance_problem,
    acceptance_report,
    hardware_problem,
    machine_problem,
)
from clusters.machines.runcrate_agent import machine_facts
from clusters.models import Cluster, Node
from offers.models import GpuModel, Location, MachineType, driver_at_least
from tests.clusters.lifecycle_kit import Sim, at, create, inventory

H100 = "NVIDIA H100 80GB HBM3"
GIB = 1024


def machine_type(**specs) -> MachineType:
    gpu = GpuModel(slug="h100-sxm", name="H100 SXM 80GB", memory_gib=80)
    return MachineType(
        slug="use2-h100x8-bm",
        gpu=gpu,
        gpus_per_machine=8,
        machine_kind=MachineType.Kind.BARE_METAL,
        location=Location(code="us-east-2"),
        **specs,
    )


def gpus(count: int, driver: str = "570.124.06") -> list[dict]:
    return [
        {"name": H100, "memory_total_mib": 81559, "uuid": f"GPU-{i}", "driver_version": driver}
        for i in range(count)
    ]


def node(index: int = 1, *, count: int = 8, driver: str = "570.124.06", **measured) -> Node:
    return Node(index=index, gpus=gpus(count, driver), acceptance=measured)


# --- GPUs and driver (step `agent`) -------------------------------------------------------------


@pytest.mark.parametrize("count", [7, 0, 4, 9])
def test_it_fails_a_node_with_another_number_of_gpus_naming_it(count):
    problem = hardware_problem(node(count=count), machine_type(driver_version="570"))

    assert problem == f"node-1 reports {count} GPUs; use2-h100x8-bm has 8."


@pytest.mark.parametrize("reported", ["570.124.06", "570.86.10", "575.51.03", "580.0"])
def test_it_passes_the_driver_sold_or_a_newer_one(reported):
    assert hardware_problem(node(driver=reported), machine_type(driver_version="570")) is None


@pytest.mark.parametrize("reported", ["565.77", "550.54.15", "", "N/A"])
def test_it_fails_a_driver_older_than_sold_naming_the_node_and_both_versions(reported):
    problem = hardware_problem(node(driver=reported), machine_type(driver_version="570"))

    assert problem == (
        f"node-1 reports NVIDIA driver {reported or 'unknown'}; use2-h100x8-bm sells driver "
        "570 or newer."
    )


def test_a_full_version_sold_is_compared_on_every_part():
    sold = machine_type(driver_version="570.124.06")

    assert hardware_problem(node(driver="570.124.06"), sold) is None
    assert hardware_problem(node(driver="570.133.20"), sold) is None
    assert "570.86.10" in hardware_problem(node(driver="570.86.10"), sold)


def test_one_gpu_on_an_older_driver_fails_the_node():
    reported = node()
    reported.gpus[5]["driver_version"] = "550.54.15"

    assert "550.54.15" in hardware_problem(reported, machine_type(driver_version="570"))


def test_a_driver_not_stated_is_not_checked():
    assert hardware_problem(node(driver="535.104.05"), machine_type()) is None


@pytest.mark.parametrize(
    ("reported", "sold", "ok"),
    [
        ("570.124.06", "570", True),
        ("570", "570", True),
        ("571.0", "570.124.06", True),
        ("570.124.05", "570.124.06", False),
        ("565.77", "570", False),
        ("1000.1", "570", True),  # compared as numbers, not as text
        ("", "570", False),
    ],
)
def test_driver_at_least_compares_versions_as_numbers(reported, sold, ok):
    assert driver_at_least(reported, sold) is ok


# --- vCPUs and memory (step `network`) ----------------------------------------------------------

SOLD = {"vcpus": 208, "memory_gib": 1800}


def test_a_node_with_the_vcpus_and_memory_sold_or_more_passes():
    sold = machine_type(**SOLD)
    exact = node(vcpus=208, memory_mib=1800 * GIB)
    more = node(vcpus=224, memory_mib=2048 * GIB)

    assert machine_problem(exact, sold) is None
    assert machine_problem(more, sold) is None


def test_a_node_with_one_vcpu_less_fails_naming_it():
    problem = machine_problem(node(2, vcpus=207, memory_mib=1800 * GIB), machine_type(**SOLD))

    assert problem == "node-2 has 207 vCPUs; use2-h100x8-bm sells 208."


def test_memory_a_little_under_nominal_passes_up_to_the_tolerance():
    sold = machine_type(**SOLD)
    floor = int(1800 * GIB * (1 - MEMORY_SHORTFALL_TOLERATED))

    assert MEMORY_SHORTFALL_TOLERATED == 0.05  # docs/lifecycle.md says 5%
    assert machine_problem(node(vcpus=208, memory_mib=1776 * GIB), sold) is None  # MemTotal
    assert machine_problem(node(vcpus=208, memory_mib=floor), sold) is None


def test_memory_below_the_tolerance_fails_naming_the_node_and_the_sizes():
    floor = int(1800 * GIB * (1 - MEMORY_SHORTFALL_TOLERATED))
    problem = machine_problem(node(3, vcpus=208, memory_mib=floor - 1), machine_type(**SOLD))

    assert problem == (
        "node-3 has 1,710 GiB of memory; use2-h100x8-bm sells 1.8 TiB (at least 1,710 GiB "
        "must show)."
    )
    half = machine_problem(node(3, vcpus=208, memory_mib=900 * GIB), machine_type(**SOLD))
    assert half.startswith("node-3 has 900 GiB of memory;")


def test_a_figure_stated_but_not_reported_fails():
    sold = machine_type(**SOLD)

    assert machine_problem(node(memory_mib=1800 * GIB), sold) == (
        "node-1's agent reported no vCPU count; use2-h100x8-bm sells 208."
    )
    assert machine_problem(node(vcpus=208), sold) == (
        "node-1's agent reported no memory size; use2-h100x8-bm sells 1.8 TiB."
    )


def test_figures_not_stated_are_not_checked():
    assert machine_problem(node(vcpus=1, memory_mib=512), machine_type()) is None
    assert machine_problem(node(), machine_type()) is None


def test_acceptance_holds_node_0_to_the_specs_too():
    sold = machine_type(**SOLD)
    head = node(0, vcpus=104, memory_mib=1800 * GIB)  # nothing measured to itself

    assert acceptance_problem(head, sold) == "node-0 has 104 vCPUs; use2-h100x8-bm sells 208."
    assert acceptance_problem(node(0, vcpus=208, memory_mib=1800 * GIB), sold) is None


def test_a_short_worker_fails_before_its_bandwidth_is_judged():
    worker = node(1, vcpus=100, memory_mib=1800 * GIB, bandwidth_mbit=5000.0, shared="simulated")

    assert acceptance_problem(worker, machine_type(**SOLD)).startswith("node-1 has 100 vCPUs")


# --- what the agent reports, and the report kept ------------------------------------------------


def test_the_dashboard_keeps_the_vcpus_and_memory_the_agent_reports():
    measured = clean_network_report(
        {}, {"latency_ms": None, "bandwidth_mbit": None, "vcpus": 208, "memory_mib": 1843200}
    )

    assert (measured["vcpus"], measured["memory_mib"]) == (208, 1843200)


@pytest.mark.parametrize(
    ("key", "value"), [("vcpus", -1), ("vcpus", "208"), ("memory_mib", 1.5), ("vcpus", True)]
)
def test_it_refuses_figures_that_are_not_whole_numbers(key, value):
    with pytest.raises(AgentRefused, match=f"acceptance.{key} must be a whole number"):
        clean_network_report({}, {key: value})


def test_the_agent_reports_its_vcpus_and_memtotal(tmp_path):
    meminfo = tmp_path / "meminfo"
    meminfo.write_text("MemTotal:       1887436800 kB\nMemAvailable:   1800000000 kB\n")

    facts = machine_facts(meminfo)

    assert facts["memory_mib"] == 1887436800 // 1024
    assert isinstance(facts["vcpus"], int) and facts["vcpus"] >= 1


def test_the_agent_reports_no_memory_it_cannot_read(tmp_path):
    assert machine_facts(tmp_path / "missing")["memory_mib"] is None


def test_the_acceptance_report_keeps_what_was_sold_and_what_each_node_showed():
    sold = machine_type(**SOLD, driver_version="570", cuda_version="12.8")
    nodes = [
        Node(index=i, gpus=gpus(8), acceptance={"vcpus": 208, "memory_mib": 1}) for i in range(2)
    ]

    report = acceptance_report(nodes, sold, at=timezone.now())

    assert report["expected"]["specs"]["vcpus"] == 208
    assert report["expected"]["specs"]["driver_version"] == "570"
    row = report["nodes"][1]
    assert (row["vcpus"], row["memory_mib"]) == (208, 1)
    assert row["gpus"][0]["driver_version"] == "570.124.06"


# --- the simulated data center, end to end ------------------------------------------------------


def _stated(machine_type: MachineType, **specs) -> MachineType:
    MachineType.objects.filter(pk=machine_type.pk).update(**specs)
    machine_type.refresh_from_db()
    return machine_type


def test_simulated_machines_show_what_their_type_sells_and_pass(project, clock):
    machine_type = _stated(inventory(hosts=2), **SOLD, driver_version="570", cuda_version="12.8")
    with Sim() as sim:
        cluster = create(project, machine_type, nodes=2)
        sim.run_until(clock, at(3 * 180))

    cluster.refresh_from_db()
    assert cluster.status == Cluster.Status.READY, cluster.failure_message
    rows = cluster.acceptance["nodes"]
    assert [row["vcpus"] for row in rows] == [208, 208]
    assert all(SOLD["memory_gib"] * GIB * 0.95 <= row["memory_mib"] < 1800 * GIB for row in rows)
    assert {gpu["driver_version"] for row in rows for gpu in row["gpus"]} == {"570.124.06"}
    assert UsageRecord.objects.filter(cluster=cluster).count() == 2
