"""The cache in front of Redis, forgiving when Redis is away.

Django's Redis backend raises when Redis does not answer, which turns a page that merely uses
the cache (a rate limit, the advance marker, the offers' cached counts) into an error page
while the database is fine. Here a cache that is down reads as a miss and a write that fails
is dropped, logged once a minute: what the cache holds is always safe to lose.
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


class ForgivingRedisCache(RedisCache):
    _last_logged = 0.0

    def _forgive(self, what: str, error: Exception, default: Any) -> Any:
        now = time.monotonic()
        if now - ForgivingRedisCache._last_logged > _LOG_EVERY:
            ForgivingRedisCache._last_logged = now
            log.warning(
                "the cache is unavailable (%s failed: %s); carrying on without it", what, error
            )
        return default

    def get(self, key, default=None, version=None):
        try:
            return super().get(key, default, version)
        except UNAVAILABLE as error:
            return self._forgive("get", error, default)

    def get_many(self, keys, version=None):
        try:
            return super().get_many(keys, version)
        except UNAVAILABLE as error:
            return self._forgive("get_many", error, {})

    def add(self, key, value, timeout=DEFAULT_TIMEOUT, version=None):
        # A marker that cannot be kept is as good as one just taken: the caller goes ahead.
        try:
            return super().add(key, value, timeout, version)
        except UNAVAILABLE as error:
            return self._forgive("add", error, True)

    def set(self, key, value, timeout=DEFAULT_TIMEOUT, version=None):
        try:
            return super().set(key, value, timeout, version)
        except UNAVAILABLE as error:
            return self._forgive("set", error, None)

    def set_many(self, data, timeout=DEFAULT_TIMEOUT, version=None):
        try:
            return super().set_many(data, timeout, version)
        except UNAVAILABLE as error:
            return self._forgive("set_many", error, list(data))

    def delete(self, key, version=None):
        try:
            return super().delete(key, version)
        except UNAVAILABLE as error:
            return self._forgive("delete", error, False)

    def incr(self, key, delta=1, version=None):
        try:
            return super().incr(key, delta, version)
        except UNAVAILABLE as error:
            return self._forgive("incr", error, delta)
