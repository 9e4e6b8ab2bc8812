"""A redis-server of the test's own on a free 127.0.0.1 port, to pause (SIGSTOP) and resume:
the shared Redis is never paused, stopped or pointed at by these tests."""

import os
import shutil
import signal
import socket
import subprocess
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import pytest

REDIS_SERVER = shutil.which("redis-server") or "/usr/bin/redis-server"
# What config/settings.py gives the cache; tests assert the settings match.
CACHE_OPTIONS = {"socket_connect_timeout": 1, "socket_timeout": 1}


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


@dataclass
class ThrowawayRedis:
    process: subprocess.Popen
    port: int

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}/0"

    def cache_settings(self, backend: str = "runcrate.cache.ForgivingRedisCache") -> dict:
        return {
            "BACKEND": backend,
            "LOCATION": self.url,
            "KEY_PREFIX": "throwaway",
            "OPTIONS": dict(CACHE_OPTIONS),
        }

    def pause(self) -> None:
        os.kill(self.process.pid, signal.SIGSTOP)

    def resume(self) -> None:
        os.kill(self.process.pid, signal.SIGCONT)

    @contextmanager
    def paused(self) -> Iterator[None]:
        self.pause()
        try:
            yield
        finally:
            self.resume()


def start(folder: Path) -> ThrowawayRedis:
    if not os.path.exists(REDIS_SERVER):
        pytest.fail("These tests need redis-server (apt-get install redis-server)")
    port = free_port()
    process = subprocess.Popen(
        [REDIS_SERVER, "--port", str(port), "--bind", "127.0.0.1", "--save", "", "--appendonly"]
        + ["no", "--dir", str(folder)],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:  # a bounded wait for it to take connections
        try:
            socket.create_connection(("127.0.0.1", port), timeout=0.2).close()
            return ThrowawayRedis(process=process, port=port)
        except OSError:
            time.sleep(0.05)
    process.kill()
    pytest.fail("the throwaway redis-server did not start within 10 s")


def stop(redis: ThrowawayRedis) -> None:
    redis.resume()  # a stopped process does not act on SIGTERM until continued
    redis.process.terminate()
    try:
        redis.process.wait(timeout=10)
    except subprocess.TimeoutExpired:
        redis.process.kill()
        redis.process.wait(timeout=10)


@pytest.fixture
def throwaway_redis(tmp_path) -> Iterator[ThrowawayRedis]:
    redis = start(tmp_path)
    try:
        yield redis
    finally:
        stop(redis)


@pytest.fixture
def cache_on_throwaway(settings, throwaway_redis, monkeypatch) -> ThrowawayRedis:
    """Django's cache on the throwaway server, as settings make it, without skipping after a
    failure (runcrate/cache.py SKIP_SECONDS): each call really asks the paused server."""
    monkeypatch.setattr("runcrate.cache.SKIP_SECONDS", 0.0)
    settings.CACHES = {"default": throwaway_redis.cache_settings()}
    return throwaway_redis
