"""Kubernetes on the lab's real hosts, as far as it gets there: the lab has no way out to the k3s
release, so the real installer (clusters/machines/software/host/install-kubernetes.sh) stops at the
download, on the hosts' own python3, and the cluster ends degraded with the installer's words
in its event; terminate leaves the hosts clean, k3s's places included (docs/drivers.md,
"Kubernetes on ssh hosts"). Skipped, with the reason, where the lab cannot start.
"""

from __future__ import annotations

import hashlib
import http.server
import random
import threading

import pytest
from django.conf import settings as django_settings

from clusters.models import Cluster
from lab import hostlab
from offers.models import Host
from tests.clusters.lifecycle_kit import create
from tests.clusters.test_ssh_lab import drive, machine_type, project_with, terminate_and_check

pytestmark = [pytest.mark.lab, pytest.mark.django_db(transaction=True)]

K3S_LEFTOVERS = {
    "k3s binary": "test ! -e /usr/local/bin/k3s",
    "kubectl link": "test ! -L /usr/local/bin/kubectl",
    "k3s data": "test ! -e /var/lib/rancher/k3s",
    "k3s configuration": "test ! -e /etc/rancher/k3s",
    "k3s running": "! pgrep -f '/usr/local/bin/[k]3s'",
    "k3s log": "test ! -e /var/log/runcrate/k3s.log",
}


def install_failures(cluster: Cluster) -> list:
    return list(cluster.events.filter(reason="install_failed").select_related("node"))


def assert_nothing_of_k3s(lab, cluster: Cluster) -> None:
    for host in Host.objects.filter(nodes__cluster=cluster):
        left = [
            what
            for what, command in K3S_LEFTOVERS.items()
            if lab.exec(host.name, command, check=False).returncode != 0
        ]
        assert left == [], f"{host.name} keeps {left}"


def test_a_kubernetes_cluster_stops_at_the_k3s_download_and_terminate_wipes_it(fleet, user_key):
    lab = fleet
    cluster = create(
        project_with(user_key), machine_type("lab-h100x2-vm"), nodes=2, software="kubernetes"
    )
    # Through the bootstrap, the agents and the private network: the install is reached.
    drive(cluster, Cluster.Status.DEGRADED, Cluster.Status.READY, Cluster.Status.FAILED)
    assert cluster.status == Cluster.Status.DEGRADED, cluster.failure_message
    assert cluster.joined_at is not None

    failures = install_failures(cluster)
    assert failures, list(cluster.events.values_list("reason", "message"))
    release = django_settings.RUNCRATE_K3S_URL
    for event in failures:
        # The installer's own verdict: the release it could not fetch, and why.
        last = event.output.strip().splitlines()[-1]
        assert last.startswith(f"runcrate: failed: could not fetch k3s from {release}/k3s"), (
            event.output
        )
        assert len(last) > len(f"runcrate: failed: could not fetch k3s from {release}/k3s: ")
    # It stopped before changing anything: nothing of k3s is on the hosts even before the wipe.
    assert_nothing_of_k3s(lab, cluster)

    terminate_and_check(lab, cluster)
    assert_nothing_of_k3s(lab, cluster)


@pytest.fixture
def mirror(tmp_path):
    """A k3s release folder served on the lab's bridge, where the hosts reach 8000-8999."""
    folder = tmp_path / "release"
    folder.mkdir()

    class Quiet(http.server.SimpleHTTPRequestHandler):
        def __init__(self, *args, **kwargs):
            super().__init__(*args, directory=str(folder), **kwargs)

        def log_message(self, *args):
            pass

    for port in random.sample(range(8100, 8900), 20):
        try:
            server = http.server.ThreadingHTTPServer((hostlab.BRIDGE_ADDRESS, port), Quiet)
            break
        except OSError:
            continue
    else:
        pytest.fail(f"no free port for the mirror on {hostlab.BRIDGE_ADDRESS}")
    threading.Thread(target=server.serve_forever, daemon=True).start()
    yield folder, f"http://{hostlab.BRIDGE_ADDRESS}:{server.server_address[1]}/v1.32.3%2Bk3s1"
    server.shutdown()
    server.server_close()


def test_a_mirrored_k3s_that_does_not_match_its_checksum_is_never_installed(
    fleet, user_key, mirror, settings
):
    lab = fleet
    folder, url = mirror
    (folder / "v1.32.3+k3s1").mkdir()  # the %2B in the URL is a + on disk
    release = folder / "v1.32.3+k3s1"
    for binary, arch in (("k3s", "amd64"), ("k3s-arm64", "arm64")):
        (release / binary).write_bytes(b"#!/bin/sh\necho not k3s\n")
        wrong = hashlib.sha256(b"something else").hexdigest()
        (release / f"sha256sum-{arch}.txt").write_text(f"{wrong}  {binary}\n")
    settings.RUNCRATE_K3S_URL = url
    cluster = create(
        project_with(user_key), machine_type("lab-h100x2-vm"), nodes=2, software="kubernetes"
    )
    drive(cluster, Cluster.Status.DEGRADED, Cluster.Status.READY, Cluster.Status.FAILED)
    assert cluster.status == Cluster.Status.DEGRADED, cluster.failure_message
    failures = install_failures(cluster)
    assert failures
    for event in failures:
        last = event.output.strip().splitlines()[-1]
        assert last.startswith(f"runcrate: failed: {url}/k3s"), event.output
        assert last.endswith("does not match its sha256 in sha256sum-amd64.txt") or last.endswith(
            "does not match its sha256 in sha256sum-arm64.txt"
        ), event.output
    assert_nothing_of_k3s(lab, cluster)
    terminate_and_check(lab, cluster)
