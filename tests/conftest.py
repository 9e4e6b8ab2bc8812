"""Fixtures shared by the whole suite: three users (an owner, a teammate, a stranger who must
see nothing), API clients for each, a Playwright browser on Debian's Chromium."""

import os
import signal
from dataclasses import dataclass

import pytest
from django.conf import settings
from django.test import Client

from accounts.models import Membership, Project, User
from accounts.projects import create_project
from tests import tiers, workers
from tests.factories import GpuModelFactory, UserFactory, issue_key

# Playwright's sync API runs an event loop in the test thread; Django's ORM calls made by the
# test itself are still synchronous and safe.
os.environ.setdefault("DJANGO_ALLOW_ASYNC_UNSAFE", "true")

CHROMIUM = "/usr/bin/chromium"


def pytest_configure(config):
    # The tiers' markers and the table of each tier's time at the end (docs/testing.md).
    if not config.pluginmanager.is_registered(tiers):
        config.pluginmanager.register(tiers, "runcrate-tiers")
    # A run started in the background by a shell without job control (`cmd &` in a script)
    # begins with SIGINT ignored, and every process a test starts would inherit that: Python
    # then installs no KeyboardInterrupt handler, and the tests that press Ctrl-C on the CLI
    # wait for a process that never hears it. With Python's own handler here, a child starts
    # with the default (exec resets a handled signal, not an ignored one), as from a terminal.
    if signal.getsignal(signal.SIGINT) is signal.SIG_IGN:
        signal.signal(signal.SIGINT, signal.default_int_handler)


@dataclass
class Person:
    user: User
    project: Project
    key: str

    def api(self) -> Client:
        return Client(headers={"authorization": f"Bearer {self.key}"})

    def browser_client(self) -> Client:
        client = Client()
        client.force_login(self.user)
        return client


def _person(email: str, project: Project | None = None) -> Person:
    user = UserFactory(email=email)
    if project is None:
        project = create_project(owner=user, name=f"{email.split('@')[0]}'s project")
    else:
        Membership.objects.create(project=project, user=user, role=Membership.Role.DEVELOPER)
    return Person(user=user, project=project, key=issue_key(user=user, project=project))


def _flush_by_delete():
    """A transactional test (`transaction=True`, `live_server`) ends with Django's flush, which
    on PostgreSQL is one TRUNCATE of every table: new files for 52 tables and their indexes,
    0.1 s on an idle machine and 0.7 s on a busy one, after every such test. Where the
    sequences are not reset (they never are here), the suite's flush is DELETE FROM each table
    instead, in the same transaction, foreign keys checked at its end (Django makes them
    DEFERRABLE): the same empty tables in a few milliseconds (docs/testing.md)."""
    from django.db.backends.postgresql.operations import DatabaseOperations

    truncate = DatabaseOperations.sql_flush

    def sql_flush(self, style, tables, *, reset_sequences=False, allow_cascade=False):
        if reset_sequences or allow_cascade or not tables:
            return truncate(
                self, style, tables, reset_sequences=reset_sequences, allow_cascade=allow_cascade
            )
        deletes = [f"DELETE FROM {self.quote_name(table)};" for table in tables]
        return ["SET CONSTRAINTS ALL DEFERRED;", *deletes]

    DatabaseOperations.sql_flush = sql_flush


if settings.DATABASES["default"]["ENGINE"] == "django.db.backends.postgresql":
    _flush_by_delete()


@pytest.fixture(scope="session")
def django_db_setup(django_db_setup, django_db_blocker):
    """pytest-django's test database, its ids from N million on in xdist worker gwN
    (tests/workers.py, offset_sequences)."""
    from django.db import connection

    with django_db_blocker.unblock():
        workers.offset_sequences(connection, os.environ.get("PYTEST_XDIST_WORKER"))


@pytest.fixture
def owner(db) -> Person:
    return _person("owner@example.com")


@pytest.fixture
def teammate(owner: Person) -> Person:
    return _person("teammate@example.com", project=owner.project)


@pytest.fixture
def stranger(db) -> Person:
    return _person("stranger@example.com")


# A test under it carries the `postgres` marker too (tests/tiers.py).
postgres_only = pytest.mark.skipif(not settings.IS_POSTGRES, reason=tiers.POSTGRES_REASON)


@pytest.fixture
def h100(db):
    """The GPU most offer tests list."""
    return GpuModelFactory(slug="h100-sxm", name="H100 SXM 80GB", memory_gib=80)


@pytest.fixture(autouse=True)
def _fast_password_hasher(settings):
    # PBKDF2 costs about a second per user; the hasher is not what these tests are about.
    settings.PASSWORD_HASHERS = ["django.contrib.auth.hashers.MD5PasswordHasher"]


@pytest.fixture(autouse=True)
def _mail_in_memory(settings):
    settings.EMAIL_BACKEND = "django.core.mail.backends.locmem.EmailBackend"


@pytest.fixture(autouse=True)
def _no_outside_names(monkeypatch):
    """No test resolves a name through DNS (the network rule): a webhook URL's host resolves
    here only as an address literal or `localhost`, anything else as a name that does not
    resolve. A test about resolution stubs `notifications.addresses.resolve` itself."""
    import ipaddress

    from notifications import addresses

    sealed = addresses.resolve

    def resolve(host: str, port: int) -> list[str]:
        try:
            ipaddress.ip_address(host)
        except ValueError:
            if host != "localhost":
                why = f"The host {host!r} does not resolve to any address."
                raise addresses.UrlRefused("invalid_url", why, field="url") from None
        return sealed(host, port)

    monkeypatch.setattr(addresses, "resolve", resolve)


@pytest.fixture(autouse=True, scope="session")
def _celery_leaves_the_root_logger():
    """An in-process worker (celery.contrib.testing's `start_worker`) sets up Celery's logging,
    which by default (`worker_hijack_root_logger`) takes the root logger's handlers away: every
    later test of that process would log without the console handler of config/settings.py
    LOGGING. The product's workers run under `celery worker`, and are not concerned."""
    from config.celery import app

    app.conf.worker_hijack_root_logger = False


@pytest.fixture(autouse=True)
def _clear_cache():
    from django.core.cache import cache

    cache.clear()
    yield
    cache.clear()


@pytest.fixture(scope="session")
def browser():
    if not os.path.exists(CHROMIUM):
        pytest.fail(f"Browser tests need Debian's Chromium at {CHROMIUM}: apt-get install chromium")
    from playwright.sync_api import sync_playwright

    with sync_playwright() as playwright:
        browser = playwright.chromium.launch(
            executable_path=CHROMIUM,
            args=["--no-sandbox", "--disable-gpu", "--disable-background-networking"],
        )
        yield browser
        browser.close()


@pytest.fixture
def page(browser, live_server):
    context = browser.new_context(base_url=live_server.url, viewport={"width": 1280, "height": 900})
    page = context.new_page()
    yield page
    context.close()


def log_in(page, person: Person, password: str = "correct-horse-battery") -> None:
    page.goto("/accounts/login/")
    page.fill("input[name=username]", person.user.email)
    page.fill("input[name=password]", password)
    page.click("button[type=submit]")
    page.wait_for_url("**/clusters/")
