"""Sending deliveries: one POST each attempt, retried with exponential backoff
(docs/notifications.md, "Retries").

A due delivery is claimed with a conditional update of its `next_attempt_at` (a lease), so two
workers never send the same attempt; the POST is made outside any transaction, then its result
is written back. A 2xx is delivered; anything else (another status, a timeout, a refused
address) is retried after 1, 2, 4, … minutes, at most an hour apart, for RETRY_FOR from the
delivery's creation, then failed. An endpoint whose attempts have all failed for
SWITCH_OFF_AFTER is switched off and its creator (or the project's owners) told by email.
"""

import json
import logging
import ssl
import time
from collections.abc import Iterable
from dataclasses import dataclass
from datetime import datetime, timedelta
from functools import partial
from typing import Any

import httpcore
import httpx
from django.db import transaction
from django.db.models import Q
from django.utils import timezone

from accounts import recipients
from notifications import addresses, signing
from notifications.models import RETRY_FOR, SWITCH_OFF_AFTER, Attempt, Delivery, Endpoint
from runcrate.emails import send_templated

log = logging.getLogger(__name__)

# One attempt's whole deadline, from the connect to the last byte read, and the most of the
# answer read: a receiver is someone else's, so neither a trickle nor a flood holds a worker.
TIMEOUT = 10.0
MAX_ANSWER_BYTES = 64 * 1024
FIRST_RETRY = timedelta(minutes=1)
MAX_RETRY = timedelta(hours=1)
LEASE = timedelta(minutes=5)  # a claimed attempt not written back by then is due again
BATCH = 50
# One pass of the beat starts no attempt after this many seconds (one attempt started before
# then runs to its own TIMEOUT): what is left waits for the next pass, and the worker's thread
# is back within PASS_SECONDS + TIMEOUT, however many receivers are slow.
PASS_SECONDS = 30.0
USER_AGENT = "Runcrate-Webhooks/1"


@dataclass(frozen=True)
class Outcome:
    status_code: int | None
    error: str

    @property
    def delivered(self) -> bool:
        return self.status_code is not None and 200 <= self.status_code < 300


def retry_delay(attempts: int) -> timedelta:
    """The wait after the `attempts`-th failed attempt: 1 min, 2, 4, … capped at MAX_RETRY."""
    return min(FIRST_RETRY * 2 ** max(attempts - 1, 0), MAX_RETRY)


def encode(body: dict) -> bytes:
    """The bytes POSTed (and signed): compact JSON."""
    return json.dumps(body, separators=(",", ":"), ensure_ascii=False).encode()


def post(endpoint: Endpoint, body: dict, *, now: datetime) -> Outcome:
    """One POST of `body` to `endpoint`, to the address checked just now (no DNS rebinding)."""
    try:
        target = addresses.check_url(endpoint.url)
    except addresses.UrlRefused as refused:
        return Outcome(status_code=None, error=refused.message)
    content = encode(body)
    headers = {"content-type": "application/json", "user-agent": USER_AGENT}
    headers["host"] = target.host if target.port in {80, 443} else f"{target.host}:{target.port}"
    if endpoint.kind == Endpoint.Kind.WEBHOOK:
        headers[signing.HEADER] = signing.sign(
            endpoint.secret, content, timestamp=int(now.timestamp())
        )
    try:
        status = _post_within(target, content=content, headers=headers, seconds=TIMEOUT)
    except (httpcore.TimeoutException, TimeoutError):
        return Outcome(status_code=None, error=f"no whole answer within {TIMEOUT:.0f} seconds")
    except (httpcore.NetworkError, httpcore.ProtocolError, ssl.SSLError, OSError) as error:
        return Outcome(status_code=None, error=f"{type(error).__name__}: {error}"[:500])
    if 200 <= status < 300:
        return Outcome(status_code=status, error="")
    return Outcome(status_code=status, error=f"answered {status}")


class _PastDeadline(httpcore.TimeoutException):
    """The attempt's whole deadline passed (however the receiver dripped its bytes)."""


def _left(deadline: float, timeout: float | None) -> float:
    left = deadline - time.monotonic()
    if left <= 0:
        raise _PastDeadline("the attempt ran past its deadline")
    return left if timeout is None else min(timeout, left)


class _DeadlineStream(httpcore.NetworkStream):
    """A connection whose every read, write and TLS handshake waits only until the attempt's
    deadline: httpx's own timeouts bound each socket operation, so a receiver sending one byte
    every few seconds would hold the attempt for ever."""

    def __init__(self, stream: httpcore.NetworkStream, deadline: float) -> None:
        self.stream = stream
        self.deadline = deadline

    def read(self, max_bytes: int, timeout: float | None = None) -> bytes:
        return self.stream.read(max_bytes, timeout=_left(self.deadline, timeout))

    def write(self, buffer: bytes, timeout: float | None = None) -> None:
        self.stream.write(buffer, timeout=_left(self.deadline, timeout))

    def close(self) -> None:
        self.stream.close()

    def start_tls(
        self,
        ssl_context: ssl.SSLContext,
        server_hostname: str | None = None,
        timeout: float | None = None,
    ) -> httpcore.NetworkStream:
        tls = self.stream.start_tls(
            ssl_context, server_hostname=server_hostname, timeout=_left(self.deadline, timeout)
        )
        return _DeadlineStream(tls, self.deadline)

    def get_extra_info(self, info: str) -> Any:
        return self.stream.get_extra_info(info)


class _DeadlineBackend(httpcore.NetworkBackend):
    """httpcore's own sync backend (the one httpx uses), its streams bounded by one deadline:
    httpcore's documented hook for what a connection does (`network_backend`)."""

    def __init__(self, deadline: float) -> None:
        self.deadline = deadline
        self.backend = httpcore.SyncBackend()

    def connect_tcp(
        self,
        host: str,
        port: int,
        timeout: float | None = None,
        local_address: str | None = None,
        socket_options: Iterable[httpcore.SOCKET_OPTION] | None = None,
    ) -> httpcore.NetworkStream:
        stream = self.backend.connect_tcp(
            host,
            port,
            timeout=_left(self.deadline, timeout),
            local_address=local_address,
            socket_options=socket_options,
        )
        return _DeadlineStream(stream, self.deadline)

    def connect_unix_socket(
        self,
        path: str,
        timeout: float | None = None,
        socket_options: Iterable[httpcore.SOCKET_OPTION] | None = None,
    ) -> httpcore.NetworkStream:
        raise httpcore.ConnectError("webhooks go to network addresses only")

    def sleep(self, seconds: float) -> None:
        time.sleep(min(seconds, max(self.deadline - time.monotonic(), 0)))


def _post_within(
    target: addresses.Target, *, content: bytes, headers: dict[str, str], seconds: float
) -> int:
    """POST `content` to the checked address within `seconds` in all, reading at most
    MAX_ANSWER_BYTES of the answer; its status code."""
    deadline = time.monotonic() + seconds
    timeouts = {"connect": seconds, "read": seconds, "write": seconds, "pool": seconds}
    with (
        httpcore.ConnectionPool(
            ssl_context=httpx.create_ssl_context(trust_env=False),
            network_backend=_DeadlineBackend(deadline),
            max_connections=1,
        ) as pool,
        pool.stream(
            "POST",
            target.pinned_url,
            headers=list(headers.items()),
            content=content,
            extensions={"timeout": timeouts, "sni_hostname": target.host},
        ) as response,
    ):
        read = 0
        for chunk in response.iter_stream():
            read += len(chunk)
            if read >= MAX_ANSWER_BYTES:
                break  # the status is what counts: the rest is never read
        return response.status


def claim(delivery: Delivery, *, now: datetime) -> bool:
    """Take the delivery's due attempt for this worker; False when another took it."""
    return bool(
        Delivery.objects.filter(
            pk=delivery.pk,
            state=Delivery.State.PENDING,
            next_attempt_at=delivery.next_attempt_at,
        ).update(next_attempt_at=now + LEASE)
    )


def attempt(delivery: Delivery, *, now: datetime) -> Outcome | None:
    """Make the delivery's due attempt and write its result; None when another worker has it."""
    if not claim(delivery, now=now):
        return None
    outcome = post(delivery.endpoint, delivery.body, now=now)
    record(delivery, outcome, now=now)
    return outcome


def record(delivery: Delivery, outcome: Outcome, *, now: datetime) -> None:
    attempts = delivery.attempts + 1
    update: dict = {
        "attempts": attempts,
        "last_attempt_at": now,
        "last_status_code": outcome.status_code,
        "last_error": outcome.error,
    }
    if outcome.delivered:
        update |= {"state": Delivery.State.DELIVERED, "delivered_at": now}
    else:
        retry_at = now + retry_delay(attempts)
        if retry_at > delivery.created_at + RETRY_FOR:
            update["state"] = Delivery.State.FAILED
        else:
            update["next_attempt_at"] = retry_at
    with transaction.atomic():
        Attempt.objects.create(
            delivery=delivery, at=now, status_code=outcome.status_code, error=outcome.error
        )
        Delivery.objects.filter(pk=delivery.pk).update(**update)
        _mark_endpoint(delivery.endpoint, delivered=outcome.delivered, now=now)
    for key, value in update.items():
        setattr(delivery, key, value)


def _mark_endpoint(endpoint: Endpoint, *, delivered: bool, now: datetime) -> None:
    """The endpoint works again after a 2xx; else it has been failing since its first failure."""
    endpoints = Endpoint.objects.filter(pk=endpoint.pk)
    if delivered:
        endpoints.exclude(failing_since=None).update(failing_since=None)
        endpoint.failing_since = None
    elif endpoints.filter(failing_since=None).update(failing_since=now):
        endpoint.failing_since = now


def switch_off_failing(*, now: datetime) -> list[int]:
    """Switch off every active endpoint failing for SWITCH_OFF_AFTER, fail its pending
    deliveries, and email its creator once (the conditional update is the claim)."""
    switched = []
    candidates = Endpoint.objects.filter(
        active=True, failing_since__lte=now - SWITCH_OFF_AFTER
    ).select_related("project", "created_by")
    for endpoint in candidates:
        with transaction.atomic():
            if not Endpoint.objects.filter(pk=endpoint.pk, active=True).update(active=False):
                continue
            Delivery.objects.filter(endpoint=endpoint, state=Delivery.State.PENDING).update(
                state=Delivery.State.FAILED
            )
        switched.append(endpoint.pk)
        transaction.on_commit(partial(_email_switched_off, endpoint))
    return switched


def owners_of(endpoint: Endpoint) -> list[str]:
    """Who is told: the endpoint's creator while a member, else the project's owners
    (accounts/recipients.py, the one rule)."""
    return recipients.told_about(endpoint.project_id, maker_id=endpoint.created_by_id)


def _email_switched_off(endpoint: Endpoint) -> None:
    try:
        send_templated(
            template="webhook-switched-off",
            to=owners_of(endpoint),
            context={"endpoint": endpoint, "project": endpoint.project, "days": 3},
        )
    except Exception:
        log.exception("could not email that endpoint %s was switched off", endpoint.pk)


def due(*, now: datetime, limit: int = BATCH) -> list[Delivery]:
    return list(
        Delivery.objects.filter(
            Q(state=Delivery.State.PENDING), next_attempt_at__lte=now, endpoint__active=True
        )
        .select_related("endpoint")
        .order_by("next_attempt_at", "pk")[:limit]
    )


def send_due(
    *, now: datetime | None = None, limit: int = BATCH, seconds: float = PASS_SECONDS
) -> int:
    """Attempt the due deliveries, oldest first, starting none after `seconds`; returns how
    many were delivered. An endpoint whose attempt failed in this pass gets no other in it: a
    slow or dead receiver costs a pass one attempt's deadline, not one per delivery queued for
    it, and the other customers' deliveries behind them still go out."""
    now = now or timezone.now()
    stop = time.monotonic() + seconds
    failed: set[int] = set()
    delivered = 0
    for delivery in due(now=now, limit=limit):
        if time.monotonic() >= stop:
            break
        if delivery.endpoint_id in failed:
            continue
        outcome = attempt(delivery, now=now)
        if outcome is None:
            continue  # another worker has it
        if outcome.delivered:
            delivered += 1
        else:
            failed.add(delivery.endpoint_id)
    return delivered
