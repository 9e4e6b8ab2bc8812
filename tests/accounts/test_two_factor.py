"""Two-factor sign-in: a user with TOTP on is not logged in by the password alone; the right
code (or a recovery code, once) logs in; wrong codes count against the login's limits; an owner
may require it of every member (accounts/otp.py, docs/accounts.md)."""

import re
import time
import zlib
from datetime import UTC, datetime, timedelta

import pytest
import time_machine
from django.contrib.auth import get_user
from django.test import Client
from django_otp.oath import totp
from django_otp.plugins.otp_totp.models import TOTPDevice

from accounts import otp
from accounts.models import Membership, User

PASSWORD = "correct-horse-battery"
LOGIN, VERIFY, SECURITY = "/accounts/login/", "/accounts/login/verify/", "/accounts/security/"
SETUP = "/accounts/security/setup/"


def _inside_the_login_windows(*values: str, period: int = 15 * 60, room: int = 120) -> datetime:
    """A moment from now with at least `room` seconds left in the login limits' fixed window of
    every value. django-ratelimit ends a value's window at a multiple of the period plus the
    value's crc32 (django_ratelimit.core._get_window): a test that moves the clock by a minute
    from an arbitrary instant would cross the end of one now and then, and its counts restart."""
    start = int(time.time())
    for moment in range(start, start + period, 5):
        ends = []
        for value in values:
            end = moment - moment % period + zlib.crc32(value.encode()) % period
            ends.append(end + period if end < moment else end)
        if all(end - moment >= room for end in ends):
            return datetime.fromtimestamp(moment, tz=UTC)
    raise AssertionError("no moment inside every window")  # cannot happen with room < period / 2


@pytest.fixture(autouse=True)
def _frozen():
    # The limits count in windows of the clock, and a TOTP code is the clock's: frozen, moved,
    # well inside the windows of the owner's account and of the test client's address.
    moment = _inside_the_login_windows("owner@example.com", "127.0.0.1")
    with time_machine.travel(moment, tick=False) as traveller:
        yield traveller


def code_of(device: TOTPDevice) -> str:
    """The code the user's app shows now, from the device's key by django-otp's own totp."""
    device.refresh_from_db()
    value = totp(device.bin_key, step=device.step, t0=device.t0, digits=device.digits)
    return f"{value:0{device.digits}d}"


def turn_on(user: User) -> tuple[TOTPDevice, list[str]]:
    device = otp.pending_setup(user)
    codes = otp.confirm_setup(user=user, code=code_of(device))
    assert codes is not None
    return device, codes


def log_in(client: Client, user: User, **extra: str):
    return client.post(LOGIN, {"username": user.email, "password": PASSWORD, **extra})


def text(response) -> str:
    return response.content.decode()


def test_it_does_not_log_in_with_the_password_alone(owner, client):
    turn_on(owner.user)

    response = log_in(client, owner.user)

    assert response.status_code == 302
    assert response["Location"] == VERIFY
    assert not get_user(client).is_authenticated
    assert client.get("/clusters/")["Location"] == "/accounts/login/?next=/clusters/"
    assert client.get("/accounts/")["Location"].startswith(LOGIN)


def test_the_admin_login_does_not_open_with_the_password_alone(client, db):
    staff = User.objects.create_superuser(email="staff@example.com", password=PASSWORD)
    turn_on(staff)

    response = client.post(
        "/admin/login/?next=/admin/", {"username": staff.email, "password": PASSWORD}
    )

    assert "signs in with a second factor" in text(response)
    assert not get_user(client).is_authenticated
    other = User.objects.create_superuser(email="other@example.com", password=PASSWORD)
    opened = client.post(
        "/admin/login/?next=/admin/", {"username": other.email, "password": PASSWORD}
    )
    assert opened.status_code == 302 and get_user(client) == other  # no device: as before


def test_it_logs_in_with_the_right_code_and_goes_to_next(owner, client, _frozen):
    device, _ = turn_on(owner.user)
    _frozen.shift(timedelta(seconds=30))  # the code used to confirm cannot be used again
    log_in(client, owner.user, next="/accounts/")

    page = client.get(VERIFY)
    assert page.status_code == 200
    assert 'name="code"' in text(page) and "csrfmiddlewaretoken" in text(page)

    response = client.post(VERIFY, {"code": code_of(device)})

    assert response.status_code == 302
    assert response["Location"] == "/accounts/"
    assert get_user(client) == owner.user
    assert client.get(VERIFY)["Location"] == LOGIN  # nothing parked any more


def test_it_refuses_a_wrong_code_and_limits_codes_as_passwords(owner, client, _frozen):
    device, _ = turn_on(owner.user)
    log_in(client, owner.user)

    wrong = client.post(VERIFY, {"code": "000000" if code_of(device) != "000000" else "111111"})
    assert wrong.status_code == 200
    assert "That code is not right" in text(wrong)
    assert not get_user(client).is_authenticated

    for _ in range(4):
        _frozen.shift(timedelta(seconds=5))  # past django-otp's own growing delay
        client.post(VERIFY, {"code": "12345x"})
    _frozen.shift(timedelta(seconds=30))

    refused = client.post(VERIFY, {"code": code_of(device)})

    assert refused.status_code == 429
    assert "Too many failed logins for this account" in text(refused)
    assert not get_user(client).is_authenticated
    # The same limit as the password's: the password is refused too now.
    assert log_in(Client(), owner.user).status_code == 429


def test_it_forgets_a_right_password_after_five_minutes(owner, client, _frozen):
    device, _ = turn_on(owner.user)
    log_in(client, owner.user)

    _frozen.shift(timedelta(minutes=5, seconds=1))
    response = client.post(VERIFY, {"code": code_of(device)})

    assert response["Location"] == LOGIN
    assert not get_user(client).is_authenticated


def test_it_takes_a_recovery_code_once(owner, _frozen):
    _, codes = turn_on(owner.user)
    assert len(codes) == 10 and len(set(codes)) == 10

    first = Client()
    log_in(first, owner.user)
    assert first.post(VERIFY, {"code": codes[0].upper()})["Location"] == "/clusters/"
    assert get_user(first) == owner.user
    assert otp.recovery_codes_left(owner.user) == 9

    second = Client()
    log_in(second, owner.user)
    _frozen.shift(timedelta(seconds=5))
    again = second.post(VERIFY, {"code": codes[0]})

    assert again.status_code == 200
    assert "That code is not right, or was already used" in text(again)
    assert not get_user(second).is_authenticated


def test_it_logs_in_a_user_without_a_device_as_before(owner, teammate, client):
    turn_on(teammate.user)  # someone else's device changes nothing for this user

    response = log_in(client, owner.user)

    assert response["Location"] == "/clusters/"
    assert get_user(client) == owner.user


def test_it_turns_on_only_with_a_confirming_code(owner, _frozen):
    client = owner.browser_client()
    page = client.get(SETUP)
    assert page.status_code == 200
    assert "otpauth://totp/" in text(page) and "data:image/svg+xml;base64," in text(page)
    device = TOTPDevice.objects.get(user=owner.user)
    assert not device.confirmed and not otp.has_device(owner.user)
    assert client.get(SETUP).context["uri"] == page.context["uri"]  # the same secret on reload

    wrong = client.post(SETUP, {"code": "not a code"})
    assert "That code is not right" in text(wrong)
    assert client.post(SETUP, {"code": ""}).status_code == 200
    assert not otp.has_device(owner.user)

    _frozen.shift(timedelta(seconds=5))
    done = client.post(SETUP, {"code": code_of(device)})

    assert done.status_code == 200
    assert otp.has_device(owner.user)
    shown = re.findall(r"<li><code>([a-z2-7]+)</code></li>", text(done))
    assert len(shown) == 10
    assert "Turn off" in text(client.get(SECURITY))
    assert not re.findall(r"<li><code>", text(client.get(SECURITY)))  # shown once only


def test_it_turns_off_only_with_a_current_code(owner, _frozen):
    device, codes = turn_on(owner.user)
    client = owner.browser_client()

    refused = client.post("/accounts/security/turn-off/", {"code": "999999x"})
    assert "That code is not right" in text(refused)
    assert otp.has_device(owner.user)

    _frozen.shift(timedelta(seconds=30))
    client.post("/accounts/security/turn-off/", {"code": code_of(device)})

    assert not otp.has_device(owner.user)
    assert otp.recovery_codes_left(owner.user) == 0
    assert log_in(Client(), owner.user)["Location"] == "/clusters/"


def test_it_renews_recovery_codes_for_a_current_code(owner, _frozen):
    _, codes = turn_on(owner.user)
    client = owner.browser_client()

    response = client.post("/accounts/security/recovery-codes/", {"code": codes[0]})

    fresh = re.findall(r"<li><code>([a-z2-7]+)</code></li>", text(response))
    assert len(fresh) == 10 and not set(fresh) & set(codes)
    assert not otp.verify(owner.user, codes[1])
    _frozen.shift(timedelta(seconds=5))  # past django-otp's delay after a wrong code
    assert otp.verify(owner.user, fresh[0])


def test_a_required_project_sends_a_member_without_a_device_to_set_it_up(owner, teammate):
    turn_on(owner.user)
    owner_client = owner.browser_client()
    assert owner_client.post("/accounts/security/require/", {"require_two_factor": "on"})[
        "Location"
    ] == (SECURITY)
    owner.project.refresh_from_db()
    assert owner.project.require_two_factor

    client = teammate.browser_client()
    for path in ("/clusters/", "/accounts/", "/billing/"):
        assert client.get(path)["Location"] == SECURITY
    assert client.get(SECURITY).status_code == 200
    assert "requires two-factor sign-in of every member" in text(client.get(SECURITY))
    assert client.get(SETUP).status_code == 200
    assert client.post("/accounts/logout/")["Location"] == LOGIN
    # API keys are not affected; the owner, who has a device, goes anywhere.
    assert teammate.api().get("/api/v1/me").status_code == 200
    assert owner_client.get("/clusters/").status_code == 200


def test_only_an_owner_with_a_device_may_require_it(owner, teammate):
    turn_on(teammate.user)
    refused = teammate.browser_client().post(
        "/accounts/security/require/", {"require_two_factor": "on"}
    )
    assert refused.status_code == 403

    without = owner.browser_client().post(
        "/accounts/security/require/", {"require_two_factor": "on"}
    )
    assert without.status_code == 422
    assert "Turn on two-factor sign-in for yourself first." in text(without)

    owner.project.refresh_from_db()
    assert not owner.project.require_two_factor


def test_the_requirement_reads_no_row_when_off(owner, django_assert_num_queries):
    with django_assert_num_queries(0):  # the flag is on the user's row the request has
        assert not otp.required_but_missing(owner.user)
    otp.set_required(project=owner.project, required=True)
    owner.user.refresh_from_db()
    assert owner.user.two_factor_required
    with django_assert_num_queries(1):  # then the device
        assert otp.required_but_missing(owner.user)


def test_a_member_joining_or_leaving_a_requiring_project_is_flagged_or_not(owner, stranger):
    otp.set_required(project=owner.project, required=True)
    joined = Membership.objects.create(project=owner.project, user=stranger.user, role="developer")
    stranger.user.refresh_from_db()
    assert stranger.user.two_factor_required
    joined.delete()
    stranger.user.refresh_from_db()
    assert not stranger.user.two_factor_required
    otp.set_required(project=owner.project, required=False)
    owner.user.refresh_from_db()
    assert not owner.user.two_factor_required


def test_the_pages_refuse_get_where_they_change_something(owner):
    client = owner.browser_client()
    for path in ("turn-off/", "recovery-codes/", "require/"):
        assert client.get(SECURITY + path).status_code == 405
    assert Client(enforce_csrf_checks=True).post(VERIFY, {"code": "1"}).status_code == 403
