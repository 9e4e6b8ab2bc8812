"""Degraded and failed, explained (issue 13, item 4): the banner names the node, the step and
what the installer said, with its output one click away; node rows say the install failed;
the connect panel says the software is not running; progress counts only steps really done;
the user reads node names, never the inventory's host names; "is starting" only while the
cluster provisions."""

import re

import pytest
from django.test import Client

from clusters import lifecycle
from clusters.lifecycle.rules import with_node_names
from clusters.machines.software.checks import installer_verdict
from clusters.models import Cluster, Event, Node
from clusters.web.presenters import node_rows
from offers.models import Host
from tests.clusters.lifecycle_kit import Sim, at, create, inventory, new_project
from tests.factories import ClusterFactory, issue_key

BOOT = 180


def text_of(html: str) -> str:
    return " ".join(re.sub(r"<[^>]+>", " ", html).split())


def client_of(user) -> Client:
    client = Client()
    client.force_login(user)
    return client


@pytest.fixture
def degraded(db, clock):
    """A 3-node Slurm cluster whose install fails on node-2 (the simulated installer's log)."""
    user, project = new_project()
    machine_type = inventory(hosts=3, boot_seconds=BOOT, faults={2: "install"})
    with Sim() as sim:
        cluster = create(project, machine_type, nodes=3, software="slurm", user=user)
        sim.run_until(clock, at(BOOT * 2))
    cluster.refresh_from_db()
    assert cluster.status == Cluster.Status.DEGRADED
    return user, cluster


# --- the lifecycle writes why ------------------------------------------------------------------


def test_it_records_the_node_the_step_and_what_the_installer_said(degraded):
    _, cluster = degraded
    assert (cluster.failure_reason, cluster.failure_node, cluster.failure_step) == (
        "install_failed",
        "node-2",
        "install",
    )
    assert cluster.failure_message == (
        "Installing Slurm failed on node-2: slurm service exited with status 1."
    )
    event = cluster.events.get(reason="install_failed")
    assert event.message.startswith(cluster.failure_message)
    assert "[node-2] starting slurmd ... FAILED" in event.output


def test_an_install_that_fails_on_two_nodes_names_both_with_what_each_said(db, clock):
    user, project = new_project()
    machine_type = inventory(hosts=3, boot_seconds=BOOT, faults={1: "install", 2: "install"})
    with Sim() as sim:
        cluster = create(project, machine_type, nodes=3, software="slurm", user=user)
        sim.run_until(clock, at(BOOT * 2))
    cluster.refresh_from_db()

    assert cluster.status == Cluster.Status.DEGRADED and cluster.failure_node == "node-1"
    assert cluster.failure_message == (
        "Installing Slurm failed on node-1: slurm service exited with status 1. "
        "Installing Slurm failed on node-2: slurm service exited with status 1."
    )
    output = cluster.events.get(reason="install_failed").output
    assert "--- node-1\n" in output and "--- node-2\n" in output
    assert "[node-2] starting slurmd ... FAILED" in output


def test_a_retry_clears_the_old_failure_and_a_new_one_writes_it_again(degraded, clock):
    _, cluster = degraded
    with Sim() as sim:
        lifecycle.retry_install(cluster=cluster)
        cluster.refresh_from_db()
        assert cluster.status == Cluster.Status.INSTALLING
        assert (cluster.failure_reason, cluster.failure_node, cluster.failure_message) == (
            "",
            "",
            "",
        )
        sim.run_until(clock, at(BOOT * 3))
    cluster.refresh_from_db()
    assert cluster.status == Cluster.Status.DEGRADED
    assert cluster.failure_node == "node-2" and cluster.failure_reason == "install_failed"


def test_the_user_reads_node_names_never_the_inventorys_host_names(db, clock):
    user, project = new_project()
    machine_type = inventory(hosts=2, boot_seconds=BOOT, faults={1: "crash"})
    for i, host in enumerate(Host.objects.filter(machine_type=machine_type).order_by("pk")):
        Host.objects.filter(pk=host.pk).update(name=f"fra1-rack7-gpu-004{i}")
    with Sim() as sim:
        cluster = create(project, machine_type, nodes=2, user=user)
        sim.run_until(clock, at(BOOT * 2))
    cluster.refresh_from_db()
    assert cluster.status == Cluster.Status.FAILED
    assert cluster.failure_node == "node-1"
    assert cluster.failure_message.startswith("node-1 stopped responding")
    messages = " ".join(cluster.events.values_list("message", flat=True))
    assert "node-1 stopped responding" in messages
    client = client_of(user)
    tabs = ("", "connect/", "machines/", "events/", "billing/")
    page = "".join(client.get(f"/clusters/{cluster.pk}/{tab}").content.decode() for tab in tabs)
    assert "fra1-rack7" not in messages + cluster.failure_message + page


# --- the page explains -------------------------------------------------------------------------


def test_the_degraded_banner_names_the_node_the_step_and_the_message_with_the_output(degraded):
    user, cluster = degraded
    page = client_of(user).get(f"/clusters/{cluster.pk}/").content.decode()
    banner = page.split('class="note note-warn"', 1)[1].split("</div>", 1)[0]
    text = text_of(banner)
    assert "Slurm did not install on node-2, at step Software install." in text
    assert "install_failed : Installing Slurm failed on node-2: slurm service exited" in text
    assert "Slurm is not running." in text
    event = cluster.events.get(reason="install_failed")
    details = re.search(
        r'<details class="output failure-output" id="([^"]+)"[^>]*>(.*?)</details>', banner, re.S
    )
    assert details and details.group(1) == f"failure-output-{event.pk}"
    assert "Installer output from node-2" in details.group(2)
    assert "[node-2] error: slurm service exited with status 1" in details.group(2)


def test_node_rows_say_the_install_failed_and_count_only_steps_really_done(degraded):
    user, cluster = degraded
    page = client_of(user).get(f"/clusters/{cluster.pk}/machines/").content.decode()
    rows = {
        name: text_of(row)
        for name, row in re.findall(r'<tr id="(node-\d)"[^>]*>(.*?)</tr>', page, re.S)
    }
    assert "Install failed" in rows["node-2"] and "3/4" in rows["node-2"]
    # node-0 and node-1 installed, but the readiness check never passed on them: not done.
    assert "Install stopped" in rows["node-0"] and "3/4" in rows["node-0"]
    assert "Installing" not in " ".join(rows.values())
    assert 'class="progress bad"' in page.split('id="node-2"')[1].split("</tr>")[0]


def test_the_connect_panel_says_the_software_is_not_running(degraded):
    user, cluster = degraded
    page = client_of(user).get(f"/clusters/{cluster.pk}/connect/").content.decode()
    panel = text_of(page.split('id="connect-panel"', 1)[1])
    assert "Slurm is not running: its install failed on node-2" in panel


def test_the_api_connect_says_the_software_is_not_running(degraded):
    user, cluster = degraded
    key = issue_key(user=user, project=cluster.project)
    answer = Client(headers={"authorization": f"Bearer {key}"}).get(
        f"/api/v1/clusters/{cluster.pk}/connect"
    )
    software = answer.json()["data"]["software"]
    assert software["state"] == "failed" and "install failed on node-2" in software["status"]


def test_a_ready_node_counts_its_install_only_once_checked_ready(db):
    cluster = ClusterFactory(
        software=Cluster.Software.RAY, status=Cluster.Status.INSTALLING, machines=True
    )
    nodes = list(cluster.nodes.all())
    stamp = cluster.created_at
    for node in nodes:
        node.running_at = node.agent_at = node.network_at = node.installed_at = stamp
        node.status = Node.Status.JOINED
    nodes[0].step = Node.Step.DONE
    nodes[1].step = Node.Step.INSTALL  # installed, its check not passed yet
    rows = node_rows(cluster, nodes, stamp)
    assert [(r.steps_done, r.steps_total, r.tone) for r in rows] == [(4, 4, "ok"), (3, 4, "")]
    assert rows[1].doing == "Installing software"


@pytest.mark.parametrize(
    ("status", "shown"),
    [("provisioning", True), ("installing", False), ("ready", False), ("failed", False)],
)
def test_it_says_the_cluster_is_starting_only_while_it_provisions(owner, status, shown):
    cluster = ClusterFactory(project=owner.project, name="train", size=3, status=status)
    page = text_of(owner.browser_client().get(f"/clusters/{cluster.pk}/").content.decode())
    assert ("train is starting: 3 machines reserved." in page) is shown


def test_creating_leaves_no_flash_that_outlives_provisioning(db, clock):
    user, project = new_project()
    machine_type = inventory(hosts=2, boot_seconds=BOOT)
    client = client_of(user)
    keys = [str(pk) for pk in project.ssh_keys.values_list("pk", flat=True)]
    with Sim():
        response = client.post(
            "/clusters/new/",
            {
                "offer": machine_type.slug,
                "nodes": "2",
                "name": "train",
                "environment": "default",
                "software": "none",
                "ssh_keys": keys,
            },
            follow=True,
        )
    assert response.status_code == 200
    assert list(response.context["messages"]) == []
    assert "train is starting: 2 machines reserved." in text_of(response.content.decode())


# --- the installer's verdict -------------------------------------------------------------------


@pytest.mark.parametrize(
    ("output", "said"),
    [
        ("", ""),
        (
            "[node-1] ray start ... ok\n[node-1] error: ray service exited with status 1\n",
            "ray service exited with status 1",
        ),
        (
            "runcrate: changed packages munge\nE: Unable to locate package slurmd\n"
            "runcrate: failed: could not install slurmd\n",
            "could not install slurmd",
        ),
        ("line one\nthe last line.\n\n", "the last line"),
        ("x" * 400 + " failed", "x" * 299 + "…"),
    ],
)
def test_it_reads_what_an_installer_said(output, said):
    assert installer_verdict(output) == said


def test_a_stranger_sees_no_failure(degraded, stranger):
    _, cluster = degraded
    assert stranger.browser_client().get(f"/clusters/{cluster.pk}/").status_code == 404
    assert Event.objects.filter(cluster=cluster, reason="install_failed").exists()


def test_names_become_node_names_whole_words_only(db):
    cluster = ClusterFactory(machines=True, size=2)
    nodes = list(cluster.nodes.select_related("host").order_by("index"))
    Host.objects.filter(pk=nodes[0].host_id).update(name="gpu-1")
    Host.objects.filter(pk=nodes[1].host_id).update(name="gpu-12")
    nodes = list(cluster.nodes.select_related("host").order_by("index"))
    text = "gpu-1 and gpu-12 failed; gpu-123 and rack.gpu-1 are other machines"
    assert with_node_names(text, nodes) == (
        "node-0 and node-1 failed; gpu-123 and rack.gpu-1 are other machines"
    )


def test_a_failed_network_test_names_the_node_not_the_host(db, monkeypatch):
    from clusters.lifecycle.network_test import _measure
    from clusters.machines.base import DriverError
    from clusters.machines.simulated import SimulatedDriver

    cluster = ClusterFactory(machines=True, size=2, status=Cluster.Status.READY)
    nodes = list(cluster.nodes.select_related("host").order_by("index"))
    Host.objects.filter(pk=nodes[1].host_id).update(name="fra1-rack7-gpu-0042")
    nodes = list(cluster.nodes.select_related("host").order_by("index"))

    def broken(self, cluster, *, nodes, plan):
        raise DriverError("could not reach fra1-rack7-gpu-0042 from the head")

    monkeypatch.setattr(SimulatedDriver, "network_test", broken)
    result = _measure(cluster, nodes)
    assert result.error == "could not reach node-1 from the head"


def test_a_cluster_degraded_without_failure_fields_is_explained_by_its_event(owner):
    cluster = ClusterFactory(
        project=owner.project,
        software=Cluster.Software.RAY,
        status=Cluster.Status.DEGRADED,
        machines=True,
        machines__status=Node.Status.JOINED,
    )
    node = cluster.nodes.get(index=1)
    Event.objects.create(
        cluster=cluster,
        node=node,
        step="install",
        reason="install_failed",
        message="Installing Ray failed on node-1.",
        output="[node-1] error: ray service exited with status 1\n",
    )
    page = text_of(owner.browser_client().get(f"/clusters/{cluster.pk}/").content.decode())
    assert "Ray did not install on node-1." in page
    assert "install_failed : Installing Ray failed on node-1." in page
    assert "Installer output" not in page  # no failure_step: "Output"
    assert "Output from node-1 [node-1] error: ray service exited" in page
