"""Each pytest-xdist worker on things of its own (`make test` and `make test-fast` run two;
docs/testing.md), and the controller's scheduler that keeps the lab's modules on one of them.

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

Without xdist (one process) it changes nothing. Running xdist by hand: `.venv/bin/python -m
pytest -p tests.workers -n 2 --dist loadfile …`.
"""

import os
from pathlib import Path

from xdist.scheduler import LoadFileScheduling

from runcrate.env import redis_database
from tests.tiers import in_lab_module

ROOT = Path(__file__).resolve().parent.parent


def worker_environment(environ: dict[str, str], worker: str) -> dict[str, str]:
    """What `worker` (gw0, gw1…) sets in an environment that was `environ`."""
    number = int(worker.removeprefix("gw"))
    changes = {}
    for name in ("REDIS_URL", "REDIS_CACHE_URL"):
        if environ.get(name):
            changes[name] = redis_database(environ[name], 2 * number)
    var_dir = Path(environ.get("RUNCRATE_VAR_DIR") or ROOT / "var")
    changes["RUNCRATE_VAR_DIR"] = str(var_dir / f"xdist-{worker}")
    return changes


if worker := os.environ.get("PYTEST_XDIST_WORKER"):
    os.environ.update(worker_environment(dict(os.environ), worker))


class LabTogether(LoadFileScheduling):
    """--dist loadfile, except that the lab's modules (tests.tiers.in_lab_module) are one unit:
    one worker runs them one after another, on the one set of lab hosts, while the others
    share every other module, a module to a worker at a time."""

    LAB = "lab"

    def _split_scope(self, nodeid: str) -> str:
        return self.LAB if in_lab_module(nodeid) else super()._split_scope(nodeid)


def pytest_xdist_make_scheduler(config, log):
    """The controller's scheduler: LabTogether for --dist loadfile (make test, test-fast)."""
    if config.getvalue("dist") == "loadfile":
        return LabTogether(config, log)
    return None
