"""The signature of a webhook, as Stripe signs: a header
`X-Runcrate-Signature: t=<unix time>,v1=<hex HMAC-SHA256 of "<t>.<body>" with the secret>`.

`verify` is the receiver's check, documented in docs/notifications.md: the time says when it
was signed, so a replay of an old request fails; the HMAC covers the time and the body, so an
altered body (or time) fails.
"""

import hashlib
import hmac
import time

HEADER = "X-Runcrate-Signature"
TOLERANCE = 300  # seconds


class SignatureInvalid(Exception):
    """The header is missing or malformed, too old, or does not match the body."""


def signature(secret: str, timestamp: int, body: bytes) -> str:
    signed = f"{timestamp}.".encode() + body
    return hmac.new(secret.encode(), signed, hashlib.sha256).hexdigest()


def sign(secret: str, body: bytes, *, timestamp: int | None = None) -> str:
    """The header's value for `body` signed now (or at `timestamp`)."""
    t = int(time.time()) if timestamp is None else timestamp
    return f"t={t},v1={signature(secret, t, body)}"


def verify(
    secret: str, header: str, body: bytes, *, tolerance: int = TOLERANCE, now: int | None = None
) -> int:
    """Check a received webhook: `header` is X-Runcrate-Signature, `body` the raw request body.
    Returns the signing time; raises SignatureInvalid when the header is malformed, signed more
    than `tolerance` seconds from now (a replay), or its v1 matches no HMAC of the body."""
    parts: dict[str, list[str]] = {}
    for item in header.split(","):
        key, _, value = item.strip().partition("=")
        parts.setdefault(key, []).append(value)
    try:
        timestamp = int(parts["t"][0])
    except (KeyError, ValueError):
        raise SignatureInvalid("no t=<unix time> in the signature header") from None
    current = int(time.time()) if now is None else now
    if abs(current - timestamp) > tolerance:
        raise SignatureInvalid(f"signed {current - timestamp} s ago, beyond {tolerance} s")
    expected = signature(secret, timestamp, body)
    if not any(hmac.compare_digest(expected, given) for given in parts.get("v1", [])):
        raise SignatureInvalid("no v1 signature matches the body")
    return timestamp
