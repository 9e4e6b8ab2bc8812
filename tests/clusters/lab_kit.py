"""The lab's fixtures for every lab test module (tests/clusters/conftest.py offers them): the
lab's hosts up once a run, the live dashboard on the lab's bridge where the hosts' agents reach
it, the hosts in the inventory, and a user's SSH key (docs/lab.md, docs/testing.md)."""

from __future__ import annotations

import dataclasses
import json
import os
import random
import subprocess
from io import StringIO
from pathlib import Path

import pytest
from django.core.management import call_command
from django.test.testcases import LiveServerThread
from django.utils import timezone

from clusters.machines.session import operator_public_key
from lab import hostlab
from offers.inventory import load_inventory, waiting_for_baseline
from offers.models import Host
from tests.workers import lab_first_host

HOSTS = 5  # a module's `lab`: the first three in `lab` (own addresses), two behind the gateway
RUN_HOSTS = 9  # the most a module uses (test_ssh_lab_acceptance: eight nodes and a spare)
BOOT = 300  # generous: a first bootstrap installs WireGuard from the lab's mirror
# This process's GPU hosts: lab-1 on in one process or worker gw0, lab-21 on in gw1, ... (each
# pytest-xdist worker runs lab modules on hosts of its own; tests/workers.py).
FIRST = lab_first_host(os.environ.get("PYTEST_XDIST_WORKER"))


@pytest.fixture(scope="session")
def lab_run():
    """The lab's hosts of this process, brought up once a run (kept as they are where they were
    up: every fleet resets the hosts it uses). A lab this run brought up goes down at its end,
    unless another process uses it; under pytest-xdist the controller takes it down once every
    worker is done (tests/workers.py)."""
    reason = hostlab.unavailable_reason()
    if reason:
        pytest.skip(reason)
    was_up = hostlab.current() is not None
    key = operator_public_key()
    yield hostlab.up(RUN_HOSTS, authorized_key=key, gateway=True, first=FIRST)
    if not was_up and not os.environ.get("PYTEST_XDIST_WORKER") and not hostlab.others_using():
        hostlab.down()


@pytest.fixture(scope="module")
def lab(lab_run):
    """A module's lab: the first HOSTS of this process's hosts, the gateway and storage."""
    return dataclasses.replace(lab_run, hosts=lab_run.hosts[:HOSTS])


@pytest.fixture
def dashboard(transactional_db, settings):
    """The live dashboard on the lab's bridge, where the hosts' agents reach it."""
    # The lab lets its hosts reach 8000-8999 on the bridge: a free port there (another test's
    # server, or anything else, may hold the first one tried).
    for port in random.sample(range(8100, 8900), 20):
        server = LiveServerThread(hostlab.BRIDGE_ADDRESS, _static_handler(), port=port)
        server.daemon = True
        server.start()
        server.is_ready.wait(10)
        if not isinstance(server.error, OSError):
            break
        server.join(5)
    if server.error:
        raise server.error
    settings.RUNCRATE_AGENT_URL = f"http://{hostlab.BRIDGE_ADDRESS}:{server.port}"
    settings.ALLOWED_HOSTS = ["*"]
    yield settings.RUNCRATE_AGENT_URL
    server.terminate()


def _static_handler():
    from django.test.testcases import _StaticFilesHandler

    return _StaticFilesHandler


# Each lab host's baseline, recorded once a run. Every fleet puts its hosts back with
# `lab.reset` (the snapshot restore the reimage uses), so a later read would record the same
# thing: the first fleet of a run that meets a host records it through `load_inventory`, as an
# operator does, and later ones copy it. (The read of 5 hosts took 27 of the 29 s of every lab
# test's setup; docs/testing.md.)
_baselines: dict[str, dict] = {}


def register(document: dict, tmp_path: Path) -> None:
    """Load the lab's inventory `document` as staff do, every host with its baseline: read by
    `manage.py load_inventory` the first time this run meets the host, copied after that."""
    names = {host["name"] for host in document["hosts"]}
    if names <= _baselines.keys():
        load_inventory(document)
        for name in names:
            Host.objects.filter(name=name).update(
                baseline=_baselines[name], baseline_at=timezone.now()
            )
        return
    path = tmp_path / "inventory.json"
    path.write_text(json.dumps(document))
    out = StringIO()
    call_command("load_inventory", str(path), stdout=out)
    recorded = sorted(
        line.removesuffix(": baseline recorded")
        for line in out.getvalue().splitlines()
        if line.endswith(": baseline recorded")
    )
    assert recorded == sorted(names), out.getvalue()
    assert not waiting_for_baseline().exists(), out.getvalue()
    _baselines.update(Host.objects.filter(name__in=names).values_list("name", "baseline"))


@pytest.fixture
def fleet(lab, dashboard, tmp_path):
    """The lab's hosts in the inventory: machine types `lab-h100x2-vm` and `lab-gw-h100x2-vm`,
    each reimaged (`python -m lab reimage`, the inventory's `reimage`) and its baseline recorded,
    as an operator registers freshly imaged hosts: `manage.py load_inventory`, which records the
    baseline of each new ssh host it can read (docs/inventory.md; `register`)."""
    for host in lab.hosts:
        lab.reset(host.name)
    register(lab.inventory(boot_seconds=BOOT, gateway_hosts=2), tmp_path)
    yield lab
    # A test that failed half-way leaves nothing for the next one.
    for host in lab.hosts:
        if lab.exec(host.name, "test -e /var/lib/runcrate", check=False).returncode == 0:
            lab.reset(host.name)


@pytest.fixture
def user_key(tmp_path) -> Path:
    key = tmp_path / "id_user"
    subprocess.run(
        ["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-C", "user@test", "-f", str(key)],
        check=True,
    )
    return key
