"""Our own outages: the database or the broker not answering, told apart from bugs.

A dropped database connection (PostgreSQL restarted, a backend killed, a failover), a broker
or Redis that does not answer: none of these is the request's fault nor a bug in the code, and
each passes by itself. They are answered **503** with `Retry-After`, never 500: the envelope
`service_unavailable` under /api/v1/ (`runcrate/api.py`) and the 503 page elsewhere
(`runcrate/middleware.py`), so a client knows to send the same request again. Everything else
unexpected stays a logged 500.
"""

from collections.abc import Callable
from typing import TypeVar

import psycopg
from django.db import InterfaceError, OperationalError, connection
from kombu.exceptions import OperationalError as BrokerError
from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import TimeoutError as RedisTimeoutError

# What a database, broker or Redis that does not answer raises: Django's wrappers of the
# driver's errors, the driver's own (raised where Django does not wrap, e.g. a pool), kombu's
# (a publish that found no broker) and redis-py's (a cache or broker client that timed out).
OUTAGES: tuple[type[BaseException], ...] = (
    OperationalError,
    InterfaceError,
    psycopg.OperationalError,
    psycopg.InterfaceError,
    BrokerError,
    RedisConnectionError,
    RedisTimeoutError,
)
# How long a client should wait before sending the request again: a dropped connection is
# replaced at the next request (CONN_HEALTH_CHECKS), a broker or Redis is back within seconds
# or is an incident someone is already on.
RETRY_AFTER_SECONDS = 5

UNAVAILABLE_MESSAGE = (
    "We could not reach our database or task queue just now; nothing in the request was at "
    f"fault. Send it again in {RETRY_AFTER_SECONDS} seconds (a create with the same "
    "Idempotency-Key never creates twice)."
)

T = TypeVar("T")


def is_outage(error: BaseException | None) -> bool:
    """Whether `error`, or what it was raised from, is one of our outages (a handler may see a
    wrapper: ninja's, a template's)."""
    seen = 0
    while error is not None and seen < 5:
        if isinstance(error, OUTAGES):
            return True
        error = error.__cause__ or error.__context__
        seen += 1
    return False


def after_commit(read: Callable[[], T]) -> T:
    """Read back what a committed change made, once more on a fresh connection when the
    connection dropped after the commit: the change happened, and its answer (a create's 201)
    must say so rather than a 503 that invites a second create. Inside a transaction nothing is
    committed yet, so an outage there is raised as it is (the caller's 503; it rolled back)."""
    try:
        return read()
    except OUTAGES:
        if connection.in_atomic_block:
            raise
        connection.close()
        return read()
