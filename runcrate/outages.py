"""Our own outages: the database or the broker not answering, told apart from bugs.

A dropped database connection (PostgreSQL restarted, a backend killed, a failover), a broker
or Redis that does not answer: none of these is the request's fault nor a bug in the code, and
each passes by itself. They are answered **503** with `Retry-After`, never 500: the envelope
`service_unavailable` under /api/v1/ (`runcrate/api.py`) and the 503 page elsewhere
(`runcrate/middleware.py`), so a client knows to send the same request again. Everything else
unexpected stays a logged 500.

A request that changed something and then lost its connection is no "send it again": the change
is there, and a retry would be refused (409) or done twice. Its transaction runs in `commit`,
which tells a COMMIT that happened from one that did not when the connection drops at the
COMMIT itself, and its answer is built inside that transaction, or read back with
`after_commit`; docs/api.md, "An action that committed answers its success".
"""

import functools
import time
from collections.abc import Callable
from typing import Concatenate, ParamSpec, TypeVar

import psycopg
from django.db import InterfaceError, OperationalError, connection, transaction
from django.http import HttpRequest
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
P = ParamSpec("P")
R = TypeVar("R", bound=HttpRequest)
SAFE_METHODS = frozenset({"GET", "HEAD", "OPTIONS"})


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


# How many fresh connections a committed change's answer (or its COMMIT's outcome) is tried on:
# one drop is the common case; a second, right after, is a database being cut over and over.
READ_BACK_TRIES = 3
# How long a transaction killed at its COMMIT is waited for to be decided: 20 x 0.05 s.
STATUS_POLLS = 20
STATUS_POLL_SECONDS = 0.05


def after_commit(read: Callable[[], T]) -> T:
    """Read back what a committed change made, on a fresh connection when the connection
    dropped after the commit (up to READ_BACK_TRIES in all): the change happened, and its
    answer (a create's 201) must say so rather than a 503 that invites a second create. Inside
    a transaction nothing is committed yet, so an outage there is raised as it is (the caller's
    503; it rolled back)."""
    for _ in range(READ_BACK_TRIES - 1):
        try:
            return read()
        except OUTAGES:
            if connection.in_atomic_block:
                raise
            connection.close()
    return read()


def commit(change: Callable[[], T]) -> T:
    """Run `change` (a state change and the answer it builds) in one transaction, and return
    what it returned once that transaction committed.

    A connection that drops at the COMMIT leaves the outcome unknown to the client: the server
    may have committed and died before saying so. Then the transaction's id, read when it
    began, is asked of the database on a fresh connection (`pg_xact_status`): committed, the
    change's result is returned as if nothing had dropped; aborted, or the database still out of
    reach, the outage is raised (a 503: nothing changed, or we cannot tell). An on_commit hook
    that meets an outage (a broker away) after the COMMIT is told apart the same way. Inside an
    outer transaction (Idempotency-Key's, a test's) `change` simply runs, with no savepoint:
    the COMMIT is not ours."""
    if connection.in_atomic_block:
        return change()  # not our COMMIT: the outer transaction's owner answers for it
    if connection.vendor != "postgresql":
        with transaction.atomic():
            return change()
    # A connection the server dropped since the last request is replaced now (CONN_HEALTH_CHECKS
    # does so at a request's first query, but not inside a transaction, where it would be
    # ours).
    connection.close_if_health_check_failed()
    xid = ""
    changed = False
    try:
        with transaction.atomic():
            with connection.cursor() as cursor:
                cursor.execute("select pg_current_xact_id()::text")
                xid = cursor.fetchone()[0]
            result = change()
            changed = True  # what follows is the COMMIT and the on_commit hooks
    except OUTAGES:
        if not changed or not _committed(xid):
            raise
    return result


def _committed(xid: str) -> bool:
    """Whether the transaction `xid` committed, asked on a fresh connection; the outage is
    raised again when the database cannot be asked."""
    for attempt in range(READ_BACK_TRIES):
        connection.close()
        try:
            return _status(xid) == "committed"
        except OUTAGES:
            if attempt == READ_BACK_TRIES - 1:
                raise
    return False


def _status(xid: str) -> str | None:
    """The transaction's status once it is decided: a backend killed at its COMMIT may still
    be ending when we ask ("in progress"), for a moment; still undecided after about a second,
    it counts as not known to have committed."""
    with connection.cursor() as cursor:
        for _ in range(STATUS_POLLS):
            cursor.execute("select pg_xact_status(%s::xid8)", [xid])
            status = cursor.fetchone()[0]
            if status != "in progress":
                return status
            time.sleep(STATUS_POLL_SECONDS)
    return status


def committing(view: Callable[Concatenate[R, P], T]) -> Callable[Concatenate[R, P], T]:
    """An action (a view or an API endpoint) whose change and answer are one `commit`: what it
    answers is built before its COMMIT, so nothing after the COMMIT can fail it, and a COMMIT
    that went through as the connection dropped answers the action's success, not a 503 whose
    retry is refused or done twice. A GET (a confirmation page) runs as it is. Not for an
    action that waits on another party (a test delivery): its transaction would wait too."""

    @functools.wraps(view)
    def action(request: R, *args: P.args, **kwargs: P.kwargs) -> T:
        if request.method in SAFE_METHODS:
            return view(request, *args, **kwargs)
        return commit(lambda: view(request, *args, **kwargs))

    return action
