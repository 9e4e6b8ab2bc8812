import os
from typing import Any

from celery import Celery
from celery.signals import celeryd_init

import runcrate.broker  # noqa: F401 - registers the embedded broker's URL scheme

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "config.settings")

app = Celery("runcrate")
app.config_from_object("django.conf:settings", namespace="CELERY")
app.autodiscover_tasks()


@celeryd_init.connect
def releases_worker_threads(conf: Any, options: dict, **kwargs: Any) -> None:
    """A worker of the `releases` queue alone started without --concurrency (the Procfile's,
    `make run`'s) runs RUNCRATE_RELEASE_CONCURRENCY threads: that setting bounds how many hosts
    are released at once (docs/lifecycle.md, "Ending")."""
    from django.conf import settings

    queues = options.get("queues") or []
    if isinstance(queues, str):
        queues = queues.split(",")
    if set(queues) == {"releases"} and not options.get("concurrency"):
        conf.worker_concurrency = settings.RUNCRATE_RELEASE_CONCURRENCY
