"""Logins, sign-ups and password resets are limited per account and per client address, with
"try again in N minutes", and nothing done past a limit (accounts/throttle.py)."""

from datetime import timedelta

import pytest
import time_machine
from django.contrib.auth import get_user
from django.core import mail
from django.test import Client
from django.utils import timezone

from accounts.models import User

PASSWORD = "correct-horse-battery"
LOGIN, SIGNUP, RESET = "/accounts/login/", "/accounts/signup/", "/accounts/password-reset/"


@pytest.fixture(autouse=True)
def _frozen():
    # The limits count in windows of the clock; a frozen one keeps a test inside one window.
    with time_machine.travel(timezone.now(), tick=False) as traveller:
        yield traveller


def log_in(client: Client, email: str, password: str, address: str = "10.0.0.1"):
    return client.post(LOGIN, {"username": email, "password": password}, REMOTE_ADDR=address)


def text(response) -> str:
    return response.content.decode()


def test_it_locks_an_account_out_after_five_failed_logins(owner, client, _frozen):
    for _ in range(5):
        assert "do not match an account" in text(log_in(client, owner.user.email, "wrong"))

    # Even the right password, even from another address, is refused while it is locked.
    locked = log_in(client, owner.user.email, PASSWORD, address="10.9.9.9")

    assert locked.status_code == 429
    assert "Too many failed logins for this account: try again in" in text(locked)
    assert " minutes." in text(locked) or " minute." in text(locked)
    assert not get_user(client).is_authenticated

    _frozen.shift(timedelta(minutes=16))
    assert log_in(client, owner.user.email, PASSWORD).status_code == 302
    assert get_user(client) == owner.user


def test_it_counts_an_unknown_email_like_a_real_one(db, client):
    for _ in range(5):
        log_in(client, "nobody@example.com", "guess")

    assert "Too many failed logins for this account" in text(
        log_in(client, "nobody@example.com", "guess")
    )


def test_it_limits_one_address_trying_many_accounts(owner, client):
    for n in range(30):
        log_in(client, f"guess-{n}@example.com", "wrong", address="10.0.0.7")

    refused = log_in(client, owner.user.email, PASSWORD, address="10.0.0.7")
    elsewhere = log_in(Client(), owner.user.email, PASSWORD, address="10.0.0.8")

    assert refused.status_code == 429
    assert "Too many failed logins from your address: try again in" in text(refused)
    assert elsewhere.status_code == 302


def test_it_counts_the_address_a_trusted_proxy_names(owner, client, settings):
    settings.RUNCRATE_CLIENT_IP_HEADER = "X-Forwarded-For"
    for n in range(30):
        client.post(
            LOGIN,
            {"username": f"guess-{n}@example.com", "password": "wrong"},
            REMOTE_ADDR="10.0.0.1",
            HTTP_X_FORWARDED_FOR="spoofed, 203.0.113.9",
        )

    # Another client behind the same proxy is not the one that failed.
    other = Client().post(
        LOGIN,
        {"username": owner.user.email, "password": PASSWORD},
        REMOTE_ADDR="10.0.0.1",
        HTTP_X_FORWARDED_FOR="198.51.100.4",
    )
    same = client.post(
        LOGIN,
        {"username": owner.user.email, "password": PASSWORD},
        REMOTE_ADDR="10.0.0.1",
        HTTP_X_FORWARDED_FOR="203.0.113.9",
    )

    assert other.status_code == 302
    assert same.status_code == 429


def test_it_locks_the_admin_login_out_too(client, db):
    User.objects.create_superuser("staff@example.com", password=PASSWORD)
    for _ in range(5):
        client.post("/admin/login/", {"username": "staff@example.com", "password": "wrong"})

    locked = client.post("/admin/login/", {"username": "staff@example.com", "password": PASSWORD})

    assert "Too many failed logins for this account: try again in" in text(locked)
    assert not get_user(client).is_authenticated


def test_it_limits_sign_ups_from_one_address_and_creates_nothing_past_it(client, db):
    for n in range(10):
        response = client.post(
            SIGNUP,
            {"email": f"new-{n}@example.com", "password1": "a-long-passphrase", "password2": "x"},
            REMOTE_ADDR="10.0.0.3",
        )
        assert response.status_code == 200  # the passwords differ: nothing made, but counted

    refused = Client().post(
        SIGNUP,
        {
            "email": "real@example.com",
            "password1": "a-long-passphrase",
            "password2": "a-long-passphrase",
        },
        REMOTE_ADDR="10.0.0.3",
    )

    assert refused.status_code == 429
    assert "Too many sign-ups from your address: try again in" in text(refused)
    assert not User.objects.exists()


def test_it_limits_sign_ups_for_one_email(client, owner):
    for n in range(5):
        client.post(SIGNUP, {"email": owner.user.email}, REMOTE_ADDR=f"10.0.1.{n}")

    refused = client.post(SIGNUP, {"email": owner.user.email}, REMOTE_ADDR="10.0.2.1")

    assert refused.status_code == 429
    assert "Too many sign-ups for this account: try again in" in text(refused)
    assert "already exists" not in text(refused)


def test_it_sends_three_reset_emails_an_hour_for_one_account(owner, client, _frozen):
    for n in range(3):
        assert (
            client.post(RESET, {"email": owner.user.email}, REMOTE_ADDR=f"10.0.3.{n}").status_code
            == 302
        )

    refused = client.post(RESET, {"email": owner.user.email}, REMOTE_ADDR="10.0.4.1")

    assert refused.status_code == 429
    assert "Too many password reset requests for this account: try again in" in text(refused)
    assert len(mail.outbox) == 3
    _frozen.shift(timedelta(hours=1, minutes=1))
    assert client.post(RESET, {"email": owner.user.email}).status_code == 302
    assert len(mail.outbox) == 4


def test_it_limits_reset_requests_from_one_address(owner, client):
    for n in range(10):
        client.post(RESET, {"email": f"someone-{n}@example.com"}, REMOTE_ADDR="10.0.5.1")

    refused = client.post(RESET, {"email": owner.user.email}, REMOTE_ADDR="10.0.5.1")

    assert refused.status_code == 429
    assert "from your address" in text(refused)
    assert mail.outbox == []


@pytest.fixture
def cache_down(settings):
    """Nothing listens on port 1: every cache call fails. The default cache forgives it (pages
    keep working); the limits' cache raises, and the limits fail closed."""
    dead = {
        "LOCATION": "redis://127.0.0.1:1/0",
        "OPTIONS": {"socket_connect_timeout": 0.2, "socket_timeout": 0.2},
    }
    settings.CACHES = {
        "default": {"BACKEND": "runcrate.cache.ForgivingRedisCache", **dead},
        "limits": {"BACKEND": "django.core.cache.backends.redis.RedisCache", **dead},
    }
    settings.RATELIMIT_USE_CACHE = "limits"


def assert_paused(response, doing: str) -> None:
    assert response.status_code == 503
    assert int(response["Retry-After"]) >= 1
    assert f"{doing} is paused for a moment: we cannot count attempts right now" in text(response)


def test_it_checks_no_password_while_the_limits_cannot_be_counted(owner, client, cache_down):
    """Fail closed (docs/security.md): the right password is refused too, since a wrong one
    could not be counted; nobody is logged in."""
    assert_paused(log_in(client, owner.user.email, "wrong"), "Logging in")
    assert_paused(log_in(client, owner.user.email, PASSWORD), "Logging in")
    assert not get_user(client).is_authenticated


def test_it_refuses_the_admin_login_while_the_limits_cannot_be_counted(client, db, cache_down):
    User.objects.create_superuser(email="staff@example.com", password=PASSWORD)

    response = client.post(
        "/admin/login/?next=/admin/", {"username": "staff@example.com", "password": PASSWORD}
    )

    assert "is paused for a moment" in text(response)
    assert not get_user(client).is_authenticated


def test_it_creates_no_user_and_sends_no_reset_while_the_limits_cannot_be_counted(
    owner, client, cache_down
):
    signup = client.post(
        SIGNUP, {"email": "new@example.com", "password1": PASSWORD, "password2": PASSWORD}
    )
    assert_paused(signup, "Signing up")
    assert not User.objects.filter(email="new@example.com").exists()

    assert_paused(client.post(RESET, {"email": owner.user.email}), "Asking for a password reset")
    assert mail.outbox == []


def test_a_logged_in_user_keeps_working_while_the_cache_is_down(owner, cache_down):
    assert owner.browser_client().get("/clusters/").status_code == 200
    assert owner.api().get("/api/v1/me").status_code == 200


def test_it_lets_logins_in_again_once_the_cache_answers(owner, client, settings, cache_down):
    assert log_in(client, owner.user.email, PASSWORD).status_code == 503

    settings.CACHES = {
        "default": {"BACKEND": "django.core.cache.backends.locmem.LocMemCache"},
        "limits": {"BACKEND": "django.core.cache.backends.locmem.LocMemCache"},
    }

    assert log_in(client, owner.user.email, PASSWORD).status_code == 302
    assert get_user(client) == owner.user


def test_it_counts_requests_without_an_email_by_their_address_only(client, db):
    for n in range(6):
        client.post(SIGNUP, {"email": ""}, REMOTE_ADDR=f"10.0.6.{n}")

    # Six blank sign-ups from six addresses lock no one out.
    response = client.post(SIGNUP, {"email": "", "password1": "x"}, REMOTE_ADDR="10.0.7.1")

    assert response.status_code == 200
