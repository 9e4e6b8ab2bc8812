"""gunicorn's configuration for the Procfile's web process, which loads it with
`--config python:runcrate.gunicorn_conf`.

One thing only: the access log never carries a secret that travels in a URL. A password-reset
link (`/accounts/password-reset/<uid>/<token>/`) is a live credential until it is used; gunicorn
logs the request line, the path, the query string, the Referer and the environ as they came, so
anyone who reads the log (a log shipper, a support engineer) could reset that user's password.
`RedactingLogger` writes every such value with the secret replaced by `[redacted]`, whatever the
access-log format asks for. Kept free of Django: gunicorn's master reads it before the app loads.
"""

from __future__ import annotations

import re
from typing import Any

from gunicorn.glogging import Logger

REDACTED = "[redacted]"

# Paths whose segments are secrets: the password-reset link's uid and token. Django's confirm
# view redirects it to `<uid>/set-password/` (the token then lives in the session); that path
# and the fixed `sent/` and `complete/` pages carry nothing and are logged as they are.
_SECRET_PATHS = re.compile(
    r"(?P<prefix>/password-reset/)(?!sent/|complete/)[^/\s?#\"]+/(?!set-password/)[^/\s?#\"]+"
)
# The members' invitation link: its last segment is the token (`/accounts/invitations/<token>/`;
# `<pk>/revoke/` carries none).
_INVITATION_PATHS = re.compile(r"(?P<prefix>/invitations/)(?!\d+/revoke/)[^/\s?#\"&]+")
# Query parameters that carry secrets, whatever page they are sent to: a token, key, secret,
# signature, password or code (an invite, a verification link, a one-time login).
_SECRET_PARAMETERS = re.compile(
    r"(?P<name>(?:^|[?&;])[^=&;\s\"]*(?:token|key|secret|signature|sig|password|code)"
    r"[^=&;\s\"]*=)[^&;\s\"#]*",
    re.IGNORECASE,
)

# Headers that are credentials as a whole, should a custom format name them.
_SECRET_ATOMS = {
    "{authorization}i",
    "{cookie}i",
    "{set-cookie}o",
    "{http_authorization}e",
    "{http_cookie}e",
}


def redact(text: str) -> str:
    """`text` (a path, a request line, a query string, a URL) with every secret replaced."""
    text = _SECRET_PATHS.sub(rf"\g<prefix>{REDACTED}/{REDACTED}", text)
    text = _INVITATION_PATHS.sub(rf"\g<prefix>{REDACTED}", text)
    return _SECRET_PARAMETERS.sub(rf"\g<name>{REDACTED}", text)


class RedactingLogger(Logger):
    """gunicorn's logger, its access-log values passed through `redact`: the request line
    (`%(r)s`), path (`%(U)s`), query (`%(q)s`), Referer (`%(f)s`) and every header and environ
    value a custom format could name."""

    def atoms(self, resp, req, environ, request_time) -> dict[str, Any]:
        atoms = super().atoms(resp, req, environ, request_time)
        return {
            name: REDACTED if name in _SECRET_ATOMS else _redacted(value)
            for name, value in atoms.items()
        }


def _redacted(value: Any) -> Any:
    return redact(value) if isinstance(value, str) else value


logger_class = RedactingLogger
