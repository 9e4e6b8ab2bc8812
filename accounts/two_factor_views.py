"""The pages of two-factor sign-in: the login's second step, and the security page where a user
turns it on or off and an owner requires it of the project (accounts/otp.py holds the rules)."""

from django import forms
from django.contrib import messages
from django.contrib.auth import login
from django.contrib.auth.decorators import login_required
from django.http import HttpRequest, HttpResponse
from django.shortcuts import redirect, render
from django.views.decorators.cache import never_cache
from django.views.decorators.http import require_http_methods, require_POST

from accounts import history, otp, permissions, throttle
from accounts.models import User
from accounts.requests import ProjectRequest

VERIFY_TEMPLATE = "accounts/two_factor_verify.html"
SECURITY_TEMPLATE = "accounts/two_factor.html"
WRONG_CODE = "That code is not right, or was already used. Check the time on your phone."


class CodeForm(forms.Form):
    code = forms.CharField(
        label="Code",
        max_length=32,
        widget=forms.TextInput(
            attrs={"autocomplete": "one-time-code", "autofocus": True, "spellcheck": "false"}
        ),
        help_text="The 6 digits your authenticator app shows, or one of your recovery codes.",
    )


class RequireForm(forms.Form):
    require_two_factor = forms.BooleanField(
        required=False, label="Require two-factor sign-in of every member"
    )


def _check_code(request: HttpRequest, form: CodeForm, user: User) -> bool:
    """Whether the form holds a right code of `user`, each try counted against the login's
    limits (the same as a password's); a refusal or a wrong code is put on the form."""
    if not form.is_valid():
        return False
    try:
        throttle.check("login", request, email=user.email)
        if otp.verify(user, form.cleaned_data["code"]):
            return True
        throttle.count("login", request, email=user.email)
    except throttle.Throttled as refusal:
        form.add_error(None, forms.ValidationError(refusal.message, code=refusal.code))
        return False
    history.note(summary="failed a two-factor code", obj=user, user=user, outcome="refused")
    form.add_error("code", WRONG_CODE)
    return False


def _status(form: CodeForm) -> int:
    for error in form.errors.as_data().get("__all__", []):
        if error.code in throttle.Throttled.STATUS:
            return throttle.Throttled.STATUS[error.code]
    return 200


@never_cache
@require_http_methods(["GET", "POST"])
def verify(request: HttpRequest) -> HttpResponse:
    """The login's second step: a right password was given less than 5 minutes ago."""
    parked = otp.pending(request)
    if parked is None:
        messages.error(request, "Your sign-in timed out: enter your email and password again.")
        return redirect("accounts:login")
    form = CodeForm(request.POST or None)
    if request.method == "POST":
        if _check_code(request, form, parked.user):
            otp.unpark(request)
            login(request, parked.user, backend=parked.backend)
            return redirect(parked.next_url)
        return render(request, VERIFY_TEMPLATE, {"form": form}, status=_status(form))
    return render(request, VERIFY_TEMPLATE, {"form": form})


def _is_owner(request: ProjectRequest) -> bool:
    """Whether the user may require two-factor sign-in of the project (the permission table)."""
    return permissions.allowed(permissions.request_role(request), "project.require_two_factor")


def _render_security(request: ProjectRequest, status: int = 200, **extra: object) -> HttpResponse:
    user = request.user
    project = request.project
    context: dict[str, object] = {
        "enabled": otp.has_device(user),
        "codes_left": otp.recovery_codes_left(user),
        "required": otp.required_but_missing(user),
        "project": project,
        "is_owner": _is_owner(request),
        "code_form": CodeForm(),
        **extra,
    }
    if context["is_owner"] and "require_form" not in context:
        context["require_form"] = RequireForm(
            initial={"require_two_factor": project.require_two_factor}
        )
    return render(request, SECURITY_TEMPLATE, context, status=status)


@never_cache
@login_required
def security(request: ProjectRequest) -> HttpResponse:
    return _render_security(request)


@never_cache
@login_required
@require_http_methods(["GET", "POST"])
def setup(request: ProjectRequest) -> HttpResponse:
    """Turning it on: the secret of a device not yet counted, and a code from the app to
    confirm it (only then does it count, and the recovery codes are shown, once)."""
    if otp.has_device(request.user):
        return redirect("accounts:security")
    device = otp.pending_setup(request.user)
    uri = otp.otpauth_uri(device)
    form = CodeForm(request.POST or None)
    if request.method == "POST" and form.is_valid():
        try:
            throttle.take("login", request, email=request.user.email)
        except throttle.Throttled as refusal:
            form.add_error(None, forms.ValidationError(refusal.message, code=refusal.code))
        else:
            codes = otp.confirm_setup(user=request.user, code=form.cleaned_data["code"])
            if codes is not None:
                messages.success(request, "Two-factor sign-in is on.")
                return _render_security(request, recovery_codes=codes)
            history.note(
                summary="failed a two-factor code (turning it on)",
                obj=request.user,
                outcome="refused",
            )
            form.add_error("code", WRONG_CODE)
    context = {
        "form": form,
        "uri": uri,
        "secret": otp.secret_text(device),
        "qr": otp.qr_data_uri(uri),
    }
    return render(request, "accounts/two_factor_setup.html", context, status=_status(form))


@never_cache
@login_required
@require_POST
def recovery_codes(request: ProjectRequest) -> HttpResponse:
    """New recovery codes (the old ones stop working), for a current code."""
    form = CodeForm(request.POST)
    if not otp.has_device(request.user):
        return redirect("accounts:security")
    if not _check_code(request, form, request.user):
        return _render_security(request, status=_status(form), code_form=form)
    codes = otp.renew_recovery_codes(user=request.user)
    return _render_security(request, recovery_codes=codes)


@never_cache
@login_required
@require_POST
def turn_off(request: ProjectRequest) -> HttpResponse:
    form = CodeForm(request.POST)
    if not otp.has_device(request.user):
        return redirect("accounts:security")
    if not _check_code(request, form, request.user):
        return _render_security(request, status=_status(form), code_form=form)
    otp.turn_off(user=request.user)
    messages.success(request, "Two-factor sign-in is off: your password alone signs you in.")
    return redirect("accounts:security")


@login_required
@require_POST
def require(request: ProjectRequest) -> HttpResponse:
    """An owner requires (or stops requiring) two-factor sign-in of the project's members."""
    if not _is_owner(request):
        return _render_security(
            request, status=403, require_error="Only an owner of the project may change this."
        )
    form = RequireForm(request.POST)
    form.is_valid()  # a checkbox: always valid, missing is off
    wanted = bool(form.cleaned_data.get("require_two_factor"))
    project = request.project
    if wanted and not otp.has_device(request.user):
        return _render_security(
            request,
            status=422,
            require_form=form,
            require_error="Turn on two-factor sign-in for yourself first.",
        )
    otp.set_required(project=project, required=wanted)
    state = "now required of" if wanted else "no longer required of"
    messages.success(request, f"Two-factor sign-in is {state} every member of {project.name}.")
    return redirect("accounts:security")
