"""`manage.py seed_demo`: the demo inventory and user, into an empty database only, with a ready
cluster and a month of history."""

from datetime import timedelta
from decimal import Decimal
from io import StringIO

import pytest
from django.core.management import call_command
from django.utils import timezone

from accounts.models import Environment, Membership, Project, SshKey, User
from billing.models import LedgerEntry, UsageRecord
from clusters.models import Cluster, Event, Node
from offers.models import GpuModel, Host, Location, MachineType
from tests.factories import GpuModelFactory, UserFactory

ROWS = (
    User,
    Project,
    Membership,
    Environment,
    SshKey,
    GpuModel,
    Location,
    MachineType,
    Host,
    Cluster,
    Node,
    Event,
    UsageRecord,
    LedgerEntry,
)


def snapshot() -> dict:
    return {model.__name__: list(model.objects.order_by("pk").values()) for model in ROWS}


@pytest.fixture(autouse=True)
def _debug_on(settings):
    # `make run` on a laptop: DEBUG is on (the test runner turns it off).
    settings.DEBUG = True


def seed() -> str:
    out = StringIO()
    call_command("seed_demo", stdout=out)
    return out.getvalue()


def test_it_seeds_an_empty_database_with_the_demo_inventory_and_user(db, client):
    output = seed()

    user = User.objects.get()
    assert user.email == "demo@runcrate.localhost"
    assert user.check_password("demo-gpus-2026")
    assert not user.is_staff
    membership = Membership.objects.select_related("project").get(user=user)
    assert membership.project.name == "Demo project"
    assert membership.role == Membership.Role.OWNER
    assert membership.project.environments.filter(name="default").exists()
    assert GpuModel.objects.filter(slug="h100-sxm").exists()
    assert Host.objects.count() >= 200
    assert "Demo login: demo@runcrate.localhost / demo-gpus-2026" in output
    assert "manage.py createsuperuser" in output
    assert client.login(username="demo@runcrate.localhost", password="demo-gpus-2026")


def test_it_leaves_a_database_with_users_alone(db):
    UserFactory(email="operator@example.com")
    before = snapshot()

    output = seed()

    assert snapshot() == before
    assert GpuModel.objects.count() == 0
    assert "left it alone" in output


def test_it_leaves_a_database_with_an_inventory_alone(db):
    GpuModelFactory(slug="mi300x", name="MI300X 192GB", memory_gib=192)
    before = snapshot()

    output = seed()

    assert snapshot() == before
    assert not User.objects.exists()
    assert "left it alone" in output


def test_it_changes_nothing_when_run_a_second_time(db):
    seed()
    before = snapshot()

    output = seed()

    assert snapshot() == before
    assert "left it alone" in output


def test_it_makes_no_demo_account_with_debug_off(db, settings, client):
    settings.DEBUG = False

    output = seed()

    assert not User.objects.exists() and not GpuModel.objects.exists()
    assert "DEBUG is off: seed_demo made no demo account" in output
    assert "demo-gpus-2026" not in output
    assert not client.login(username="demo@runcrate.localhost", password="demo-gpus-2026")


def test_it_gives_every_demo_offer_a_track_record_from_clusters_no_user_sees(db, settings):
    from offers.models import TrackRecord
    from offers.offers import list_offers

    seed()

    self_serve = MachineType.objects.filter(interconnect="ethernet")
    # Every one but the failure drills' (issue 37): a made-up record of clusters that started
    # where every host fails on purpose would say the opposite.
    drills = self_serve.filter(location__drill=True)
    assert list(drills.values_list("slug", flat=True)) == ["drill1-l40sx8-ctr"]
    assert not TrackRecord.objects.filter(machine_type__in=drills).exists()
    assert TrackRecord.objects.count() == self_serve.count() - 1
    assert all(r.clusters == 8 and r.ready_median_seconds for r in TrackRecord.objects.all())
    offers = list_offers(gpu="h100-sxm", nodes=2, include_community=True)
    assert offers and all(o.track_record is not None for o in offers)
    history = Project.objects.get(name="Demo history")
    assert not history.memberships.exists()
    assert not Cluster.objects.filter(project=history, status__in=Cluster.LIVE).exists()


def demo_project() -> Project:
    return Membership.objects.get(user__email="demo@runcrate.localhost").project


@pytest.mark.django_db(transaction=True)
def test_it_gives_the_demo_user_a_ready_cluster_billed_from_its_start():
    seed()

    project = demo_project()
    live = Cluster.objects.get(project=project, status=Cluster.Status.READY)
    nodes = list(live.nodes.order_by("index"))
    records = list(UsageRecord.objects.filter(cluster_id=live.pk).order_by("node_id"))
    assert (live.name, live.size, live.machine_type.slug) == ("llama-finetune", 2, "cac1-h100x2-vm")
    assert live.machine_type.location.code and all(n.status == Node.Status.JOINED for n in nodes)
    assert all(n.holds_host and n.host.driver == "simulated" for n in nodes)
    # Billed by billing's own rows, from the instant the lifecycle billed it.
    assert [r.node_id for r in records] == [n.pk for n in nodes]
    assert all(r.ended_at is None and r.started_at == live.joined_at for r in records)
    assert all(r.price_per_hour == live.machine_type.price_per_hour for r in records)
    assert live.events.filter(reason=Event.Reason.READY).exists()
    assert project.ssh_keys.count() == 1


@pytest.mark.django_db(transaction=True)
def test_it_gives_the_demo_user_a_month_of_history_with_usage_lines():
    seed()

    project = demo_project()
    ended = Cluster.objects.filter(project=project, status=Cluster.Status.TERMINATED)
    assert sorted(ended.values_list("name", flat=True)) == ["bert-sweep", "eval-h100"]
    month_ago = timezone.now() - timedelta(days=30)
    assert all(c.created_at > month_ago and c.ended_at < timezone.now() for c in ended)
    for cluster in ended:
        records = UsageRecord.objects.filter(cluster_id=cluster.pk)
        assert records.count() == cluster.size
        assert all(r.ended_at == cluster.ended_at == r.charged_until for r in records)
        assert cluster.events.filter(reason=Event.Reason.TERMINATED).exists()
    usage = LedgerEntry.objects.filter(project=project, kind=LedgerEntry.Kind.USAGE)
    # bert-sweep: 2 × $3.38 × 5 h; eval-h100: 2 × $4.98 × 3 h.
    assert sum(line.amount for line in usage) == -(Decimal("33.80") + Decimal("29.88"))
    credit = LedgerEntry.objects.get(project=project, kind=LedgerEntry.Kind.ADJUSTMENT)
    assert credit.amount == Decimal("500.00")
    project.refresh_from_db()
    assert Decimal("400") < project.balance < Decimal("440")


@pytest.mark.django_db(transaction=True)
def test_it_adds_nothing_the_second_time_with_a_live_cluster():
    seed()
    before = snapshot()

    output = seed()

    assert snapshot() == before
    assert "left it alone" in output
