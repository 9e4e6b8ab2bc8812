"""SSH public keys and API keys: the rules for adding, issuing and revoking them.

The account pages, the API, the admin and `manage.py issue_api_key` all call these functions;
none of them re-implements a rule. A refusal raises `KeyRefused` with a stable code and a
sentence for a person, before anything is written.
"""

import base64
import binascii
import hashlib
import math
import re
import struct
from collections.abc import Iterable
from dataclasses import dataclass
from datetime import datetime, timedelta
from decimal import Decimal
from typing import TYPE_CHECKING, TypeAlias, TypedDict, cast

from cryptography.hazmat.primitives.serialization import load_ssh_public_key
from django.conf import settings
from django.core.cache import cache
from django.db import IntegrityError, connection, transaction
from django.db.models import Exists, F, OuterRef, QuerySet
from django.utils import timezone

from accounts import history, permissions
from accounts.models import (
    ApiKey,
    Membership,
    Project,
    SshKey,
    UnforgottenKey,
    User,
    hash_api_key,
)
from runcrate.errors import Refused
from runcrate.money import TOO_LARGE, TOO_PRECISE, TOO_SMALL, NotAnAmount, read_amount

NAME_MAX_LENGTH = 100
API_KEY_PREFIX_LENGTH = 12  # "rc_live_" and four random characters: enough to tell keys apart
RSA_MIN_BITS = 2048
MAX_MACHINES_LIMIT = 1000
MAX_USD_PER_HOUR_LIMIT = Decimal("1000000.00")
BASE64_CHARS = re.compile(r"[A-Za-z0-9+/]+")
DIGITS = re.compile(r"[0-9]{1,6}")

ED25519 = "ssh-ed25519"
RSA = "ssh-rsa"
SK_ED25519 = "sk-ssh-ed25519@openssh.com"
SK_ECDSA = "sk-ecdsa-sha2-nistp256@openssh.com"
ECDSA_CURVES = {  # key type -> (curve name inside the blob, bytes per coordinate)
    "ecdsa-sha2-nistp256": ("nistp256", 32),
    "ecdsa-sha2-nistp384": ("nistp384", 48),
    "ecdsa-sha2-nistp521": ("nistp521", 66),
}
SUPPORTED_TYPES = (ED25519, RSA, *ECDSA_CURVES, SK_ED25519, SK_ECDSA)
SUPPORTED_DESCRIPTION = (
    "ssh-ed25519, ssh-rsa (2048 bits or more), ecdsa-sha2-nistp256/384/521, "
    "or a security-key type (sk-ssh-ed25519@openssh.com, sk-ecdsa-sha2-nistp256@openssh.com)"
)


class KeyRefused(Refused, ValueError):
    """A key (or its name) refused with a stable code, a message, and the form field to blame."""

    STATUS = {
        "invalid_ssh_key": 422,
        "ssh_key_exists": 409,
        "invalid_name": 422,
        "invalid_scope": 422,
        "invalid_limit": 422,
    }


def _invalid(message: str) -> KeyRefused:
    return KeyRefused("invalid_ssh_key", message, field="public_key")


def _truncated() -> KeyRefused:
    return _invalid(
        "The key data is truncated: part of the key is missing. Copy the whole line again."
    )


# --- parsing -------------------------------------------------------------------------------


@dataclass(frozen=True)
class PublicKey:
    """An OpenSSH public key that passed every check."""

    key_type: str
    blob: bytes
    comment: str
    bits: int

    @property
    def fingerprint(self) -> str:
        """As `ssh-keygen -lf` prints it: SHA256 of the blob, base64 without padding."""
        digest = hashlib.sha256(self.blob).digest()
        return "SHA256:" + base64.b64encode(digest).decode().rstrip("=")

    @property
    def openssh(self) -> str:
        """The canonical one-line form, as it goes into `authorized_keys`."""
        line = f"{self.key_type} {base64.b64encode(self.blob).decode()}"
        return f"{line} {self.comment}" if self.comment else line


class _Truncated(Exception):
    pass


class _Reader:
    """Reads the SSH wire format (RFC 4251 §5): uint32 length-prefixed strings."""

    def __init__(self, data: bytes) -> None:
        self.data = data
        self.offset = 0

    def string(self) -> bytes:
        if self.offset + 4 > len(self.data):
            raise _Truncated
        (length,) = struct.unpack_from(">I", self.data, self.offset)
        start = self.offset + 4
        if start + length > len(self.data):
            raise _Truncated
        self.offset = start + length
        return self.data[start : self.offset]

    def mpint(self) -> int:
        return int.from_bytes(self.string(), "big", signed=True)

    @property
    def at_end(self) -> bool:
        return self.offset == len(self.data)


def parse_public_key(text: str) -> PublicKey:
    """Parse one OpenSSH public key line (`TYPE BASE64 [comment]`) or raise `KeyRefused`."""
    text = text.strip()
    if not text:
        raise _invalid("Paste a public key: the one line in your .pub file.")
    if "PRIVATE KEY" in text:
        raise _invalid(
            "This is a private key. Never share it: paste the public key instead, the one "
            "line in the matching .pub file (for example ~/.ssh/id_ed25519.pub)."
        )
    if text.startswith("---- BEGIN SSH2 PUBLIC KEY"):
        raise _invalid(
            "This key is in the SSH2 (RFC 4716) format. Convert it to OpenSSH's one-line "
            "format with 'ssh-keygen -i -f KEYFILE' and paste that."
        )
    lines = [line for line in text.splitlines() if line.strip()]
    if len(lines) > 1:
        raise _invalid("Paste one key at a time: this text has several lines.")
    parts = text.split(None, 2)
    if len(parts) < 2:
        raise _invalid(
            "This is not an OpenSSH public key: expected 'TYPE BASE64-DATA [comment]', "
            "such as 'ssh-ed25519 AAAAC3Nza… you@laptop'."
        )
    key_type, data = parts[0], parts[1]
    comment = parts[2].strip() if len(parts) > 2 else ""
    if key_type not in SUPPORTED_TYPES:
        if key_type.startswith(("ssh-", "ecdsa-", "sk-")):
            raise _invalid(f"Unknown key type '{key_type[:40]}'. Use {SUPPORTED_DESCRIPTION}.")
        raise _invalid(
            "This is not an OpenSSH public key: it should start with its type, such as "
            f"'ssh-ed25519'. Accepted types: {SUPPORTED_DESCRIPTION}."
        )
    try:
        blob = base64.b64decode(data.encode("ascii"), validate=True)
    except (binascii.Error, UnicodeEncodeError):
        if BASE64_CHARS.fullmatch(data):  # only the padding is wrong: the line was cut short
            raise _truncated() from None
        raise _invalid(
            "The key data (the part after the type) is not valid base64: copy the whole line again."
        ) from None
    try:
        bits = _check_blob(key_type, _Reader(blob))
    except _Truncated:
        raise _truncated() from None
    return PublicKey(key_type=key_type, blob=blob, comment=comment, bits=bits)


def _check_blob(key_type: str, reader: _Reader) -> int:
    """Check the blob's structure against its declared type; return the key's size in bits."""
    embedded = reader.string()
    if embedded != key_type.encode():
        shown = embedded.decode("ascii", "replace")[:40]
        raise _invalid(
            f"The key says it is '{key_type}' but its data holds a '{shown}' key: the line "
            "was edited or assembled from two keys."
        )
    if key_type in (ED25519, SK_ED25519):
        point = reader.string()
        if len(point) != 32:
            raise _invalid(f"This {key_type} key is damaged: its public point has the wrong size.")
        bits = 256
    elif key_type == RSA:
        exponent, modulus = reader.mpint(), reader.mpint()
        if exponent < 3 or modulus <= 0:
            raise _invalid("This RSA key is damaged: its numbers are not a valid RSA key.")
        bits = modulus.bit_length()
        if bits < RSA_MIN_BITS:
            raise _invalid(
                f"This RSA key is {bits} bits, too short: RSA keys need at least "
                f"{RSA_MIN_BITS} bits. Make a new one with 'ssh-keygen -t ed25519'."
            )
    else:
        curve, size = ECDSA_CURVES["ecdsa-sha2-nistp256" if key_type == SK_ECDSA else key_type]
        if reader.string() != curve.encode():
            raise _invalid(f"This {key_type} key is damaged: it names the wrong curve.")
        point = reader.string()
        if len(point) != 1 + 2 * size or point[0] != 4:
            raise _invalid(f"This {key_type} key is damaged: its public point is malformed.")
        bits = {32: 256, 48: 384, 66: 521}[size]
    if key_type in (SK_ED25519, SK_ECDSA):
        reader.string()  # the security key's application, usually "ssh:"
    if not reader.at_end:
        raise _invalid(f"This {key_type} key has extra data after its end: copy it again.")
    if key_type not in (SK_ED25519, SK_ECDSA):
        # The structure is right; let cryptography check the mathematics (an ECDSA point on
        # its curve, an Ed25519 point that decodes).
        line = key_type.encode() + b" " + base64.b64encode(reader.data)
        try:
            load_ssh_public_key(line)
        except (ValueError, TypeError):
            raise _invalid(f"This {key_type} key is damaged: it is not a valid key.") from None
    return bits


# --- SSH keys ------------------------------------------------------------------------------


def _clean_name(name: str, *, fallback: str = "") -> str:
    name = " ".join((name or "").split()) or " ".join(fallback.split())
    if not name:
        raise KeyRefused("invalid_name", "Give the key a name.", field="name")
    if len(name) > NAME_MAX_LENGTH:
        raise KeyRefused(
            "invalid_name",
            f"The name is {len(name)} characters; keep it to {NAME_MAX_LENGTH}.",
            field="name",
        )
    return name


def add_ssh_key(*, project: Project, user: User | None, name: str, public_key: str) -> SshKey:
    """Validate an OpenSSH public key and add it to the project.

    The name defaults to the key's comment. A key already in the project (same fingerprint)
    is refused with `ssh_key_exists`.
    """
    parsed = parse_public_key(public_key)
    name = _clean_name(name, fallback=parsed.comment[:NAME_MAX_LENGTH])
    existing = SshKey.objects.filter(project=project, fingerprint=parsed.fingerprint).first()
    if existing is not None:
        raise _duplicate(existing.name)
    try:
        with transaction.atomic():
            key = SshKey.objects.create(
                project=project,
                created_by=user,
                name=name,
                public_key=parsed.openssh,
                fingerprint=parsed.fingerprint,
            )
            history.note(
                summary=f"added SSH key `{name}`",
                obj=key,
                changes={"fingerprint": history.change(None, key.fingerprint)},
            )
            return key
    except IntegrityError:
        # Someone added the same key between the check and the insert.
        existing = SshKey.objects.filter(project=project, fingerprint=parsed.fingerprint).first()
        raise _duplicate(existing.name if existing else name) from None


def _duplicate(name: str) -> KeyRefused:
    return KeyRefused(
        "ssh_key_exists",
        f"This key is already in your project, as '{name}'.",
        field="public_key",
    )


# --- whose keys a new cluster gets (docs/accounts.md, "SSH keys on clusters") ---------------------


def chosen_by_default(key: SshKey, user: User | None) -> bool:
    """Whether a cluster gets `key` when its creator `user` chooses no keys: the creator's own
    and the project's shared keys (those no member added: staff's, or a deleted user's). Staff
    creating for the project (no user) give every key."""
    return user is None or key.created_by_id in (None, user.pk)


def default_cluster_keys(*, project: Project, user: User | None) -> list[SshKey]:
    """The project's keys `chosen_by_default` for `user`, oldest first (one query)."""
    every = SshKey.objects.filter(project=project).select_related("created_by").order_by("pk")
    return [key for key in every if chosen_by_default(key, user)]


def members_cluster_keys(*, project: Project, member_ids: Iterable[int]) -> QuerySet[SshKey]:
    """Every key the members `member_ids` (their membership ids, as the members API lists
    them) added to the project."""
    users = Membership.objects.filter(project=project, pk__in=member_ids).values("user_id")
    return (
        SshKey.objects.filter(project=project, created_by__in=users)
        .select_related("created_by")
        .order_by("pk")
    )


def key_holder(key: SshKey) -> dict[str, str]:
    """What a cluster keeps of a key it was created with: the connect panel's "whose keys"."""
    owner = key.created_by.email if key.created_by_id and key.created_by else ""
    return {"name": key.name, "fingerprint": key.fingerprint, "owner": owner}


def _holder_id(key: SshKey | ApiKey) -> int | None:
    """The member whose key it is: an SSH key's adder (None for a shared one), an API key's
    maker."""
    return key.created_by_id if isinstance(key, SshKey) else key.user_id


def holders_roles(project: Project) -> dict[int, str]:
    """Every member's role in the project, by user id (one query): what `removal_refusal`
    asks of each key on a page that lists many."""
    rows = Membership.objects.filter(project=project).values_list("user_id", "role")
    return dict(rows)


def removal_refusal(
    *, user: User, key: SshKey | ApiKey, roles: dict[int, str] | None = None
) -> permissions.PermissionRefused | None:
    """Why `user` may not remove (an SSH key) or revoke (an API key) `key`, or None: the one
    rule for both. A member removes their own keys; another member's, or a shared one, needs
    `keys.remove_others` (owners and managers); an owner's key, `keys.remove_owners` (only
    owners), as only an owner removes an owner. `roles` (`holders_roles`) spares a query per
    key on a page."""
    holder = _holder_id(key)
    if holder == user.pk:
        return None
    if roles is None:
        roles = holders_roles(key.project)
    role = roles.get(user.pk)
    if not permissions.allowed(role, "keys.remove_others"):
        return permissions.refusal("keys.remove_others", role)
    owners_key = holder is not None and roles.get(holder) == permissions.OWNER
    if owners_key and not permissions.allowed(role, "keys.remove_owners"):
        return permissions.refusal("keys.remove_owners", role)
    return None


def removable(*, user: User, keys: Iterable[SshKey | ApiKey], roles: dict[int, str]) -> set[int]:
    """The pks of `keys` that `user` may remove or revoke, `roles` their project's
    (`holders_roles`): the page shows *Remove* and *Revoke* on these only."""
    return {key.pk for key in keys if removal_refusal(user=user, key=key, roles=roles) is None}


def remove_ssh_key(*, key: SshKey, by: User) -> None:
    """Remove a key, for `by` if they may (PermissionRefused, 403 `role_forbidden`, otherwise).
    Clusters already running keep it in their machines until they end."""
    if (refusal := removal_refusal(user=by, key=key)) is not None:
        raise refusal
    with transaction.atomic():
        SshKey.objects.filter(pk=key.pk).delete()
        history.note(
            summary=f"removed SSH key `{key.name}`",
            obj=key,
            project=key.project,
            changes={"fingerprint": history.change(key.fingerprint, None)},
        )


# --- API keys ------------------------------------------------------------------------------


def clean_scopes(scopes: Iterable[str] | None) -> list[str]:
    """The scopes to store: every one when `scopes` is None; at least one when given."""
    if scopes is None:
        return list(ApiKey.Scope.values)
    if isinstance(scopes, str):
        scopes = [scopes]
    wanted = {str(scope).strip().lower() for scope in scopes}
    unknown = sorted(wanted - set(ApiKey.Scope.values))
    if unknown:
        raise KeyRefused(
            "invalid_scope",
            f"Unknown scope {', '.join(repr(u[:40]) for u in unknown)}: choose from "
            f"{', '.join(ApiKey.Scope.values)}.",
            field="scopes",
        )
    if not wanted:
        raise KeyRefused(
            "invalid_scope",
            f"Give the key at least one scope: {', '.join(ApiKey.Scope.values)}.",
            field="scopes",
        )
    return [scope for scope in ApiKey.Scope.values if scope in wanted]


def clean_max_machines(value: int | str | None) -> int | None:
    """None (no limit) or a whole number of machines from 1 to MAX_MACHINES_LIMIT."""
    text = "" if value is None else str(value).strip()
    if not text:
        return None
    whole = not isinstance(value, bool) and DIGITS.fullmatch(text)
    if not whole or not 1 <= int(text) <= MAX_MACHINES_LIMIT:
        raise KeyRefused(
            "invalid_limit",
            f"The most machines per cluster is a whole number from 1 to {MAX_MACHINES_LIMIT}, "
            f"or empty for no limit; got {text[:40]!r}.",
            field="max_machines_per_cluster",
        )
    return int(text)


def clean_max_usd_per_hour(value: Decimal | int | str | None) -> Decimal | None:
    """None (no limit) or USD per hour above 0, in cents, at most MAX_USD_PER_HOUR_LIMIT."""
    text = "" if value is None else str(value).strip()
    if not text:
        return None
    in_range = f"is more than 0 and at most {MAX_USD_PER_HOUR_LIMIT:,}"
    problem = "is an amount in USD, like 25.00"
    if not isinstance(value, float):  # a JSON number is not exact enough for money
        try:
            amount = read_amount(value, minimum=Decimal(0), maximum=MAX_USD_PER_HOUR_LIMIT)
        except NotAnAmount as error:
            if error.reason == TOO_PRECISE:
                problem = "takes at most 2 decimals"
            elif error.reason in (TOO_SMALL, TOO_LARGE):
                problem = in_range
        else:
            if amount > 0:
                return amount
            problem = in_range
    raise KeyRefused(
        "invalid_limit",
        f"The most USD per hour {problem}, or empty for no limit; got {text[:40]!r}.",
        field="max_usd_per_hour",
    )


def issue_api_key(
    *,
    user: User,
    project: Project,
    name: str,
    scopes: Iterable[str] | None = None,
    max_machines_per_cluster: int | str | None = None,
    max_usd_per_hour: Decimal | int | str | None = None,
) -> tuple[ApiKey, str]:
    """A new API key, with every scope unless `scopes` narrows it, and optional limits.

    The raw key is returned once and never stored: only its hash is. Refused (KeyRefused,
    nothing written) for a bad name, an unknown or empty scope list, or a bad limit.
    """
    name = _clean_name(name)
    granted = clean_scopes(scopes)
    machines = clean_max_machines(max_machines_per_cluster)
    usd = clean_max_usd_per_hour(max_usd_per_hour)
    raw = ApiKey.generate()
    with transaction.atomic():
        key = ApiKey.objects.create(
            user=user,
            project=project,
            name=name,
            prefix=raw[:API_KEY_PREFIX_LENGTH],
            key_hash=hash_api_key(raw),
            scopes=granted,
            max_machines_per_cluster=machines,
            max_usd_per_hour=usd,
        )
        history.note(summary=f"created API key `{name}`", obj=key, changes=_key_terms(key))
    return key, raw


def _key_terms(key: ApiKey) -> dict[str, dict[str, object]]:
    """A new key's terms, as the audit log's before → after."""
    terms = {"scopes": history.change(None, sorted(key.scopes))}
    if key.max_machines_per_cluster is not None:
        terms["max_machines_per_cluster"] = history.change(None, key.max_machines_per_cluster)
    if key.max_usd_per_hour is not None:
        terms["max_usd_per_hour"] = history.change(None, key.max_usd_per_hour)
    return terms


def project_api_keys(project: Project) -> QuerySet[ApiKey]:
    """The project's API keys, working ones first, then newest, with their user."""
    return (
        ApiKey.objects.filter(project=project)
        .select_related("user")
        .order_by(F("revoked_at").asc(nulls_first=True), "-created_at", "-pk")
    )


def revoke_api_key(*, key: ApiKey, by: User | None = None) -> bool:
    """Revoke a key at once: the next call with it is refused, the cache answering or not.
    False when it was already revoked (nothing changes). For a member `by`, only when they may
    (`removal_refusal`; PermissionRefused, 403 `role_forbidden`, otherwise); staff's admin and
    the shell pass no one."""
    if by is not None and (refusal := removal_refusal(user=by, key=key)) is not None:
        raise refusal
    revoked_at = timezone.now()
    # One transaction: were the cache not to answer, the record that its copy of the key
    # could not be forgotten commits with the revocation itself (`forget_api_keys`).
    with transaction.atomic():
        changed = ApiKey.objects.filter(pk=key.pk, revoked_at__isnull=True).update(
            revoked_at=revoked_at
        )
        if changed:
            key.revoked_at = revoked_at
            forget_api_keys([key.key_hash])
            history.note(
                summary=f"revoked API key `{key.name}`",
                obj=key,
                project=key.project,
                changes={"revoked": history.change(False, True)},
            )
    return bool(changed)


# --- finding the key of an API call ----------------------------------------------------------

# An API call finds its key in the cache, by the key's hash (the key itself is never kept), for
# at most this long; every change to what the lookup checks forgets it at once (below), so the
# time only bounds a change made around this module (a queryset update in a shell).
KEY_CACHE_SECONDS = 30
# Writing last_used_at on every call would turn each read into a write; a minute is precise
# enough for "last used" and keeps the hot path read-only.
LAST_USED_PRECISION = timedelta(minutes=1)
# What a forgotten key's cache entry holds for KEY_CACHE_SECONDS: "ask the database". A lookup
# that read the key just before a revocation committed stores it with `add`, which this entry
# refuses, so the revoked key cannot come back for the rest of the entry's time.
FORGOTTEN = "forgotten"
# What the cached key holds of its user and project; reading any other field loads it fresh
# (the user's password hash never reaches the cache).
# With what offers/visibility.py asks (staff, a project flagged for drills), so the offers'
# hot path reads no more than the key.
KEY_USER_FIELDS = ("user__id", "user__email", "user__name", "user__is_active", "user__is_staff")
KEY_PROJECT_FIELDS = ("project__id", "project__name", "project__drills")
# Fail closed: a forget the cache did not take is recorded in the database (UnforgottenKey),
# and a cached key is served only while the cache is *trusted*: someone looked at those records
# lately, found none (or forgot their keys for good), and said so in the cache under TRUST,
# good for trust_seconds(). That is no longer than the cache's socket timeouts, and a forget
# fails only after waiting that long for a cache that did not answer: so any trust given before
# the cache stopped answering has run out by the time the failure is recorded, and every hit
# after it looks at the records first. Read with the key's entry, in the same round trip.
TRUST = "apikey-trust"


if TYPE_CHECKING:
    from django_stubs_ext import WithAnnotations


class KeyMembership(TypedDict):
    is_member: bool  # whether the key's user is still in the key's project


# What find_api_key returns: the key, with `is_member` annotated by its query.
FoundKey: TypeAlias = "WithAnnotations[ApiKey, KeyMembership]"


def _cache_key(key_hash: str) -> str:
    return f"apikey:{key_hash}"


def trust_seconds() -> float:
    """How long one look at the failed forgets lets cached keys be served: the shorter of the
    cache's connect and read timeouts (1 s for a cache without them, e.g. the laptop's)."""
    options = settings.CACHES["default"].get("OPTIONS", {})
    timeouts = [
        float(options[name])
        for name in ("socket_connect_timeout", "socket_timeout")
        if options.get(name)
    ]
    return min(timeouts, default=1.0)


def _trusted(value: object, *, now: datetime) -> bool:
    return isinstance(value, datetime) and now < value


def _trust(*, now: datetime) -> None:
    # Good until `now` + trust_seconds() by this clock, as the entries are; the cache may keep
    # it as long as an entry, since its own expiry is not what is trusted.
    cache.set(TRUST, now + timedelta(seconds=trust_seconds()), KEY_CACHE_SECONDS)


def _failed_forgets(now: datetime) -> QuerySet[UnforgottenKey]:
    """Forgets the cache did not take lately: older ones no longer matter, since no cached key
    outlives KEY_CACHE_SECONDS (its entry says until when, by this clock)."""
    return UnforgottenKey.objects.filter(failed_at__gt=now - timedelta(seconds=KEY_CACHE_SECONDS))


def settle_failed_forgets(*, now: datetime) -> bool:
    """Forget for good the keys whose forgetting failed, and trust the cache again; False (the
    cache stays untrusted, every call reads the database) while the cache does not take them."""
    failed = list(_failed_forgets(now).values_list("pk", "key_hash"))
    if not _mark_forgotten({key_hash for _, key_hash in failed}):
        return False
    UnforgottenKey.objects.filter(pk__in=[pk for pk, _ in failed]).delete()
    _trust(now=now)
    return True


def find_api_key(token: str, *, now: datetime) -> "FoundKey | None":
    """The working key `token` is, with its user and project, or None (unknown, revoked, or of
    a deactivated user). `key.is_member` says whether its user is still in its project.

    From the cache when a call found it lately and the cache is trusted (TRUST), else one
    query, which also renews the trust. last_used_at is written at
    most once a LAST_USED_PRECISION, and a key is cached no longer than its stamp stays
    precise, so a call answered from the cache is always within a minute of the stamp.
    """
    key_hash = hash_api_key(token)
    # A cache that does not answer reads as a miss (runcrate/cache.py): the database decides.
    found = cache.get_many([_cache_key(key_hash), TRUST])
    entry = found.get(_cache_key(key_hash))
    trusted = _trusted(found.get(TRUST), now=now)
    # An entry is (the key or FORGOTTEN, good until), judged by this clock rather than left to
    # the cache's own expiry alone: a cache whose clock runs behind never serves a stale key.
    held, until = entry if isinstance(entry, tuple) and len(entry) == 2 else (None, None)
    fresh = until is not None and now < until
    if fresh and isinstance(held, ApiKey) and trusted:
        # The cache gives back the key _remember kept: found below, with its is_member.
        return cast("FoundKey", held)
    try:
        key = (
            ApiKey.objects.select_related("project", "user")
            .only(
                *(field.name for field in ApiKey._meta.concrete_fields),
                *KEY_USER_FIELDS,
                *KEY_PROJECT_FIELDS,
            )
            # In the same query: a user removed from the project loses its keys at once.
            .annotate(
                is_member=Exists(
                    Membership.objects.filter(
                        project_id=OuterRef("project_id"), user_id=OuterRef("user_id")
                    )
                ),
                # Whether the cache may be trusted again, asked in the same query.
                forgets_failed=Exists(_failed_forgets(now)),
            )
            # key_hash is unique: get() spares the ORDER BY that first() would add (the
            # model's ordering), which costs as much as the rest of the lookup.
            .get(key_hash=key_hash, revoked_at__isnull=True, user__is_active=True)
        )
    except ApiKey.DoesNotExist:
        return None
    if not key.is_member:
        return key  # refused by the caller; neither stamped nor kept
    if key.last_used_at is None or now - key.last_used_at > LAST_USED_PRECISION:
        ApiKey.objects.filter(pk=key.pk).update(last_used_at=now)
        key.last_used_at = now
    if not (fresh and held == FORGOTTEN):  # not forgotten lately
        _remember(key, now=now)
    if not trusted:
        if key.forgets_failed:
            settle_failed_forgets(now=now)
        else:
            _trust(now=now)
    return key


def _remember(key: ApiKey, *, now: datetime) -> None:
    assert key.last_used_at is not None  # find_api_key stamps a key before it keeps it
    precise_for = (key.last_used_at + LAST_USED_PRECISION - now).total_seconds()
    seconds = min(KEY_CACHE_SECONDS, math.floor(precise_for))
    if seconds >= 1:
        # add, not set: an entry already there is as good, a forgotten marker, or one the
        # cache drops within its own time.
        until = now + timedelta(seconds=seconds)
        cache.add(_cache_key(key.key_hash), (key, until), seconds)


def forget_api_keys(key_hashes: Iterable[str]) -> None:
    """Refuse the cache's copy of these keys: each call reads them from the database for the
    next KEY_CACHE_SECONDS.

    Now, and again once the caller's transaction commits: the first stops a lookup made while
    the change is still uncommitted from being kept, the second counts the time from the
    commit. (Were the change rolled back, the keys are merely read from the database a while.)

    Fail closed: when the cache does not take the mark, the keys are recorded as unforgotten
    in the caller's transaction, so the record commits with the change, and no cached key is
    served until they are forgotten for good (`find_api_key`, TRUST).
    """
    hashes = list(key_hashes)
    if not hashes:
        return
    if _mark_forgotten(hashes):

        def forget_again() -> None:
            if not _mark_forgotten(hashes):
                _record_unforgotten(hashes)

        transaction.on_commit(forget_again)
        return
    _record_unforgotten(hashes)
    if not connection.in_atomic_block:
        # Autocommit: the change committed before the record. Were the cache answering again
        # by now, a lookup may have trusted it in between; the mark, taken now, covers that.
        _mark_forgotten(hashes)


def _mark_forgotten(key_hashes: Iterable[str]) -> bool:
    """Put the forgotten mark on these keys' entries; False when the cache did not take it."""
    until = timezone.now() + timedelta(seconds=KEY_CACHE_SECONDS)
    marks = dict.fromkeys((_cache_key(key_hash) for key_hash in key_hashes), (FORGOTTEN, until))
    # set_many answers the names it could not set: all of them from a cache that is away. It
    # always asks Redis, even just after a failure (runcrate/cache.py skips other calls then).
    return not cache.set_many(marks, KEY_CACHE_SECONDS)


def _record_unforgotten(key_hashes: Iterable[str]) -> None:
    UnforgottenKey.objects.bulk_create(UnforgottenKey(key_hash=h) for h in key_hashes)


def forget_keys_of(*, user_id: int | None = None, project_id: int | None = None) -> None:
    """Forget the cached keys of a user, a project, or a user in a project (a membership)."""
    keys = ApiKey.objects.all()
    if user_id is not None:
        keys = keys.filter(user_id=user_id)
    if project_id is not None:
        keys = keys.filter(project_id=project_id)
    forget_api_keys(keys.values_list("key_hash", flat=True))


# The cached key must not outlive a change to what its lookup checks, however the change is
# made: the admin's forms and inlines, a deleted user's or project's cascade, the shell. Only
# Django's model signals see all of these, so these receivers (connected in accounts/apps.py)
# do nothing but forget; revoking, an UPDATE that no signal sees, forgets in revoke_api_key.


def forget_saved_key(sender, instance: ApiKey, created: bool = False, **kwargs) -> None:
    if not created:  # a new key was never looked up, so never cached
        forget_api_keys([instance.key_hash])


def forget_deleted_key(sender, instance: ApiKey, **kwargs) -> None:
    forget_api_keys([instance.key_hash])


def forget_users_keys(sender, instance: User, created: bool = False, update_fields=None, **kw):
    # A log-in stamps last_login alone: nothing the key's lookup reads.
    if not created and set(update_fields or ()) != {"last_login"}:
        forget_keys_of(user_id=instance.pk)


def forget_projects_keys(sender, instance: Project, created: bool = False, **kwargs) -> None:
    if not created:
        forget_keys_of(project_id=instance.pk)


def forget_members_keys(sender, instance: Membership, created: bool = False, **kwargs) -> None:
    if not created:  # a key of a user who was not a member is never cached
        forget_keys_of(user_id=instance.user_id, project_id=instance.project_id)
