"""Tasks reach a worker through the broker the settings choose: the embedded filesystem broker
when REDIS_URL is unset, Redis when it is set. Both run a real worker on threads."""

import threading
import uuid

import pytest
from celery import Celery
from celery.contrib.testing.worker import start_worker
from django.conf import settings
from django.db import connection

from config.celery import app as runcrate_app
from offers.models import GpuModel

pytestmark = pytest.mark.procs  # a real Celery worker


@pytest.fixture
def restore_current_app():
    """start_worker makes the app it runs the current and default one; put ours back."""
    yield
    runcrate_app.set_current()
    runcrate_app.set_default()


def _app_from(settings_module) -> Celery:
    app = Celery(f"embedded-{uuid.uuid4().hex[:8]}")
    app.config_from_object(settings_module, namespace="CELERY")
    app.conf.worker_hijack_root_logger = False
    return app


@pytest.mark.django_db(transaction=True)
def test_it_runs_a_database_task_through_the_embedded_broker_on_worker_threads(
    load_settings, tmp_path, restore_current_app
):
    embedded = load_settings()
    app = _app_from(embedded)
    done = threading.Event()

    @app.task(name="tests.runcrate.write_a_row")
    def write_a_row(slug: str) -> None:
        try:
            GpuModel.objects.create(slug=slug, name="Probe GPU", memory_gib=1)
        finally:
            connection.close()  # the worker thread's own connection to the test database
            done.set()

    with start_worker(app, pool="threads", concurrency=2, perform_ping_check=False):
        write_a_row.delay("probe-gpu")
        assert done.wait(timeout=20), "the worker never ran the task"

    assert GpuModel.objects.filter(slug="probe-gpu").exists()
    # The message went through files in the embedded broker's folder, and was taken from it.
    assert list((tmp_path / "var" / "broker" / "queue").iterdir()) == []


@pytest.mark.skipif(not settings.REDIS_URL, reason="needs Redis: set REDIS_URL")
def test_it_runs_a_task_through_redis(restore_current_app):
    assert runcrate_app.conf.broker_url == settings.REDIS_URL
    queue = f"test-roundtrip-{uuid.uuid4().hex}"  # no other worker on this Redis takes it
    received: list[str] = []
    done = threading.Event()

    @runcrate_app.task(name="tests.runcrate.roundtrip")
    def roundtrip(word: str) -> None:
        received.append(word)
        done.set()

    # The root logger is left alone for every test (tests/conftest.py).
    with start_worker(
        runcrate_app,
        pool="threads",
        concurrency=2,
        perform_ping_check=False,
        queues=[queue],
    ):
        roundtrip.apply_async(("hello",), queue=queue)
        assert done.wait(timeout=20), "the worker never ran the task"

    assert received == ["hello"]
