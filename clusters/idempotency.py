"""`Idempotency-Key` on `POST /api/v1/clusters`: a retried create answers what the first one
did (the same status and body, the same cluster) and never reserves twice.

A key belongs to one project and one API key, and is kept `IdempotentRequest.KEEP_FOR` (24 h)
from the first request; after that it is forgotten and the same key starts a new create. Only
a create that happened is kept: a refused one changed nothing, so its retry is decided afresh
(after a top-up, say). The same key with another body is refused (`idempotency_key_reused`).

Concurrency: the record row is inserted before the create, in the same transaction, under a
unique constraint. A second request with the key waits on that row (PostgreSQL's unique index;
SQLite lets one writer in at a time) until the first commits, then replays its answer; if the
first was refused and rolled back, the second creates.
"""

import hashlib
import json
import re
from collections.abc import Callable
from datetime import datetime

from django.db import IntegrityError, transaction
from django.utils import timezone

from accounts.models import ApiKey, Project
from clusters.models import IdempotentRequest
from runcrate.errors import Refused

HEADER = "Idempotency-Key"
KEY_RE = re.compile(r"[\x21-\x7e]{1,255}")  # printable ASCII, no spaces: a UUID fits


class IdempotencyRefused(Refused):
    STATUS = {
        "invalid_idempotency_key": 422,
        "idempotency_key_reused": 422,
        "idempotency_key_in_use": 409,
    }


class Answer:
    """A response to keep: its status, its body as sent, and the cluster it made."""

    def __init__(self, status: int, content: bytes, cluster_id: int | None) -> None:
        self.status = status
        self.content = content
        self.cluster_id = cluster_id


def request_hash(body: dict) -> str:
    """The same body, however its keys are ordered, hashes the same."""
    canonical = json.dumps(body, sort_keys=True, separators=(",", ":"), default=str)
    return hashlib.sha256(canonical.encode()).hexdigest()


def clean_key(raw: str) -> str:
    key = raw.strip()
    if not KEY_RE.fullmatch(key):
        raise IdempotencyRefused(
            "invalid_idempotency_key",
            f"The {HEADER} header is 1 to 255 printable ASCII characters without spaces, "
            "such as a UUID.",
        )
    return key


def once(
    *,
    project: Project,
    api_key: ApiKey,
    key: str,
    body: dict,
    run: Callable[[], Answer],
    now: datetime | None = None,
) -> Answer:
    """`run()` once per (project, API key, `key`): the first call's answer, kept, or a replay of
    it. `body` is the validated request; another body under the same key is refused."""
    key = clean_key(key)
    digest = request_hash(body)
    now = now or timezone.now()
    fields = {"project": project, "api_key": api_key, "key": key}
    with transaction.atomic():
        record = _claim(fields, digest=digest, now=now)
        if record is None:
            first = IdempotentRequest.objects.get(**fields)
            if first.created_at > now - IdempotentRequest.KEEP_FOR:
                return _replay(first, key=key, digest=digest)
            first.delete()  # kept long enough: the key starts a new create
            record = _claim(fields, digest=digest, now=now)
            if record is None:  # another request claimed it between the two
                return _replay(IdempotentRequest.objects.get(**fields), key=key, digest=digest)
        answer = run()
        record.status_code = answer.status
        record.response = answer.content.decode()
        record.cluster_id = answer.cluster_id
        record.save(update_fields=["status_code", "response", "cluster"])
    return answer


def _claim(fields: dict, *, digest: str, now: datetime) -> IdempotentRequest | None:
    """Insert the key's record, or None when it exists (having waited for its transaction)."""
    try:
        with transaction.atomic():
            return IdempotentRequest.objects.create(**fields, request_hash=digest, created_at=now)
    except IntegrityError:
        return None


def _replay(first: IdempotentRequest, *, key: str, digest: str) -> Answer:
    if first.request_hash != digest:
        raise IdempotencyRefused(
            "idempotency_key_reused",
            f"The {HEADER} {key[:80]!r} was used at {first.created_at:%Y-%m-%d %H:%M:%S} UTC "
            "for a create with another body; send a new key for a new create (keys are kept "
            "24 hours).",
        )
    if first.status_code is None:  # seen only where the database does not make us wait
        raise IdempotencyRefused(
            "idempotency_key_in_use",
            f"A create with the {HEADER} {key[:80]!r} is still running; retry in a moment.",
        )
    return Answer(first.status_code, first.response.encode(), first.cluster_id)


def forget_expired(*, now: datetime | None = None) -> int:
    """Delete the records older than `KEEP_FOR`; returns how many (a periodic sweep)."""
    cutoff = (now or timezone.now()) - IdempotentRequest.KEEP_FOR
    deleted, _ = IdempotentRequest.objects.filter(created_at__lte=cutoff).delete()
    return deleted
