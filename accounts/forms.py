from typing import Any
from urllib.parse import urlsplit

from django import forms
from django.conf import settings
from django.contrib.admin.forms import AdminAuthenticationForm
from django.contrib.auth import forms as auth_forms
from django.contrib.auth import password_validation

from accounts import otp, throttle
from accounts.keys import NAME_MAX_LENGTH
from accounts.models import ApiKey, Membership, User
from accounts.signup import normalize_email


class ThrottledLogin(auth_forms.AuthenticationForm):
    """A login form whose failures are counted, per account and per client address, and that
    refuses to try once either limit is used up, or while the limits cannot be counted (the
    cache does not answer: no password is checked uncounted; accounts/throttle.py)."""

    def clean(self) -> dict[str, Any]:
        email = str(self.data.get("username", ""))
        if self.request is not None:
            try:
                throttle.check("login", self.request, email=email)
            except throttle.Throttled as refusal:
                raise forms.ValidationError(refusal.message, code=refusal.code) from None
        try:
            return super().clean()
        except forms.ValidationError:
            if self.request is not None:
                try:
                    throttle.count("login", self.request, email=email)
                except throttle.Throttled as refusal:
                    raise forms.ValidationError(refusal.message, code=refusal.code) from None
            raise


class LoginForm(ThrottledLogin, auth_forms.AuthenticationForm):
    """Django's login form; the email is matched whatever its case."""

    error_messages = {
        **auth_forms.AuthenticationForm.error_messages,
        "invalid_login": "That email and password do not match an account.",
    }

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.fields["username"].label = "Email"
        self.fields["username"].widget.input_type = "email"
        self.fields["username"].widget.attrs["autocomplete"] = "email"

    def clean_username(self) -> str:
        return normalize_email(self.cleaned_data.get("username", ""))


class SignupForm(forms.Form):
    email = forms.EmailField(
        max_length=254, widget=forms.EmailInput(attrs={"autocomplete": "email", "autofocus": True})
    )
    password1 = forms.CharField(
        label="Password",
        strip=False,
        widget=forms.PasswordInput(attrs={"autocomplete": "new-password"}),
        help_text="At least 8 characters, not a common password, not only digits.",
    )
    password2 = forms.CharField(
        label="Password again",
        strip=False,
        widget=forms.PasswordInput(attrs={"autocomplete": "new-password"}),
    )

    def __init__(self, *args: Any, invited_email: str | None = None, **kwargs: Any) -> None:
        """`invited_email`: sign-up through an invitation's link makes that email's account, so
        the field is filled in and fixed (a posted email is ignored)."""
        super().__init__(*args, **kwargs)
        if invited_email:
            self.initial["email"] = invited_email
            email = self.fields["email"]
            email.disabled = True
            email.help_text = (
                "The email you were invited as: the invitation lets only this account join."
            )

    def clean_email(self) -> str:
        email = normalize_email(self.cleaned_data["email"])
        if User.objects.filter(email__iexact=email).exists():
            raise forms.ValidationError(
                "An account with this email already exists: log in, or reset its password."
            )
        return email

    def clean(self) -> dict[str, Any]:
        super().clean()
        cleaned = self.cleaned_data
        password1, password2 = cleaned.get("password1"), cleaned.get("password2")
        if password1 and password2 and password1 != password2:
            self.add_error("password2", "The two passwords differ.")
        elif password1:
            try:
                password_validation.validate_password(
                    password1, User(email=cleaned.get("email") or "")
                )
            except forms.ValidationError as error:
                self.add_error("password1", error)
        return cleaned


class AdminLoginForm(ThrottledLogin, AdminAuthenticationForm):
    """The admin's login, counted like the dashboard's (staff accounts are worth the most). It
    asks for no second factor, so a user who has one turned on is sent to the dashboard's
    login, which does (docs/accounts.md, "Two-factor sign-in"): the password alone never opens
    the admin to them."""

    def confirm_login_allowed(self, user: User) -> None:
        super().confirm_login_allowed(user)
        if otp.has_device(user):
            raise forms.ValidationError(
                "This account signs in with a second factor: log in on the dashboard's login "
                "page (/accounts/login/?next=/admin/), then open the admin.",
                code="two_factor",
            )


class PasswordResetForm(auth_forms.PasswordResetForm):
    """Also lets a user with no password yet (made by `issue_api_key --create-user`) set one:
    owning the mailbox is the proof, as it is for everyone else."""

    def get_users(self, email: str):
        return User.objects.filter(email__iexact=normalize_email(email), is_active=True)

    def save(self, *args: Any, **kwargs: Any) -> None:
        # The link points at SITE_URL, never at the request's Host header: a forged Host would
        # otherwise mail the account's owner a link to someone else's site, token included.
        site = urlsplit(settings.SITE_URL)
        kwargs.update(domain_override=site.netloc, use_https=site.scheme == "https")
        super().save(*args, **kwargs)


class ApiKeyForm(forms.Form):
    """A new API key: its name, and optionally the scopes and limits that narrow it for an
    agent. The rules (which scopes, what limits) are `accounts.keys`'s; this only reads them."""

    FULL, SCOPED = "full", "scoped"

    name = forms.CharField(
        max_length=NAME_MAX_LENGTH,
        widget=forms.TextInput(attrs={"placeholder": "e.g. laptop CLI, CI pipeline"}),
        help_text="What uses this key, so you know which one to revoke.",
    )
    access = forms.ChoiceField(
        choices=[(FULL, "Every scope"), (SCOPED, "Only the scopes ticked below")],
        initial=FULL,
        required=False,
        widget=forms.RadioSelect,
    )
    scopes = forms.MultipleChoiceField(
        choices=ApiKey.Scope.choices, required=False, widget=forms.CheckboxSelectMultiple
    )
    max_machines_per_cluster = forms.CharField(
        label="Most machines per cluster",
        required=False,
        widget=forms.NumberInput(attrs={"min": 1, "step": 1, "placeholder": "no limit"}),
        help_text="A cluster it creates or grows has at most this many machines.",
    )
    max_usd_per_hour = forms.CharField(
        label="Most USD per hour",
        required=False,
        widget=forms.NumberInput(attrs={"min": "0.01", "step": "0.01", "placeholder": "no limit"}),
        help_text="The live clusters it created cost at most this much per hour, together.",
    )

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        # Its own ids: the account page also holds the SSH key form, whose `name` is `id_name`.
        kwargs.setdefault("auto_id", "id_api_key_%s")
        super().__init__(*args, **kwargs)

    def chosen_scopes(self) -> list[str] | None:
        """The scopes ticked, or None (every scope) unless the key is narrowed."""
        if self.cleaned_data.get("access") != self.SCOPED:
            return None
        return self.cleaned_data.get("scopes") or []


class SshKeyForm(forms.Form):
    name = forms.CharField(
        max_length=NAME_MAX_LENGTH,
        required=False,
        widget=forms.TextInput(attrs={"placeholder": "e.g. work laptop"}),
        help_text="Leave empty to use the key's comment.",
    )
    public_key = forms.CharField(
        label="Public key",
        strip=True,
        widget=forms.Textarea(
            attrs={"rows": 3, "placeholder": "ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAA… you@laptop"}
        ),
        help_text="The one line in your .pub file, e.g. the output of 'cat ~/.ssh/id_ed25519.pub'.",
    )


class InviteForm(forms.Form):
    email = forms.EmailField(max_length=254)
    role = forms.ChoiceField(choices=Membership.Role.choices, initial=Membership.Role.DEVELOPER)


class RoleForm(forms.Form):
    role = forms.ChoiceField(choices=Membership.Role.choices)
