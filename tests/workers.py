"""Each pytest-xdist worker on things of its own (`make test-fast` runs two; docs/testing.md).

pytest-django gives each worker its own test database (test_<name>_gw0, _gw1…). What the
settings read from the environment this plugin gives each worker before Django reads it (the
plugin is loaded with `-p` from pyproject.toml's addopts, before pytest-django sets Django up):

- REDIS_URL moved 2n databases on for worker gwN (the broker on it, the cache on the next one,
  as config/settings.py does), so workers never flush or take each other's queued tasks or
  cached keys: REDIS_URL=redis://…/0 gives gw0 databases 0 and 1, gw1 2 and 3. REDIS_CACHE_URL,
  where set, moves the same way.
- RUNCRATE_VAR_DIR (or the checkout's var/) with xdist-gwN under it: the SQLite database, the
  file broker and cache, mail, the operator's SSH key of that worker.

Without xdist (`make test`, one process) it changes nothing.
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
