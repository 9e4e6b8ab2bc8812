"""The reservation skips hosts another transaction holds (`FOR UPDATE SKIP LOCKED`,
clusters/lifecycle/reserve.py `reserve_hosts`): a create takes the free hosts nobody holds
instead of waiting for the one that is held. Real PostgreSQL transactions: a second connection
holds a host's row locked while the create runs under a `lock_timeout`, so a create that waited
would fail instead of hanging the test."""

import threading
from collections.abc import Iterator
from contextlib import contextmanager

import pytest
from django.db import connection, transaction

from clusters.models import Cluster
from offers.models import Host
from tests.clusters.lifecycle_kit import Sim, create, free_hosts, inventory, new_project
from tests.conftest import postgres_only

pytestmark = [postgres_only, pytest.mark.postgres, pytest.mark.django_db(transaction=True)]


@contextmanager
def rows_held(host_ids: list[int]) -> Iterator[None]:
    """Another transaction, on its own connection, holds these hosts' rows locked (as a
    create racing this one does between its reservation and its commit)."""
    locked, release = threading.Event(), threading.Event()
    failed: list[BaseException] = []

    def hold() -> None:
        try:
            with transaction.atomic():
                held = list(Host.objects.select_for_update().filter(pk__in=host_ids))
                assert len(held) == len(host_ids)
                locked.set()
                assert release.wait(timeout=30), "the held rows were never released"
        except BaseException as error:  # noqa: BLE001 - reported by the test's thread
            failed.append(error)
            locked.set()
        finally:
            connection.close()

    holder = threading.Thread(target=hold, name="holder")
    holder.start()
    try:
        assert locked.wait(timeout=10), "the other transaction never locked the rows"
        assert not failed, failed
        yield
    finally:
        release.set()
        holder.join(timeout=30)
        assert not holder.is_alive()


@contextmanager
def lock_timeout(value: str) -> Iterator[None]:
    """This connection waits at most `value` for any row lock: a wait becomes an error."""
    with connection.cursor() as cursor:
        cursor.execute(f"SET lock_timeout = '{value}'")
    try:
        yield
    finally:
        with connection.cursor() as cursor:
            cursor.execute("RESET lock_timeout")


def hosts_of(cluster: Cluster) -> set[int]:
    return set(cluster.nodes.values_list("host_id", flat=True))


@pytest.mark.parametrize("held", [1, 2])
def test_a_create_takes_the_hosts_nobody_holds_instead_of_waiting(held):
    machine_type = inventory(hosts=4)
    _, project = new_project()
    pool = list(Host.objects.filter(machine_type=machine_type).order_by("pk"))
    # The first hosts in the reservation's order: a create that waited would wait on them.
    taken_by_other = [host.pk for host in pool[:held]]

    with Sim(), rows_held(taken_by_other), lock_timeout("2s"):
        cluster = create(project, machine_type, nodes=2, name="skips")

    assert hosts_of(cluster) == {host.pk for host in pool[held : held + 2]}
    assert not hosts_of(cluster) & set(taken_by_other)
    assert set(Host.objects.filter(pk__in=taken_by_other).values_list("state", flat=True)) == {
        Host.State.FREE
    }
    assert free_hosts(machine_type) == 2
