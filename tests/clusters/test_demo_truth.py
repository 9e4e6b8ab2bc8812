"""A demo that never pretends (issue 37, docs/clusters.md "Demo machines"): the Connect tab and
the API say simulated machines cannot be logged into; logs keep the time their lines were
written; the create form's estimate agrees with the track record beside it."""

import re
from datetime import UTC, datetime, timedelta

import pytest
import time_machine
from django.utils import timezone

from clusters.machines.base import LogKind
from clusters.machines.simulated import SimulatedDriver
from clusters.models import Cluster, Node
from offers.models import Host, MachineType, TrackRecord
from tests.billing.conftest import bill_cluster
from tests.clusters.front import credit, machine_type_with_hosts
from tests.factories import ClusterFactory, LocationFactory, MachineTypeFactory

NOW = datetime(2026, 3, 20, 12, 0, tzinfo=UTC)


def text_of(html: str) -> str:
    return " ".join(re.sub(r"<[^>]+>", " ", html).split()).replace("&#x27;", "'")


def running_cluster(person, *, gateway: str = "gw.us-east-2.demo.invalid:22") -> Cluster:
    machine_type = MachineTypeFactory(
        location=LocationFactory(code="us-east-2", name="Columbus, Ohio", ssh_gateway=gateway)
    )
    return ClusterFactory(
        project=person.project,
        machine_type=machine_type,
        size=2,
        status=Cluster.Status.READY,
        joined_at=timezone.now(),
        ready_at=timezone.now(),
        machines=True,
        machines__status=Node.Status.JOINED,
        machines__step=Node.Step.DONE,
    )


# --- the Connect tab and the API ------------------------------------------------------------


def test_the_connect_tab_says_demo_machines_cannot_be_logged_into(owner):
    cluster = running_cluster(owner)
    client = owner.browser_client()

    connect = text_of(client.get(f"/clusters/{cluster.pk}/connect/").content.decode())
    overview = text_of(client.get(f"/clusters/{cluster.pk}/").content.decode())
    api = owner.api().get(f"/api/v1/clusters/{cluster.pk}/connect").json()["data"]

    assert "Demo machines cannot be logged into." in connect
    assert "runcrate ssh says this and runs nothing" in connect
    assert "gw.us-east-2.demo.invalid:22" in connect  # the reserved name, never a real one
    assert "(a demo machine: it cannot be logged into)" in overview
    assert api["simulated"] is True


def test_real_machines_get_no_demo_words(owner):
    cluster = running_cluster(owner)
    Host.objects.filter(nodes__cluster=cluster).update(driver=Host.Driver.SSH)

    connect = owner.browser_client().get(f"/clusters/{cluster.pk}/connect/").content.decode()
    api = owner.api().get(f"/api/v1/clusters/{cluster.pk}/connect").json()["data"]

    assert "cannot be logged into" not in connect
    assert api["simulated"] is False


# --- logs keep their time -------------------------------------------------------------------


def test_a_simulated_hosts_log_files_keep_the_time_they_were_written(db, owner):
    with time_machine.travel(NOW, tick=False) as clock:
        cluster = bill_cluster(owner.project, size=2, at=NOW - timedelta(hours=1))
        Cluster.objects.filter(pk=cluster.pk).update(software="slurm")
        up, agent, network = (NOW - timedelta(minutes=m) for m in (58, 57, 56))
        Node.objects.filter(cluster=cluster).update(
            running_at=up, agent_at=agent, network_at=network, heartbeat_at=NOW
        )
        node = Node.objects.select_related("cluster__machine_type").get(cluster=cluster, index=1)
        clock.shift(timedelta(hours=3))  # fetched three hours later
        kinds = [LogKind.BOOTSTRAP, LogKind.INSTALL, LogKind.AGENT, LogKind.SYSTEM]
        texts = {
            t.kind: t.output
            for t in SimulatedDriver().read_logs(node, kinds=kinds, head_ip="10.77.0.1")
        }
        live = SimulatedDriver()._log_text(
            node, LogKind.SLURM_NODES, now=timezone.now(), head_ip="10.77.0.1"
        )

    assert texts[LogKind.BOOTSTRAP].startswith("==> bootstrap, 2026-03-20T11:02:00+00:00\n")
    assert texts[LogKind.INSTALL].startswith("==> install, 2026-03-20T11:04:00+00:00\n")
    assert texts[LogKind.AGENT].splitlines() == [
        "Mar 20 11:02:00 runcrate-agent: started (node node-1)",
        "Mar 20 11:03:00 runcrate-agent: checked in (8 GPUs)",
        "Mar 20 12:00:00 runcrate-agent: heartbeat sent (8 GPUs)",
    ]
    assert "Mar 20 11:04:00 node-1 kernel: wireguard: rc0: peers up" in texts[LogKind.SYSTEM]
    for text in texts.values():
        assert "15:00" not in text  # nothing carries the time of the read
    assert live.startswith("Fri Mar 20 15:00:00 2026\n")  # a command's answer is of its moment


# --- the estimate beside the track record -----------------------------------------------------


def test_the_create_form_gives_the_real_estimate_beside_the_track_record_and_the_demo_speed(
    owner, settings
):
    settings.RUNCRATE_SIM_SPEED = 30
    credit(owner.project)
    machine_type = machine_type_with_hosts(
        free=4, slug="vm8", machine_kind=MachineType.Kind.VM, boot_seconds=180
    )
    TrackRecord.objects.create(
        machine_type=machine_type,
        clusters=20,
        started=20,
        ready_median_seconds=290,
        ready_p95_seconds=380,
        computed_at=timezone.now(),
    )

    page = text_of(owner.browser_client().get("/clusters/new/?offer=vm8&nodes=2").content.decode())

    # 180 s boot + half again for the checks: 270 s, about 5 min, at real speed, as the
    # record's 290 s median reads; the demo's 30× speed-up said apart, never alone.
    assert "Ready in about 5 min , or 8 min with Slurm, Kubernetes or Ray" in page
    assert (
        "This demo's simulated data center runs 30× faster than real machines: here it takes "
        "about 9 s, or 15 s with software." in page
    )
    assert "half of them ready within 5 min and 95% within 6 min" in page
    assert "Ready in about 9 s" not in page


def test_at_real_speed_the_form_says_nothing_of_a_speed_up(owner, settings):
    settings.RUNCRATE_SIM_SPEED = 1
    credit(owner.project)
    machine_type_with_hosts(free=4, slug="vm8", machine_kind=MachineType.Kind.VM, boot_seconds=180)

    page = text_of(owner.browser_client().get("/clusters/new/?offer=vm8&nodes=2").content.decode())

    assert "Ready in about 5 min" in page
    assert "faster than real machines" not in page


@pytest.mark.parametrize("speed", [1, 30])
def test_the_made_up_history_agrees_with_the_estimate(db, settings, speed):
    from clusters.demo_history import seed_demo_history
    from clusters.estimates import real_time_to_ready

    settings.RUNCRATE_SIM_SPEED = speed
    vm = machine_type_with_hosts(free=1, slug="vm8", machine_kind="vm", boot_seconds=180)
    drill = machine_type_with_hosts(
        free=1, slug="drill8", location=LocationFactory(code="drill-1", drill=True)
    )

    seed_demo_history(now=NOW, per_type=20)

    record = TrackRecord.objects.get(machine_type=vm)
    usual = real_time_to_ready(boot_seconds=180, software="none").total_seconds()
    assert record.ready_median_seconds is not None
    assert usual * 0.85 <= record.ready_median_seconds <= usual * 1.5 + 40
    assert not TrackRecord.objects.filter(machine_type=drill).exists()
