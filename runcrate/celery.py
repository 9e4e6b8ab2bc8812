import os

from celery import Celery

import runcrate.broker  # noqa: F401 - registers the embedded broker's URL scheme

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "runcrate.settings")

app = Celery("runcrate")
app.config_from_object("django.conf:settings", namespace="CELERY")
app.autodiscover_tasks()


@app.on_after_configure.connect
def add_machines_heartbeat(sender: Celery, **kwargs) -> None:
    """The `machines` queue's heartbeat (clusters.tasks.machines_heartbeat), as often as the
    tick, on that queue. A message that waited ten periods is dropped: the next one says more."""
    from django.conf import settings

    every = settings.RUNCRATE_TICK_SECONDS
    sender.add_periodic_task(
        every,
        sender.signature(
            "clusters.tasks.machines_heartbeat",
            options={"queue": "machines", "expires": 10 * every},
        ),
        name="machines-heartbeat",
    )
