"""The hardware check's GPU-memory tolerance (clusters/lifecycle/rules.py `hardware_problem`):
a GPU within 10% of the memory its model is sold with passes, one further off fails with a
message naming both sizes. Tested at the boundary, so a wider tolerance is caught."""

import pytest

from clusters.lifecycle.rules import hardware_problem
from clusters.models import Node
from offers.models import GpuModel, MachineType

SOLD_GIB = 80
MIB = 1024


def machine_type() -> MachineType:
    gpu = GpuModel(slug="h100-sxm", name="H100 SXM 80GB", memory_gib=SOLD_GIB)
    return MachineType(slug="use2-h100x2-vm", gpu=gpu, gpus_per_machine=2)


def node_reporting(memory_total_mib: int) -> Node:
    gpu = {"name": "NVIDIA H100 80GB HBM3", "memory_total_mib": memory_total_mib}
    return Node(index=1, gpus=[gpu, gpu])


@pytest.mark.parametrize(
    "memory_total_mib",
    [
        SOLD_GIB * MIB,
        72 * MIB,  # exactly 10% under
        88 * MIB,  # exactly 10% over
        81559,  # what nvidia-smi says of an H100 80GB
    ],
)
def test_it_passes_gpus_within_10_percent_of_the_memory_sold(memory_total_mib):
    assert hardware_problem(node_reporting(memory_total_mib), machine_type()) is None


@pytest.mark.parametrize(
    ("memory_total_mib", "shown"),
    [
        (72 * MIB - 103, "72 GiB"),  # 71.9 GiB: just over 10% under
        (88 * MIB + 103, "88 GiB"),  # 88.1 GiB: just over 10% over
        (40 * MIB, "40 GiB"),  # half the memory: within a 50% tolerance, not within 10%
        (60 * MIB, "60 GiB"),
    ],
)
def test_it_fails_gpus_further_than_10_percent_from_the_memory_sold(memory_total_mib, shown):
    problem = hardware_problem(node_reporting(memory_total_mib), machine_type())

    assert problem == (
        f"node-1 reports NVIDIA H100 80GB HBM3 with {shown}; use2-h100x2-vm sells "
        "H100 SXM 80GB (80 GiB)."
    )
