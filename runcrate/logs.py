"""The log line's format: ISO 8601 times in UTC, whatever the machine's zone; an expected
refusal is one line, never a traceback."""

import logging
import time
from collections.abc import Callable

from django.core.exceptions import PermissionDenied


class UTCFormatter(logging.Formatter):
    converter: Callable[[float | None], time.struct_time] = time.gmtime
    default_time_format = "%Y-%m-%dT%H:%M:%S"
    default_msec_format = "%s.%03dZ"


class ExpectedRefusals(logging.Filter):
    """A 403 the permission table decided (a view raised PermissionDenied: a developer opening
    Billing) is expected: Django's `django.request` logs it as a warning with the exception
    attached, which prints a whole traceback. It becomes one line: the path and the refusal's
    sentence. Every other record, a 500's traceback included, passes unchanged."""

    def filter(self, record: logging.LogRecord) -> bool:
        exc = record.exc_info[1] if record.exc_info else None
        if getattr(record, "status_code", None) == 403 and isinstance(exc, PermissionDenied):
            reason = " ".join(str(exc).split())
            record.msg = record.getMessage() + (f" ({reason})" if reason else "")
            record.args = ()
            record.exc_info = record.exc_text = None
        return True
