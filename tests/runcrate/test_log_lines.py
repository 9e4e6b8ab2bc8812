"""An expected 403 (the permission table's refusal) is one line on the console, no traceback;
an unexpected error keeps its traceback (config/settings.py LOGGING, runcrate/logs.py)."""

import io
import logging
import logging.config

import pytest
from django.conf import settings
from django.test import Client

from runcrate.logs import UTCFormatter


@pytest.fixture
def console():
    """What the console handler (the one `make run` prints) writes while the test runs: the
    product's logging set up again first, as Django sets it up at start (config/settings.py
    LOGGING), so that no earlier test of the process that set up logging its own way (an
    in-process Celery worker sets up Celery's) decides what this one finds."""
    logging.config.dictConfig(settings.LOGGING)
    [handler] = [h for h in logging.getLogger().handlers if isinstance(h.formatter, UTCFormatter)]
    assert isinstance(handler, logging.StreamHandler)
    stream = io.StringIO()
    previous = handler.setStream(stream)
    yield stream
    handler.setStream(previous)


def test_a_developer_refused_billing_is_one_line_with_the_reason(owner, teammate, console):
    response = teammate.browser_client().get("/billing/")

    assert response.status_code == 403
    lines = console.getvalue().splitlines()
    assert len(lines) == 1, console.getvalue()
    assert "WARNING django.request: Forbidden (Permission denied): /billing/" in lines[0]
    assert "Your role in this project is developer." in lines[0]
    assert "Traceback" not in console.getvalue()


def test_an_error_keeps_its_traceback():
    logger = logging.getLogger("django.request")
    stream = io.StringIO()
    handler = logging.StreamHandler(stream)
    logger.addHandler(handler)
    try:
        try:
            raise RuntimeError("a real fault")
        except RuntimeError:
            logger.error("Internal Server Error: /x/", exc_info=True, extra={"status_code": 500})
    finally:
        logger.removeHandler(handler)

    assert "Traceback" in stream.getvalue() and "RuntimeError: a real fault" in stream.getvalue()


def test_a_404_stays_one_line(owner, console):
    Client().get("/no-such-page/")
    owner.browser_client().get("/clusters/999999/")

    lines = console.getvalue().splitlines()
    assert len(lines) == 2 and all("WARNING django.request: Not Found: /" in x for x in lines)
