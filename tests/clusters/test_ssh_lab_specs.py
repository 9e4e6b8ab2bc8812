"""Acceptance holds every node to what its machine type sells (issue 37; docs/lifecycle.md,
"Acceptance before billing"), on real hosts: a node whose `nvidia-smi` (the lab's stand-in)
reports 7 GPUs of an 8-GPU machine fails the cluster naming it, before anything is billed; so
does a driver older than sold, and fewer vCPUs than sold (the agents' own count, read inside).

Its own small lab: two hosts, no gateway and no storage host (the smallest a cluster needs),
in an inventory whose machine type is an 8-GPU one stating every spec the lab's hosts meet.
"""

from __future__ import annotations

import pytest

from billing.models import UsageRecord
from clusters.machines.session import operator_public_key
from clusters.models import Cluster
from lab import hostlab
from offers.models import MachineType
from offers.offers import inventory_changed
from tests.clusters.lab_kit import BOOT, FIRST, register
from tests.clusters.lifecycle_kit import create
from tests.clusters.test_ssh_lab import (
    assert_failed_at,
    drive,
    machine_type,
    project_with,
    released,
)

pytestmark = [pytest.mark.lab, pytest.mark.django_db(transaction=True)]

HOSTS = 2
GPUS = 8
# What the stand-in nvidia-smi reports for each GPU (lab/image/nvidia-smi: driver 550.54.15,
# CUDA 12.4); the lab's hosts share this machine's cores and memory, so a type sold with 1 vCPU
# and 1 GiB is what every one of them has.
SPECS = {
    "vcpus": 1,
    "memory_gib": 1,
    "nvme_gib": 2048,
    "gpu_link": "nvswitch",
    "os_image": "Debian 12",
    "driver_version": "550",
    "cuda_version": "12.4",
}


@pytest.fixture(scope="module")
def pair():
    """Two of this process's lab hosts, brought up (or found up) for this module; the lab goes
    down at its end where this module brought it up and no other process uses it."""
    reason = hostlab.unavailable_reason()
    if reason:
        pytest.skip(reason)
    was_up = hostlab.current() is not None
    lab = hostlab.up(
        HOSTS, authorized_key=operator_public_key(), gateway=False, storage=False, first=FIRST
    )
    yield lab
    if not was_up and not hostlab.others_using():
        hostlab.down()


@pytest.fixture
def eight_gpu_hosts(pair, dashboard, tmp_path):
    """The two hosts, reimaged, in the inventory as `lab-h100x8-vm` with its specs, each
    host's stand-in nvidia-smi showing 8 H100s."""
    for host in pair.hosts:
        pair.reset(host.name)
    document = pair.inventory(boot_seconds=BOOT, gpus_per_machine=GPUS)
    document["machine_types"][0] |= SPECS
    register(document, tmp_path)
    for host in pair.hosts:
        pair.set_gpus(
            host.name,
            model=hostlab.DEFAULT_GPU_MODEL,
            memory_mib=hostlab.DEFAULT_GPU_MEMORY_MIB,
            count=GPUS,
        )
    yield pair
    for host in pair.hosts:  # back to the image's own GPUs, files and processes
        pair.reset(host.name)


def test_a_node_whose_nvidia_smi_shows_7_of_8_gpus_fails_acceptance_named_and_unbilled(
    eight_gpu_hosts, user_key
):
    lab = eight_gpu_hosts
    lab.set_gpus(
        lab.hosts[1].name,
        model=hostlab.DEFAULT_GPU_MODEL,
        memory_mib=hostlab.DEFAULT_GPU_MEMORY_MIB,
        count=GPUS - 1,
    )
    sold = machine_type("lab-h100x8-vm")
    assert sold.specs.summary == (
        "1 vCPU · 1 GiB RAM · 2 TiB NVMe · NVSwitch · Debian 12 · driver 550 · CUDA 12.4"
    )

    cluster = create(project_with(user_key), sold, nodes=HOSTS, name="short")
    drive(cluster, Cluster.Status.FAILED, Cluster.Status.READY)

    # The second host serves node-1: it, and only it, is named, with what it reported.
    event = assert_failed_at(cluster, "hardware_mismatch", "node-1", "agent")
    assert cluster.failure_message == "node-1 reports 7 GPUs; lab-h100x8-vm has 8."
    assert not UsageRecord.objects.filter(cluster=cluster).exists()  # nothing billed
    assert event.node.name == "node-1"
    assert event.output.count(hostlab.DEFAULT_GPU_MODEL) == GPUS - 1  # what nvidia-smi said
    released(cluster)


def _sells(**specs) -> MachineType:
    """`lab-h100x8-vm`, now selling `specs` (as staff would change it in admin)."""
    MachineType.objects.filter(slug="lab-h100x8-vm").update(**specs)
    inventory_changed()
    return machine_type("lab-h100x8-vm")


def test_a_driver_older_than_sold_fails_acceptance_naming_the_node(eight_gpu_hosts, user_key):
    sold = _sells(driver_version="570")

    cluster = create(project_with(user_key), sold, nodes=HOSTS, name="old-driver")
    drive(cluster, Cluster.Status.FAILED, Cluster.Status.READY)

    node = cluster.failure_node
    assert_failed_at(cluster, "hardware_mismatch", node, "agent")
    assert cluster.failure_message == (
        f"{node} reports NVIDIA driver 550.54.15; lab-h100x8-vm sells driver 570 or newer."
    )
    released(cluster)


def test_the_agents_report_their_real_vcpus_and_memory_and_fewer_than_sold_fail(
    eight_gpu_hosts, user_key
):
    sold = _sells(vcpus=4096)
    cores = int(eight_gpu_hosts.exec(eight_gpu_hosts.hosts[0].name, "nproc").stdout)

    cluster = create(project_with(user_key), sold, nodes=HOSTS, name="few-cores")
    drive(cluster, Cluster.Status.FAILED, Cluster.Status.READY)

    node = cluster.failure_node
    assert_failed_at(cluster, "acceptance_failed", node, "network")
    assert cluster.failure_message == f"{node} has {cores} vCPUs; lab-h100x8-vm sells 4096."
    reported = cluster.nodes.get(index=int(node.removeprefix("node-"))).acceptance
    assert reported["vcpus"] == cores and reported["memory_mib"] > 0  # MemTotal, read inside
    released(cluster)
