import os
from typing import Any

from celery import Celery
from celery.signals import celeryd_init

import runcrate.broker  # noqa: F401 - registers the embedded broker's URL scheme

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "config.settings")

app = Celery("runcrate")
app.config_from_object("django.conf:settings", namespace="CELERY")
app.autodiscover_tasks()


# How much less of the machine's CPU a worker of the `releases` queue alone (and every process
# of its pool) asks for than the other workers: a release is background work, and a live
# cluster's step or a page on the same machine goes first (docs/architecture.md).
RELEASES_NICENESS = 10


@celeryd_init.connect
def releases_worker_concurrency(conf: Any, options: dict, **kwargs: Any) -> None:
    """A worker of the `releases` queue alone runs at RELEASES_NICENESS; started without
    --concurrency (the Procfile's, `make run`'s) it runs RUNCRATE_RELEASE_CONCURRENCY
    processes: that setting bounds how many hosts are released at once (docs/lifecycle.md,
    "Ending"). Processes, not threads: a release is mostly paramiko's Python (each SFTP
    packet), and eight of them on the threads of one process took 6.3-7.0 s where eight
    processes took 4.4-5.0 (docs/lab.md)."""
    from django.conf import settings

    queues = options.get("queues") or []
    if isinstance(queues, str):
        queues = queues.split(",")
    if set(queues) != {"releases"}:
        return
    os.nice(RELEASES_NICENESS)  # before the pool forks: its processes inherit it
    if not options.get("concurrency"):
        conf.worker_concurrency = settings.RUNCRATE_RELEASE_CONCURRENCY
