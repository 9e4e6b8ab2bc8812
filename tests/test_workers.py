"""tests/workers.py: each pytest-xdist worker gets Redis databases, a var folder, lab hosts and
ids of its own, and one lab folder between them."""

from django.db import connection

from tests.clusters.lifecycle_kit import create, inventory, new_project
from tests.workers import (
    LAB_HOSTS_EACH,
    ROOT,
    SEQUENCE_STEP,
    lab_first_host,
    offset_sequences,
    worker_environment,
)


def test_a_worker_moves_redis_two_databases_a_worker_and_has_its_own_var_folder():
    environ = {"REDIS_URL": "redis://127.0.0.1:6379/2", "RUNCRATE_VAR_DIR": "/srv/var"}

    first = worker_environment(environ, "gw0")
    second = worker_environment(environ, "gw1")

    # The broker on REDIS_URL's database, the cache on the next: gw0 2 and 3, gw1 4 and 5.
    assert first["REDIS_URL"] == "redis://127.0.0.1:6379/2"
    assert second["REDIS_URL"] == "redis://127.0.0.1:6379/4"
    assert first["RUNCRATE_VAR_DIR"] == "/srv/var/xdist-gw0"
    assert second["RUNCRATE_VAR_DIR"] == "/srv/var/xdist-gw1"
    # One lab folder for all: where one process would have it.
    assert first["RUNCRATE_LAB_DIR"] == second["RUNCRATE_LAB_DIR"] == "/srv/var/lab"
    assert first.keys() == second.keys() == {"REDIS_URL", "RUNCRATE_VAR_DIR", "RUNCRATE_LAB_DIR"}


def test_a_cache_url_of_its_own_moves_too_and_sqlite_runs_get_a_var_folder_each():
    environ = {
        "REDIS_URL": "redis://127.0.0.1:6379/0",
        "REDIS_CACHE_URL": "redis://127.0.0.1:6379/8",
    }

    assert worker_environment(environ, "gw1") == {
        "REDIS_URL": "redis://127.0.0.1:6379/2",
        "REDIS_CACHE_URL": "redis://127.0.0.1:6379/10",
        "RUNCRATE_VAR_DIR": str(ROOT / "var" / "xdist-gw1"),
        "RUNCRATE_LAB_DIR": str(ROOT / "var" / "lab"),
    }
    assert worker_environment({"RUNCRATE_LAB_DIR": "/srv/lab"}, "gw0") == {
        "RUNCRATE_VAR_DIR": str(ROOT / "var" / "xdist-gw0"),
        "RUNCRATE_LAB_DIR": "/srv/lab",
    }


def test_each_worker_has_lab_hosts_of_its_own():
    assert lab_first_host(None) == lab_first_host("gw0") == 1
    assert lab_first_host("gw1") == 1 + LAB_HOSTS_EACH
    assert lab_first_host("gw2") == 1 + 2 * LAB_HOSTS_EACH


def test_a_workers_ids_start_at_its_own_million(db):
    machine_type = inventory(hosts=8)
    before = create(new_project()[1], machine_type, nodes=2)
    offset_sequences(connection, "gw0")  # nothing for the first
    assert create(new_project()[1], machine_type, nodes=2).pk == before.pk + 1

    offset_sequences(connection, "gw3")
    cluster = create(new_project()[1], machine_type, nodes=2)
    assert cluster.pk == 3 * SEQUENCE_STEP
    assert min(cluster.nodes.values_list("pk", flat=True)) == 3 * SEQUENCE_STEP
