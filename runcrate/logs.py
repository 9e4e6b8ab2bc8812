"""The log line's format: ISO 8601 times in UTC, whatever the machine's zone."""

import logging
import time
from collections.abc import Callable


class UTCFormatter(logging.Formatter):
    converter: Callable[[float | None], time.struct_time] = time.gmtime
    default_time_format = "%Y-%m-%dT%H:%M:%S"
    default_msec_format = "%s.%03dZ"
