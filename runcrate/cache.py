"""The cache in front of Redis, forgiving when Redis is away.

Django's Redis backend raises when Redis does not answer, which turns a page that merely uses
the cache (a rate limit, the advance marker, the offers' cached counts) into an error page
while the database is fine. Here a cache that is down reads as a miss and a write that fails
is dropped, logged once a minute: what the cache holds is always safe to lose.

A hung Redis costs one socket timeout (settings: 1 s), not one per call: after a failure the
cache is skipped (every call answers as if it failed) for SKIP_SECONDS, so a request that asks
it five times waits once, not five times. All but `set_many`, the one write that must reach
Redis whenever it answers: an API key's forgotten marks (accounts/keys.py `forget_api_keys`),
whose failure is recorded in the database.
"""

from __future__ import annotations

import logging
import time
from typing import Any

from django.core.cache.backends.base import DEFAULT_TIMEOUT
from django.core.cache.backends.redis import RedisCache
from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import TimeoutError as RedisTimeoutError

log = logging.getLogger(__name__)

UNAVAILABLE = (RedisConnectionError, RedisTimeoutError, OSError)
_LOG_EVERY = 60.0
SKIP_SECONDS = 2.0


class Skipped(RedisConnectionError):
    """What a call made while the cache is skipped meets, instead of waiting for Redis."""


class ForgivingRedisCache(RedisCache):
    _last_logged = 0.0
    _skip_until = 0.0  # per cache object (one per thread), set by a failure

    def _check(self) -> None:
        if time.monotonic() < self._skip_until:
            raise Skipped("the cache failed lately: skipped for a moment")

    def _forgive(self, what: str, error: Exception, default: Any) -> Any:
        now = time.monotonic()
        if not isinstance(error, Skipped):
            self._skip_until = now + SKIP_SECONDS
        if now - ForgivingRedisCache._last_logged > _LOG_EVERY:
            ForgivingRedisCache._last_logged = now
            log.warning(
                "the cache is unavailable (%s failed: %s); carrying on without it", what, error
            )
        return default

    def get(self, key, default=None, version=None):
        try:
            self._check()
            return super().get(key, default, version)
        except UNAVAILABLE as error:
            return self._forgive("get", error, default)

    def get_many(self, keys, version=None):
        try:
            self._check()
            return super().get_many(keys, version)
        except UNAVAILABLE as error:
            return self._forgive("get_many", error, {})

    def add(self, key, value, timeout=DEFAULT_TIMEOUT, version=None):
        # A marker that cannot be kept is as good as one just taken: the caller goes ahead.
        try:
            self._check()
            return super().add(key, value, timeout, version)
        except UNAVAILABLE as error:
            return self._forgive("add", error, True)

    def set(self, key, value, timeout=DEFAULT_TIMEOUT, version=None):
        try:
            self._check()
            return super().set(key, value, timeout, version)
        except UNAVAILABLE as error:
            return self._forgive("set", error, None)

    def set_many(self, data, timeout=DEFAULT_TIMEOUT, version=None):
        try:  # never skipped: see the module's docstring
            return super().set_many(data, timeout, version)
        except UNAVAILABLE as error:
            return self._forgive("set_many", error, list(data))

    def delete(self, key, version=None):
        try:
            self._check()
            return super().delete(key, version)
        except UNAVAILABLE as error:
            return self._forgive("delete", error, False)

    def incr(self, key, delta=1, version=None):
        try:
            self._check()
            return super().incr(key, delta, version)
        except UNAVAILABLE as error:
            return self._forgive("incr", error, delta)
