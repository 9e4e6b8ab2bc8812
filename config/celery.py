import os

from celery import Celery

import runcrate.broker  # noqa: F401 - registers the embedded broker's URL scheme

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "config.settings")

app = Celery("runcrate")
app.config_from_object("django.conf:settings", namespace="CELERY")
app.autodiscover_tasks()
