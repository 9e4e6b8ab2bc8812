"""`runcrate offers` and the create's plan show what each machine has (issue 37; docs/inventory.md,
"Machine specs"), as the server words it: a machine type with NVLink, 2 TiB NVMe and CUDA 12.8
shows those figures."""

import os

import pytest

from clusters.models import Cluster
from tests.cli.kit import assert_no_traceback, run_cli, run_cli_tty
from tests.factories import GpuModelFactory, HostFactory, LocationFactory, MachineTypeFactory

pytestmark = pytest.mark.django_db(transaction=True)

SPECS = {
    "vcpus": 208,
    "memory_gib": 1800,
    "nvme_gib": 2048,
    "gpu_link": "nvlink",
    "os_image": "Ubuntu 22.04",
    "driver_version": "570",
    "cuda_version": "12.8",
}
WORDS = "208 vCPUs · 1.8 TiB RAM · 2 TiB NVMe · NVLink · Ubuntu 22.04 · driver 570 · CUDA 12.8"


@pytest.fixture
def offer(account):
    machine_type = MachineTypeFactory(
        slug="use2-h100x8-bm",
        gpu=GpuModelFactory(slug="h100-sxm"),
        location=LocationFactory(code="us-east-2"),
        gpus_per_machine=8,
        **SPECS,
    )
    HostFactory.create_batch(3, machine_type=machine_type)
    return machine_type


def test_offers_show_each_machines_specs_on_a_terminal(env, tmp_path, account, offer):
    # The terminal runs the CLI as a process: the one this checkout's PYTHONPATH names, if any.
    env = env | {key: os.environ[key] for key in ("PYTHONPATH",) if key in os.environ}
    result = run_cli_tty(
        "offers", "--gpu", "h100-sxm", "--nodes", "2", env=env, tmp_path=tmp_path, columns=200
    )

    assert result.code == 0, result.stderr
    assert WORDS in result.stdout
    assert_no_traceback(result)


def test_offers_as_json_carry_every_figure(env, tmp_path, account, offer):
    result = run_cli("offers", "--gpu", "h100-sxm", "--nodes", "2", env=env, tmp_path=tmp_path)

    assert result.code == 0, result.stderr
    [listed] = result.json()
    assert listed["specs"] == {**SPECS, "summary": WORDS}


def test_the_plan_says_what_each_machine_has(env, tmp_path, account, offer):
    result = run_cli(
        "clusters",
        "create",
        "--offer",
        offer.slug,
        "--nodes",
        "2",
        "--name",
        "train",
        env=env,
        tmp_path=tmp_path,
    )

    assert result.code == 2  # no terminal and no --yes: the plan only
    assert not Cluster.objects.exists()
    plan = " ".join(result.stderr.split())
    assert f"per machine {WORDS}" in plan
    assert_no_traceback(result)
