"""Creating a cluster (SPEC §2): every refusal, in order, with nothing reserved or written; the
reservation all or none; and, on PostgreSQL, 20 requests racing for too few machines."""

import threading
import time
from datetime import timedelta
from decimal import Decimal

import pytest
from django.db import connection

from accounts.models import SshKey
from billing import budgets
from billing.models import UsageRecord
from clusters import lifecycle
from clusters.errors import ClusterRefused
from clusters.models import Cluster, Event, Node
from offers.models import Host, Location, MachineType
from tests.clusters.lifecycle_kit import (
    Sim,
    create,
    environment_of,
    free_hosts,
    inventory,
    new_project,
)
from tests.conftest import postgres_only
from tests.factories import ClusterFactory


@pytest.fixture(autouse=True)
def _no_workers():
    # Creating enqueues `advance`; these tests look at what creation itself wrote.
    with Sim():
        yield


def refused(project, machine_type, **request) -> ClusterRefused:
    hosts_before = free_hosts(machine_type)
    counts_before = (Cluster.objects.count(), Node.objects.count(), Event.objects.count())
    with pytest.raises(ClusterRefused) as caught:
        create(project, machine_type, **request)
    assert free_hosts(machine_type) == hosts_before
    assert (Cluster.objects.count(), Node.objects.count(), Event.objects.count()) == counts_before
    return caught.value


def test_it_creates_the_cluster_with_its_nodes_hosts_and_an_event(person):
    user, project = person
    machine_type = inventory(hosts=5)
    cluster = create(project, machine_type, nodes=4, name="train", user=user, software="slurm")

    assert cluster.status == Cluster.Status.PROVISIONING
    assert (cluster.size, cluster.software, cluster.created_by) == (4, "slurm", user)
    assert cluster.give_up_at == cluster.created_at + timedelta(minutes=25)
    nodes = list(cluster.nodes.order_by("index"))
    assert [(n.name, n.private_ip) for n in nodes] == [
        ("node-0", "10.77.0.1"),
        ("node-1", "10.77.0.2"),
        ("node-2", "10.77.0.3"),
        ("node-3", "10.77.0.4"),
    ]
    assert len({n.host_id for n in nodes}) == 4
    assert all(n.holds_host and n.step == Node.Step.RUNNING for n in nodes)
    assert Host.objects.filter(nodes__cluster=cluster, state="reserved").count() == 4
    assert free_hosts(machine_type) == 1
    assert cluster.events.get().reason == "created"
    assert "4 machines reserved" in cluster.events.get().message


def test_it_installs_every_project_key_by_default_or_the_chosen_ones(db):
    _, project = new_project(keys=2)
    machine_type = inventory(hosts=4)
    keys = list(SshKey.objects.filter(project=project).order_by("pk"))

    every = create(project, machine_type)
    chosen = create(project, machine_type, ssh_key_ids=[keys[1].pk])

    assert set(every.ssh_keys.all()) == set(keys)
    assert every.authorized_keys.count("ssh-ed25519") == 2
    assert list(chosen.ssh_keys.all()) == [keys[1]]
    assert chosen.authorized_keys.strip() == keys[1].public_key


@pytest.mark.parametrize(
    ("nodes", "said"),
    [
        (1, "A cluster has at least 2 machines"),
        (65, "2 to 64"),
        (0, "A cluster has at least 2 machines"),
        ("3", "2 to 64"),
        (2.0, "2 to 64"),
        (True, "2 to 64"),
    ],
)
def test_it_refuses_a_size_outside_2_to_64(person, nodes, said):
    error = refused(person[1], inventory(hosts=4), nodes=nodes)
    assert error.code == "invalid_nodes"
    assert said in error.message and error.field == "nodes"


def test_it_refuses_an_unknown_or_quoted_offer(person):
    _, project = person
    machine_type = inventory(hosts=4)
    with pytest.raises(ClusterRefused) as unknown:
        lifecycle.create_cluster(
            project=project,
            user=None,
            environment=environment_of(project),
            offer_slug="no-such-offer",
            nodes=2,
            name="x",
            software="none",
        )
    assert unknown.value.code == "unknown_offer"
    MachineType.objects.filter(pk=machine_type.pk).update(interconnect="infiniband")
    assert refused(project, machine_type).code == "unknown_offer"


def test_it_refuses_more_machines_than_are_free(person):
    error = refused(person[1], inventory(hosts=3), nodes=4)
    assert error.code == "not_enough_machines"
    assert "only 3 are free" in error.message


def test_it_refuses_more_than_8_at_a_location_that_only_says_yes_or_no(person):
    machine_type = inventory(hosts=12, capacity=Location.CapacityReporting.BOOLEAN)
    error = refused(person[1], machine_type, nodes=9)
    assert error.code == "invalid_nodes"
    assert "request a quote" in error.message


def test_it_refuses_a_yes_or_no_offer_that_turns_out_short_and_reserves_nothing(person):
    machine_type = inventory(hosts=3, capacity=Location.CapacityReporting.BOOLEAN)
    error = refused(person[1], machine_type, nodes=5)  # the offer said "available"
    assert error.code == "not_enough_machines"
    assert "Only 3 machines" in error.message
    assert free_hosts(machine_type) == 3


@pytest.mark.parametrize("name", ["Train", "-train", "train-", "tr_ain", "", "a" * 64, "trä"])
def test_it_refuses_a_name_that_is_not_a_dns_label(person, name):
    error = refused(person[1], inventory(hosts=2), name=name)
    assert error.code == "invalid_name" and error.field == "name"


def test_it_refuses_the_name_of_a_live_cluster_in_the_environment_only(person):
    _, project = person
    machine_type = inventory(hosts=4)
    create(project, machine_type, name="train")
    assert refused(project, machine_type, name="train").code == "name_taken"

    other_project = new_project()[1]
    assert create(other_project, machine_type, name="train").name == "train"
    ClusterFactory(project=project, name="old", status=Cluster.Status.FAILED)
    assert create(project, inventory(hosts=2), name="old").name == "old"


def test_it_refuses_software_the_offer_does_not_run(person):
    _, project = person
    containers = inventory(hosts=2, kind=MachineType.Kind.CONTAINER)
    error = refused(project, containers, software="kubernetes")
    assert error.code == "software_not_offered"
    assert "containers" in error.message
    assert refused(project, containers, software="windows").code == "software_not_offered"
    assert create(project, containers, software="ray").software == "ray"


def test_it_refuses_without_any_ssh_key(db):
    _, project = new_project(keys=0)
    error = refused(project, inventory(hosts=2))
    assert error.code == "no_ssh_keys"
    _, with_keys = new_project()
    assert refused(with_keys, inventory(hosts=2), ssh_key_ids=[]).code == "no_ssh_keys"


def test_it_refuses_another_projects_ssh_key(person):
    _, project = person
    _, other = new_project()
    theirs = SshKey.objects.get(project=other)
    error = refused(project, inventory(hosts=2), ssh_key_ids=[theirs.pk])
    assert error.code == "unknown_ssh_key"
    assert str(theirs.pk) in error.message


def test_it_refuses_a_balance_under_one_hour_of_the_whole_cluster(db):
    _, project = new_project(balance="4.00")
    machine_type = inventory(hosts=2, price="23.92")
    error = refused(project, machine_type)
    assert error.code == "insufficient_balance"
    assert error.message == (
        "Your balance is $4.00; creating this cluster needs at least $47.84 (one hour of the "
        "whole cluster; never less than $10.00)."
    )


def test_it_refuses_a_balance_under_the_minimum_even_for_a_cheap_cluster(db):
    _, project = new_project(balance="9.99")
    error = refused(project, inventory(hosts=2, price="1.00"))
    assert error.code == "insufficient_balance"
    assert "needs at least $10.00" in error.message
    _, enough = new_project(balance="10.00")
    assert create(enough, inventory(hosts=2, price="1.00")).pk


def test_it_refuses_when_the_environment_reached_its_monthly_budget(person, monkeypatch):
    # The month-to-date spend is billing's to compute (billing/budgets.py); this is the rule
    # creation applies to it.
    _, project = person
    environment = environment_of(project)
    environment.monthly_budget = Decimal("100.00")
    environment.save()
    spent = {"amount": Decimal("99.99")}
    asked = []

    def month_to_date_spend(*, environment, now=None):
        asked.append(environment)
        return spent["amount"]

    monkeypatch.setattr(budgets, "month_to_date_spend", month_to_date_spend)
    machine_type = inventory(hosts=4)
    assert create(project, machine_type).pk  # $99.99 of $100.00 spent: still allowed
    assert asked == [environment]

    spent["amount"] = Decimal("100.00")
    error = refused(project, machine_type)
    assert error.code == "budget_reached"
    assert "spent $100.00 this month, its whole monthly budget of $100.00" in error.message

    environment.monthly_budget = None  # no budget: never refused for it
    environment.save()
    assert create(project, machine_type).pk


def test_it_checks_in_the_documented_order(db):
    _, project = new_project(balance="0", keys=0)
    containers = inventory(hosts=2, kind=MachineType.Kind.CONTAINER)
    bad = {"name": "Bad Name", "software": "kubernetes"}
    assert refused(project, containers, nodes=1, **bad).code == "invalid_nodes"
    assert refused(project, containers, nodes=3, **bad).code == "not_enough_machines"
    assert refused(project, containers, **bad).code == "invalid_name"
    assert refused(project, containers, software="kubernetes").code == "software_not_offered"
    assert refused(project, containers).code == "no_ssh_keys"


def test_it_refuses_an_environment_of_another_project(person):
    _, project = person
    _, other = new_project()
    with pytest.raises(ClusterRefused) as caught:
        lifecycle.create_cluster(
            project=project,
            user=None,
            environment=environment_of(other),
            offer_slug=inventory(hosts=2).slug,
            nodes=2,
            name="x",
            software="none",
        )
    assert caught.value.code == "unknown_environment"


# --- racing for the last machines --------------------------------------------------------


@postgres_only
@pytest.mark.django_db(transaction=True)
def test_it_never_oversells_hosts_to_20_racing_requests():
    pool, size, requests = 30, 4, 20
    machine_type = inventory(hosts=pool)
    projects = [new_project()[1] for _ in range(requests)]
    barrier = threading.Barrier(requests)
    outcomes: dict[int, object] = {}

    def request(i: int) -> None:
        try:
            barrier.wait()
            outcomes[i] = create(projects[i], machine_type, nodes=size, name=f"race-{i}")
        except ClusterRefused as error:
            outcomes[i] = error
        finally:
            connection.close()

    with Sim():
        threads = [threading.Thread(target=request, args=(i,)) for i in range(requests)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()

    won = [o for o in outcomes.values() if isinstance(o, Cluster)]
    lost = [o for o in outcomes.values() if isinstance(o, ClusterRefused)]
    assert len(won) + len(lost) == requests
    # Exactly as many as the pool holds: none oversold, and no request refused while enough
    # hosts were still free (what SKIP LOCKED alone would allow).
    assert len(won) == pool // size
    assert {e.code for e in lost} == {"not_enough_machines"}
    # every winner holds exactly its own hosts; every loser holds none
    held = list(Node.objects.filter(holds_host=True).values_list("host_id", flat=True))
    assert len(held) == len(set(held)) == size * len(won)
    for cluster in won:
        assert cluster.nodes.count() == size
    assert Cluster.objects.count() == len(won)
    assert Host.objects.filter(state="reserved").count() == size * len(won)
    assert free_hosts(machine_type) == pool - size * len(won)


# --- a budget set while creates are in flight ----------------------------------------------


def _waiting_for_a_lock(count: int, *, timeout: float = 10.0) -> bool:
    """Whether `count` other connections of this database wait on a lock, polled (bounded)."""
    with connection.cursor() as cursor:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            cursor.execute(
                "SELECT count(*) FROM pg_stat_activity WHERE datname = current_database() "
                "AND wait_event_type = 'Lock' AND pid <> pg_backend_pid()"
            )
            if cursor.fetchone()[0] >= count:
                return True
            time.sleep(0.02)
    return False


@postgres_only
@pytest.mark.django_db(transaction=True)
def test_a_zero_budget_set_while_creates_are_in_flight_leaves_no_cluster_billed(monkeypatch):
    # The first create holds its transaction open inside (its cluster not committed yet) while
    # a 0.00 budget is set and a second create starts. The budget change waits for the first
    # and lists its cluster in `stopping`; whichever of the budget change and the second create
    # gets the environment next, the second is listed too or refused `budget_reached`. The
    # meter's stop then ends every cluster before any machine of it is billed.
    from clusters.lifecycle import reserve, stops

    machine_type = inventory(hosts=8)
    _, project = new_project()
    environment = environment_of(project)
    first_inside, release = threading.Event(), threading.Event()
    original = reserve.require_key_limits

    def held_open(**kwargs):
        if threading.current_thread().name == "first":
            first_inside.set()
            assert release.wait(timeout=20), "the first create was never released"
        return original(**kwargs)

    monkeypatch.setattr(reserve, "require_key_limits", held_open)
    outcomes: dict[str, object] = {}

    def run(name: str, work) -> threading.Thread:
        def target() -> None:
            try:
                outcomes[name] = work()
            except Exception as error:  # noqa: BLE001 - the test asserts what each got
                outcomes[name] = error
            finally:
                connection.close()

        thread = threading.Thread(target=target, name=name)
        thread.start()
        return thread

    with Sim():
        threads = [run("first", lambda: create(project, machine_type, name="first"))]
        assert first_inside.wait(timeout=20), "the first create never got inside"
        threads.append(
            run(
                "budget",
                lambda: budgets.set_budget(
                    environment=environment, amount=Decimal("0.00"), confirm=True
                ),
            )
        )
        assert _waiting_for_a_lock(1), "the budget change did not wait for the create"
        threads.append(run("second", lambda: create(project, machine_type, name="second")))
        assert _waiting_for_a_lock(2), "the second create did not wait for the environment"
        release.set()
        for thread in threads:
            thread.join(timeout=30)
            assert not thread.is_alive()

    assert isinstance(outcomes["first"], Cluster)
    stopping = {cluster.name for cluster in outcomes["budget"].clusters}
    second = outcomes["second"]
    if isinstance(second, Cluster):
        assert stopping == {"first", "second"}
    else:
        assert isinstance(second, ClusterRefused) and second.code == "budget_reached"
        assert stopping == {"first"}
    created = set(Cluster.objects.filter(environment=environment).values_list("name", flat=True))
    assert created == stopping  # every cluster there is one the budget change answered

    assert set(stops.enforce_limits().stopped_for_budget) == set(
        Cluster.objects.filter(environment=environment).values_list("pk", flat=True)
    )
    assert not UsageRecord.objects.filter(cluster__environment=environment).exists()
    assert set(
        Cluster.objects.filter(environment=environment).values_list("status", "stop_reason")
    ) == {(Cluster.Status.TERMINATING, Cluster.StopReason.BUDGET)}


def test_an_ssh_host_without_a_baseline_is_never_offered_nor_reserved(person):
    from django.utils import timezone

    from offers.offers import get_offer
    from tests.factories import HostFactory

    machine_type = inventory(hosts=1)
    waiting = HostFactory.create_batch(3, machine_type=machine_type, driver=Host.Driver.SSH)
    ready = HostFactory(
        machine_type=machine_type,
        driver=Host.Driver.SSH,
        baseline={"version": 2},
        baseline_at=timezone.now(),
    )

    offer = get_offer(slug=machine_type.slug, nodes=2)
    assert offer is not None
    assert offer.nodes_available == 2  # the simulated host and the one with a baseline
    error = refused(person[1], machine_type, nodes=3)
    assert error.code == "not_enough_machines"
    assert "only 2 are free" in error.message

    cluster = create(person[1], machine_type, nodes=2)
    taken = set(Node.objects.filter(cluster=cluster).values_list("host_id", flat=True))
    assert ready.pk in taken
    assert taken.isdisjoint(h.pk for h in waiting)
    assert all(
        h.state == Host.State.FREE for h in Host.objects.filter(pk__in=[h.pk for h in waiting])
    )
