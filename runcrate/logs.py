"""The log line's format: ISO 8601 times in UTC, whatever the machine's zone."""

import logging
import time


class UTCFormatter(logging.Formatter):
    converter = time.gmtime
    default_time_format = "%Y-%m-%dT%H:%M:%S"
    default_msec_format = "%s.%03dZ"
