"""Two-factor sign-in: a TOTP device and recovery codes per user, on django-otp (docs/accounts.md,
"Two-factor sign-in").

A user's second factor is django-otp's rows: one confirmed `TOTPDevice` (an authenticator app)
and one `StaticDevice` named "recovery" holding ten single-use codes. A user with a confirmed
TOTP device is not logged in by a right password: the login view parks them here
(`park`), signed and for five minutes, until the verify page hears a code. Every code tried
there counts against the login's own limits (accounts/throttle.py), as a password does.
"""

import base64
import io
from dataclasses import dataclass

import qrcode
import qrcode.image.svg
from django.core import signing
from django.db import transaction
from django.db.models import Exists, OuterRef, QuerySet
from django.http import HttpRequest
from django_otp.plugins.otp_static.models import StaticDevice, StaticToken
from django_otp.plugins.otp_totp.models import TOTPDevice

from accounts import history
from accounts.models import Membership, Project, User

RECOVERY_CODES = 10
RECOVERY_DEVICE = "recovery"
AUTHENTICATOR = "Authenticator app"
# How long a right password waits for its code, and where the wait is kept.
PENDING_SECONDS = 5 * 60
PENDING_SESSION_KEY = "two_factor_pending"
_PENDING_SALT = "accounts.otp.pending"


@dataclass(frozen=True)
class Pending:
    """A user whose password was right and who owes a code: who, which auth backend said yes,
    and the page to go to after."""

    user: User
    backend: str
    next_url: str


def has_device(user: User) -> bool:
    """Whether the user has two-factor sign-in on: a confirmed TOTP device."""
    return TOTPDevice.objects.filter(user=user, confirmed=True).exists()


def required_but_missing(user: User) -> bool:
    """Whether one of `user`'s projects requires two-factor sign-in and they have not set it
    up. Reads no row while none requires it: the flag is on the user's row, which every request
    of a logged-in user loads anyway (`User.two_factor_required`, kept by `refresh_required`).
    A second factor is the person's sign-in, so a project that requires it requires it of its
    members in every project they sign in to."""
    return user.two_factor_required and not has_device(user)


def set_required(*, project: Project, required: bool) -> None:
    """Require (or stop requiring) two-factor sign-in of every member of `project`; the
    caller has checked the user is an owner."""
    with transaction.atomic():
        before = Project.objects.filter(pk=project.pk).values_list("require_two_factor", flat=True)
        history.note(
            summary=f"{'required' if required else 'stopped requiring'} two-factor sign-in of "
            "every member",
            obj=project,
            changes={"require_two_factor": history.change(bool(before.first()), required)},
        )
        Project.objects.filter(pk=project.pk).update(require_two_factor=required)
        project.require_two_factor = required
        refresh_required(User.objects.filter(memberships__project=project))


def refresh_required(users: QuerySet[User]) -> None:
    """Set `two_factor_required` of `users` from their memberships now: one UPDATE. Called when
    a project's requirement changes and when a membership comes or goes (accounts/apps.py)."""
    needs = Membership.objects.filter(user=OuterRef("pk"), project__require_two_factor=True)
    User.objects.filter(pk__in=users.values("pk")).update(two_factor_required=Exists(needs))


def refresh_member(sender: object, instance: Membership, **kwargs: object) -> None:
    """A membership saved or deleted: its user's requirement, again (a signal receiver)."""
    refresh_required(User.objects.filter(pk=instance.user_id))


# Turning it on and off.


def pending_setup(user: User) -> TOTPDevice:
    """The unconfirmed device the setup page shows: the one already begun, or a new one (a new
    secret), so reloading the page keeps the secret the app has scanned."""
    device = TOTPDevice.objects.filter(user=user, confirmed=False).order_by("pk").first()
    return device or TOTPDevice.objects.create(user=user, name=AUTHENTICATOR, confirmed=False)


@transaction.atomic
def confirm_setup(*, user: User, code: str) -> list[str] | None:
    """Confirm the pending device with a code from the app: it counts from now, and the user's
    recovery codes are made anew and returned (the only time they are shown). None when the
    code is wrong, or there is nothing to confirm."""
    device = (
        TOTPDevice.objects.select_for_update()
        .filter(user=user, confirmed=False)
        .order_by("pk")
        .first()
    )
    if device is None or not device.verify_token(_digits(code)):
        return None
    TOTPDevice.objects.filter(user=user).exclude(pk=device.pk).delete()
    device.confirmed = True
    device.save(update_fields=["confirmed"])
    history.note(
        summary="turned on two-factor sign-in",
        obj=user,
        changes={"two_factor": history.change("off", "on")},
    )
    return _new_recovery_codes(user)


@transaction.atomic
def renew_recovery_codes(*, user: User) -> list[str]:
    """Ten new recovery codes, the old ones void."""
    history.note(summary="made new two-factor recovery codes", obj=user)
    return _new_recovery_codes(user)


def recovery_codes_left(user: User) -> int:
    return StaticToken.objects.filter(device__user=user, device__name=RECOVERY_DEVICE).count()


@transaction.atomic
def turn_off(*, user: User) -> None:
    """Remove the user's second factor: their devices and recovery codes. The caller has just
    checked a current code (`verify`)."""
    TOTPDevice.objects.filter(user=user).delete()
    StaticDevice.objects.filter(user=user).delete()
    history.note(
        summary="turned off two-factor sign-in",
        obj=user,
        changes={"two_factor": history.change("on", "off")},
    )


def _new_recovery_codes(user: User) -> list[str]:
    StaticDevice.objects.filter(user=user, name=RECOVERY_DEVICE).delete()
    device = StaticDevice.objects.create(user=user, name=RECOVERY_DEVICE, confirmed=True)
    codes = [StaticToken.random_token() for _ in range(RECOVERY_CODES)]
    StaticToken.objects.bulk_create(StaticToken(device=device, token=code) for code in codes)
    return codes


# Checking a code.


def verify(user: User, code: str) -> bool:
    """Whether `code` is a current code of the user's app or one of their recovery codes; a
    recovery code is used up by it. Spaces and dashes are ignored, as is case."""
    cleaned = code.replace(" ", "").replace("-", "").strip().lower()
    if not cleaned or len(cleaned) > 16:
        return False
    if cleaned.isdigit():
        devices = TOTPDevice.objects.filter(user=user, confirmed=True)
        return any(device.verify_token(cleaned) for device in devices)
    with transaction.atomic():
        recovery = (
            StaticDevice.objects.select_for_update()
            .filter(user=user, name=RECOVERY_DEVICE, confirmed=True)
            .first()
        )
        return recovery is not None and recovery.verify_token(cleaned)


def _digits(code: str) -> str:
    return code.replace(" ", "").strip()


# The wait between the password and the code.


def park(request: HttpRequest, *, user: User, next_url: str) -> None:
    """Keep a user whose password was right, for PENDING_SECONDS, until they give a code."""
    backend = getattr(user, "backend", "django.contrib.auth.backends.ModelBackend")
    value = signing.dumps(
        {"user": user.pk, "backend": backend, "next": next_url}, salt=_PENDING_SALT
    )
    request.session[PENDING_SESSION_KEY] = value


def pending(request: HttpRequest) -> Pending | None:
    """The parked user, or None when there is none, or the wait is over (5 minutes)."""
    value = request.session.get(PENDING_SESSION_KEY)
    if not isinstance(value, str):
        return None
    try:
        data = signing.loads(value, salt=_PENDING_SALT, max_age=PENDING_SECONDS)
    except signing.BadSignature:  # SignatureExpired is one
        return None
    user = User.objects.filter(pk=data["user"], is_active=True).first()
    if user is None:
        return None
    return Pending(user=user, backend=data["backend"], next_url=data["next"])


def unpark(request: HttpRequest) -> None:
    request.session.pop(PENDING_SESSION_KEY, None)


# Showing the secret.


def otpauth_uri(device: TOTPDevice) -> str:
    """The otpauth:// URI an authenticator app scans (its issuer: settings.OTP_TOTP_ISSUER)."""
    uri: str = device.config_url
    return uri


def secret_text(device: TOTPDevice) -> str:
    """The secret in base32, in groups of four, for typing into an app by hand."""
    raw = base64.b32encode(device.bin_key).decode().rstrip("=")
    return " ".join(raw[i : i + 4] for i in range(0, len(raw), 4))


def qr_data_uri(uri: str) -> str:
    """The URI as a QR code, an SVG data: URI for an <img> (qrcode's pure-Python SVG writer, no
    image library; dark on white, so it scans on the dark theme too)."""
    image = qrcode.make(uri, image_factory=qrcode.image.svg.SvgPathFillImage, border=2)
    buffer = io.BytesIO()
    image.save(buffer)
    return "data:image/svg+xml;base64," + base64.b64encode(buffer.getvalue()).decode()
