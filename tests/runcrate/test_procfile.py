"""The Procfile, read as honcho reads it: the web server, a worker for every queue the settings
route tasks to, and exactly one beat."""

import shlex
from pathlib import Path

import pytest
from django.conf import settings
from honcho.environ import parse_procfile

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture
def processes() -> dict[str, list[str]]:
    procfile = parse_procfile((ROOT / "Procfile").read_text())
    return {name: shlex.split(command) for name, command in procfile.processes.items()}


def _queues(argv: list[str]) -> set[str]:
    for index, arg in enumerate(argv):
        if arg in ("-Q", "--queues"):
            return set(argv[index + 1].split(","))
        if arg.startswith("--queues="):
            return set(arg.removeprefix("--queues=").split(","))
    return set()


def _workers(processes: dict[str, list[str]]) -> dict[str, list[str]]:
    return {name: argv for name, argv in processes.items() if argv[:1] == ["celery"]}


def test_it_names_web_then_the_workers_and_beat(processes):
    # Web first: honcho gives the first process $PORT, the others $PORT + 100, + 200, …
    assert list(processes) == ["web", "worker", "machines", "releases", "logs", "notify", "beat"]
    assert processes["web"][:2] == ["gunicorn", "config.wsgi"]


def test_its_workers_consume_every_queue_the_settings_route_to(processes):
    declared = {queue.name for queue in settings.CELERY_TASK_QUEUES}
    routed = {route["queue"] for route in settings.CELERY_TASK_ROUTES.values()}
    routed.add(settings.CELERY_TASK_DEFAULT_QUEUE)
    workers = {
        name: _queues(argv) for name, argv in _workers(processes).items() if "worker" in argv
    }

    assert workers == {
        "worker": {"celery"},
        "machines": {"machines"},
        "releases": {"releases"},
        "logs": {"logs"},
        "notify": {"notifications"},
    }
    consumed = set().union(*workers.values())
    assert routed <= declared
    assert consumed == declared
    # Each queue has its own worker, so slow machine work never waits in front of `advance`.
    assert sum(len(queues) for queues in workers.values()) == len(consumed)


def test_it_runs_exactly_one_beat(processes):
    beats = [name for name, argv in _workers(processes).items() if "beat" in argv]
    embedded = [name for name, argv in processes.items() if "-B" in argv or "--beat" in argv]

    assert beats == ["beat"]
    assert embedded == []


def test_its_machines_worker_runs_threads(processes):
    argv = processes["machines"]

    assert "--pool=threads" in argv


def test_its_releases_worker_runs_processes_as_many_as_the_setting(processes):
    # No --concurrency of its own: config/celery.py gives the worker of the `releases` queue
    # RUNCRATE_RELEASE_CONCURRENCY processes (tests/clusters/test_releases.py starts it).
    argv = processes["releases"]

    assert "--pool=prefork" in argv
    assert not [arg for arg in argv if arg.startswith(("--concurrency", "-c"))]
