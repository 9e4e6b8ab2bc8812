"""Each pytest-xdist worker on things of its own (`make test-fast` runs two; docs/testing.md).

pytest-django gives each worker its own test database (test_<name>_gw0, _gw1…). What the
settings read from the environment this plugin gives each worker before Django reads it: it is
loaded with `-p tests.workers` (make test-fast's command line, which xdist hands its workers),
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

from runcrate.env import redis_database

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
