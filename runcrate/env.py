"""Small readers for settings that come from the environment.

Each one fails loudly on a value it cannot read, so a typo in a deployment stops the
process at start-up instead of running with a silent default.
"""

import math
import os
from decimal import Decimal
from urllib.parse import urlsplit, urlunsplit

from django.core.exceptions import ImproperlyConfigured

from runcrate.money import TOO_LARGE, TOO_PRECISE, TOO_SMALL, NotAnAmount, read_amount

_TRUE = {"1", "true", "yes", "on"}
_FALSE = {"0", "false", "no", "off", ""}


def env_str(name: str, default: str = "") -> str:
    return os.environ.get(name, default)


def env_bool(name: str, default: bool) -> bool:
    raw = os.environ.get(name)
    if raw is None:
        return default
    value = raw.strip().lower()
    if value in _TRUE:
        return True
    if value in _FALSE:
        return False
    raise ImproperlyConfigured(f"{name} must be true or false, not {raw!r}")


def env_int(name: str, default: int, *, minimum: int = 0) -> int:
    raw = os.environ.get(name)
    if raw is None or raw == "":
        return default
    try:
        value = int(raw)
    except ValueError:
        raise ImproperlyConfigured(f"{name} must be a whole number, not {raw!r}") from None
    if value < minimum:
        raise ImproperlyConfigured(f"{name} must be at least {minimum}, not {value}")
    return value


def env_float(name: str, default: float, *, minimum: float = 0.0) -> float:
    raw = os.environ.get(name)
    if raw is None or raw == "":
        return default
    try:
        value = float(raw)
    except ValueError:
        raise ImproperlyConfigured(f"{name} must be a number, not {raw!r}") from None
    if not math.isfinite(value):
        raise ImproperlyConfigured(f"{name} must be a finite number, not {raw!r}")
    if value <= minimum:
        raise ImproperlyConfigured(f"{name} must be greater than {minimum}, not {value}")
    return value


def env_decimal(name: str, default: str, *, maximum: Decimal = Decimal("1000000000")) -> Decimal:
    """A USD amount of 0 to `maximum`, with at most 2 decimals (runcrate/money.py)."""
    raw = os.environ.get(name) or default
    try:
        return read_amount(raw, minimum=Decimal(0), maximum=maximum)
    except NotAnAmount as error:
        if error.reason in (TOO_SMALL, TOO_LARGE):
            problem = f"from 0 to {maximum:,}"
        elif error.reason == TOO_PRECISE:
            problem = "with at most 2 decimals"
        else:
            problem = ""
        raise ImproperlyConfigured(
            f"{name} must be a decimal amount{' ' if problem else ''}{problem}, not {raw!r}"
        ) from None


def env_list(name: str, default: str = "") -> list[str]:
    raw = os.environ.get(name, default)
    return [item.strip() for item in raw.split(",") if item.strip()]


def redis_database(url: str, offset: int) -> str:
    """The Redis URL `offset` databases after the one `url` names (0 when it names none):
    redis://h:6379/0 -> redis://h:6379/1."""
    parts = urlsplit(url)
    path = parts.path.strip("/")
    if path and not path.isdigit():
        raise ImproperlyConfigured(f"REDIS_URL must end in a database number, not {path!r}")
    return urlunsplit(parts._replace(path=f"/{int(path or 0) + offset}"))
