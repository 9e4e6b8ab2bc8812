"""Each pytest-xdist worker on things of its own (`make test` and `make test-fast` run two;
docs/testing.md), and the controller's care of the lab they share.

pytest-django gives each worker its own test database (test_<name>_gw0, _gw1…). What the
settings read from the environment this plugin gives each worker before Django reads it: it is
loaded with `-p tests.workers` (the make targets' command line, which xdist hands its workers),
before pytest-django sets Django up. `python -m pytest` puts the checkout on the path it is
imported from (the `pytest` script alone would not find it):

- REDIS_URL moved 2n databases on for worker gwN (the broker on it, the cache on the next one,
  as config/settings.py does), so workers never flush or take each other's queued tasks or
  cached keys: REDIS_URL=redis://…/0 gives gw0 databases 0 and 1, gw1 2 and 3. REDIS_CACHE_URL,
  where set, moves the same way.
- RUNCRATE_VAR_DIR (or the checkout's var/) with xdist-gwN under it: the SQLite database, the
  file broker and cache, mail, the operator's SSH key of that worker.
- RUNCRATE_LAB_DIR: the one lab of the machine, where it would be without xdist (the var
  folder's lab/): every worker runs lab modules, each on GPU hosts of its own
  (`lab_first_host`), all of them beside one gateway and one storage host.
- Its database's sequences start at N million (`offset_sequences`, tests/conftest.py): what a
  lab host shared between workers is given by id (the gateway's jump user c<cluster id>, the
  storage host's v<volume id> folders) is never the same for two workers.

Without xdist (one process) it changes nothing. Running xdist by hand: `.venv/bin/python -m
pytest -p tests.workers -n 2 --dist loadfile …`.
"""

import os
from pathlib import Path

import pytest

from lab import hostlab
from runcrate.env import redis_database

ROOT = Path(__file__).resolve().parent.parent


def worker_environment(environ: dict[str, str], worker: str) -> dict[str, str]:
    """What `worker` (gw0, gw1…) sets in an environment that was `environ`."""
    number = worker_number(worker)
    changes = {}
    for name in ("REDIS_URL", "REDIS_CACHE_URL"):
        if environ.get(name):
            changes[name] = redis_database(environ[name], 2 * number)
    var_dir = Path(environ.get("RUNCRATE_VAR_DIR") or ROOT / "var")
    changes["RUNCRATE_VAR_DIR"] = str(var_dir / f"xdist-{worker}")
    changes["RUNCRATE_LAB_DIR"] = environ.get("RUNCRATE_LAB_DIR") or str(var_dir / "lab")
    return changes


LAB_HOSTS_EACH = 20  # lab-1..lab-20 for gw0 (one process too), lab-21..lab-40 for gw1, ...


def worker_number(worker: str | None) -> int:
    """gwN's N; 0 without xdist."""
    return int(worker.removeprefix("gw")) if worker else 0


def lab_first_host(worker: str | None) -> int:
    """The first of the lab's GPU hosts that `worker` (gwN, or None in one process) uses: each
    worker has LAB_HOSTS_EACH of its own, so two run lab tests at once."""
    return 1 + LAB_HOSTS_EACH * worker_number(worker)


if worker := os.environ.get("PYTEST_XDIST_WORKER"):
    os.environ.update(worker_environment(dict(os.environ), worker))


SEQUENCE_STEP = 1_000_000


def offset_sequences(connection, worker: str | None) -> None:
    """Start every id sequence of `connection`'s database at N million for worker gwN (nothing
    for gw0 or one process): workers share the lab's gateway and storage host, which name what
    they hold by id."""
    start = SEQUENCE_STEP * worker_number(worker)
    if not start:
        return
    with connection.cursor() as cursor:
        if connection.vendor == "postgresql":
            cursor.execute(
                "SELECT sequencename FROM pg_sequences WHERE schemaname = current_schema()"
            )
            for (sequence,) in cursor.fetchall():
                cursor.execute("SELECT setval(%s, %s, false)", [sequence, start])
        elif connection.vendor == "sqlite":
            for table in connection.introspection.table_names(cursor):
                cursor.execute("DELETE FROM sqlite_sequence WHERE name = %s", [table])
                cursor.execute(
                    "INSERT INTO sqlite_sequence (name, seq) VALUES (%s, %s)", [table, start - 1]
                )


class LabLeftAsFound:
    """In the pytest-xdist controller: a lab that was down when the run began is taken down at
    its end, once every worker is done (a worker cannot know that the others are)."""

    def __init__(self) -> None:
        self.was_up = hostlab.current() is not None

    @pytest.hookimpl(trylast=True)  # after xdist's own, which ends the workers' processes
    def pytest_sessionfinish(self) -> None:
        if self.was_up or hostlab.current() is None or hostlab.unavailable_reason():
            return
        if not hostlab.others_using():
            hostlab.down()


def pytest_configure(config: pytest.Config) -> None:
    if config.getvalue("dist") != "no" and not hasattr(config, "workerinput"):
        config.pluginmanager.register(LabLeftAsFound(), "runcrate-lab-left-as-found")
