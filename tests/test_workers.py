"""tests/workers.py: each pytest-xdist worker gets Redis databases and a var folder of its own."""

from tests.workers import ROOT, worker_environment


def test_a_worker_moves_redis_two_databases_a_worker_and_has_its_own_var_folder():
    environ = {"REDIS_URL": "redis://127.0.0.1:6379/2", "RUNCRATE_VAR_DIR": "/srv/var"}

    first = worker_environment(environ, "gw0")
    second = worker_environment(environ, "gw1")

    # The broker on REDIS_URL's database, the cache on the next: gw0 2 and 3, gw1 4 and 5.
    assert first["REDIS_URL"] == "redis://127.0.0.1:6379/2"
    assert second["REDIS_URL"] == "redis://127.0.0.1:6379/4"
    assert first["RUNCRATE_VAR_DIR"] == "/srv/var/xdist-gw0"
    assert second["RUNCRATE_VAR_DIR"] == "/srv/var/xdist-gw1"
    assert first.keys() == second.keys() == {"REDIS_URL", "RUNCRATE_VAR_DIR"}


def test_a_cache_url_of_its_own_moves_too_and_sqlite_runs_get_a_var_folder_each():
    environ = {
        "REDIS_URL": "redis://127.0.0.1:6379/0",
        "REDIS_CACHE_URL": "redis://127.0.0.1:6379/8",
    }

    assert worker_environment(environ, "gw1") == {
        "REDIS_URL": "redis://127.0.0.1:6379/2",
        "REDIS_CACHE_URL": "redis://127.0.0.1:6379/10",
        "RUNCRATE_VAR_DIR": str(ROOT / "var" / "xdist-gw1"),
    }
    assert worker_environment({}, "gw0") == {"RUNCRATE_VAR_DIR": str(ROOT / "var" / "xdist-gw0")}
