"""The estimated time to ready (docs/clusters.md "Time to ready"), before a cluster is created
and counted down while it starts; and what the balance covers on the create form."""

import re
from datetime import UTC, datetime, timedelta
from decimal import Decimal

import pytest
import time_machine

from clusters import estimates
from clusters.models import Cluster, Node
from tests.billing.conftest import bill_cluster
from tests.clusters.front import credit, machine_type_with_hosts, ssh_key
from tests.factories import ClusterFactory, MachineTypeFactory

NOW = datetime(2026, 3, 20, 12, 0, tzinfo=UTC)


@pytest.fixture(autouse=True)
def _frozen():
    with time_machine.travel(NOW, tick=False):
        yield


def squash(html: str) -> str:
    return " ".join(re.sub(r"<[^>]+>", " ", html).split())


# --- the estimate -------------------------------------------------------------------------


def test_it_estimates_boot_checks_and_install(settings):
    settings.RUNCRATE_SIM_SPEED = 1
    none, slurm = Cluster.Software.NONE, Cluster.Software.SLURM

    # 200 s to boot, half of that for the agents and the network, 180 s to install.
    assert estimates.time_to_ready(boot_seconds=200, software=none) == timedelta(seconds=300)
    assert estimates.time_to_ready(boot_seconds=200, software=slurm) == timedelta(seconds=480)
    assert estimates.time_to_ready(boot_seconds=600, software="ray") == timedelta(seconds=1080)


def test_the_demo_estimate_runs_as_fast_as_the_simulated_data_center(settings):
    settings.RUNCRATE_SIM_SPEED = 30

    assert estimates.time_to_ready(boot_seconds=200, software="slurm") == timedelta(seconds=16)


def test_it_counts_from_creation_then_from_the_install(db, settings):
    settings.RUNCRATE_SIM_SPEED = 1
    machine_type = MachineTypeFactory(boot_seconds=200)
    created = NOW - timedelta(minutes=2)
    cluster = ClusterFactory(
        machine_type=machine_type, software="kubernetes", created_at=created, machines=True
    )
    nodes = list(cluster.nodes.all())

    assert estimates.ready_by(cluster, nodes) == created + timedelta(seconds=480)

    cluster.status, cluster.joined_at = Cluster.Status.INSTALLING, NOW - timedelta(minutes=1)
    for node in nodes:
        node.step, node.step_started_at = Node.Step.INSTALL, NOW - timedelta(seconds=30)
    assert estimates.ready_by(cluster, nodes) == NOW + timedelta(seconds=150)

    cluster.status = Cluster.Status.READY
    assert estimates.ready_by(cluster, nodes) is None


# --- the cluster page -----------------------------------------------------------------------


def test_the_cluster_page_counts_down_to_the_estimate(owner, settings):
    settings.RUNCRATE_SIM_SPEED = 1
    machine_type = MachineTypeFactory(boot_seconds=200)
    cluster = ClusterFactory(
        project=owner.project,
        machine_type=machine_type,
        created_at=NOW - timedelta(seconds=50),
        machines=True,
    )
    late = ClusterFactory(
        project=owner.project,
        machine_type=machine_type,
        created_at=NOW - timedelta(seconds=301),
        machines=True,
    )

    html = owner.browser_client().get(f"/clusters/{cluster.pk}/").content.decode()
    late_html = owner.browser_client().get(f"/clusters/{late.pk}/").content.decode()
    poll = owner.browser_client().get(f"/clusters/{cluster.pk}/", headers={"HX-Request": "true"})

    countdown = (
        '<span data-deadline="2026-03-20T12:04:10.000+00:00" data-prefix="in about " '
        'data-suffix="" data-overdue="taking longer than estimated">in about 4m 10s</span>'
    )
    assert countdown in html
    assert countdown in poll.content.decode()  # the status section carries it
    assert "Ready not yet · taking longer than estimated (estimate)" in squash(late_html)
    assert "data-deadline" not in late_html.split('id="ready-estimate"')[1].split("</dd>")[0]


def test_a_ready_cluster_shows_no_estimate(owner):
    cluster = bill_cluster(owner.project, size=2, at=NOW - timedelta(hours=1))

    html = owner.browser_client().get(f"/clusters/{cluster.pk}/").content.decode()

    assert 'id="ready-estimate"' not in html


# --- the create form ------------------------------------------------------------------------


def new_form(owner, machine_type, nodes: int = 2) -> str:
    url = f"/clusters/new/?offer={machine_type.slug}&nodes={nodes}"
    return squash(owner.browser_client().get(url).content.decode())


def test_the_create_form_estimates_the_time_to_ready(owner, settings):
    settings.RUNCRATE_SIM_SPEED = 1
    machine_type = machine_type_with_hosts(free=2, boot_seconds=200)
    ssh_key(owner.project)

    page = new_form(owner, machine_type)

    assert (
        "Ready in about 5 min , or 8 min with Slurm, Kubernetes or Ray: an estimate from this "
        "machine type's boot time. If the machines have not all joined within 25 min, every one "
        "is released and nothing is billed." in page
    )


def test_the_create_form_says_how_long_the_balance_runs_the_cluster(owner, teammate):
    machine_type = machine_type_with_hosts(free=4, price_per_hour=Decimal("10.00"))
    credit(owner.project, "1234.50")

    alone = new_form(owner, machine_type, nodes=2)
    bill_cluster(owner.project, size=1, price="10.00", at=NOW - timedelta(minutes=1))
    beside = new_form(owner, machine_type, nodes=2)
    developer = new_form(teammate, machine_type, nodes=2)
    summary = owner.browser_client().get(
        f"/clusters/new/?offer={machine_type.slug}&nodes=3", headers={"HX-Request": "true"}
    )

    # $1,234.50 at $20.00/h: 61.7 h; beside the $10.00/h already running, at $30.00/h: 41.15 h.
    assert "Balance $1,234.50: it runs this cluster for about 2 days 13 h ." in alone
    assert (
        "Balance $1,234.50: it runs this cluster for about 2 days 13 h , or 41 h 9 min beside "
        "what already runs ($10.00/h)." in beside
    )
    # A developer does not see billing (SPEC §5): only that the balance covers the cluster.
    assert "The project's balance covers this cluster's first hour." in developer
    assert "1,234.50" not in developer and "$10.00/h)" not in developer
    # $30.00/h for three machines, $40.00/h beside what runs.
    assert "for about 41 h 9 min , or 30 h 51 min beside" in squash(summary.content.decode())


@pytest.mark.parametrize("amount", ["0.00", "5.00"])
def test_the_create_form_says_plainly_when_the_balance_cannot_start_it(owner, amount):
    machine_type = machine_type_with_hosts(free=4, price_per_hour=Decimal("10.00"))
    if amount != "0.00":
        credit(owner.project, amount)

    page = new_form(owner, machine_type, nodes=2)

    assert (
        f"Your balance is ${amount}: creating this cluster needs at least $20.00 (one hour of "
        "the whole cluster, and never less than $10.00)." in page
    )
    assert "runs this cluster for" not in page


def test_a_developer_is_told_the_balance_is_short_without_its_amount(owner, teammate):
    machine_type = machine_type_with_hosts(free=4, price_per_hour=Decimal("10.00"))
    credit(owner.project, "5.00")

    page = new_form(teammate, machine_type, nodes=2)

    assert (
        "The project's balance does not cover this cluster: creating it needs at least $20.00 "
        "there. Ask an owner or manager of the project to add credit." in page
    )
    assert "$5.00" not in page and "Your balance" not in page
