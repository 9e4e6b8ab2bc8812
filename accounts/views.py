from urllib.parse import urlencode

from django import forms
from django.conf import settings
from django.contrib import messages
from django.contrib.auth import login
from django.contrib.auth import views as auth_views
from django.contrib.auth.decorators import login_required
from django.core.exceptions import PermissionDenied
from django.http import Http404, HttpRequest, HttpResponse
from django.shortcuts import redirect, render
from django.urls import reverse
from django.utils import timezone
from django.utils.http import url_has_allowed_host_and_scheme
from django.views.decorators.cache import never_cache
from django.views.decorators.http import require_http_methods, require_POST
from django_htmx.http import HttpResponseClientRedirect

from accounts import invitations, keys, members, otp, permissions, throttle
from accounts.forms import ApiKeyForm, InviteForm, RoleForm, SignupForm, SshKeyForm
from accounts.models import ApiKey, Invitation, Membership, Project, SshKey
from accounts.projects import SESSION_KEY, get_for_project, require_project
from accounts.requests import ProjectRequest
from accounts.signup import EmailTaken, sign_up
from runcrate import outages


@require_http_methods(["GET", "POST"])
def signup(request: HttpRequest) -> HttpResponse:
    if request.user.is_authenticated:
        return redirect(settings.LOGIN_REDIRECT_URL)
    invitation = invitations.from_link(_next_url(request), now=timezone.now())
    invited_email = invitation.email if invitation else None
    form = SignupForm(request.POST or None, invited_email=invited_email)
    if request.method == "POST":
        try:
            # Every request counts, before anything is checked: the form also tells whether an
            # email has an account.
            email = invited_email or str(request.POST.get("email", ""))
            throttle.take("signup", request, email=email)
        except throttle.Throttled as refusal:
            form = SignupForm(initial={"email": email}, invited_email=invited_email)
            context = {"form": form, "refusal": refusal.message, "invitation": invitation}
            response = render(request, "accounts/signup.html", context, status=refusal.status)
            return _retry_after(response, refusal)
    if request.method == "POST" and form.is_valid():
        try:
            user = sign_up(
                email=form.cleaned_data["email"], password=form.cleaned_data["password1"]
            )
        except EmailTaken:
            form.add_error("email", "An account with this email already exists.")
        else:
            login(request, user, backend="django.contrib.auth.backends.ModelBackend")
            return redirect(_next_url(request) or settings.LOGIN_REDIRECT_URL)
    context = {"form": form, "next": _next_url(request), "invitation": invitation}
    return render(request, "accounts/signup.html", context)


def _retry_after(response: HttpResponse, refusal: throttle.Throttled) -> HttpResponse:
    response["Retry-After"] = str(max(1, refusal.seconds_left))
    return response


def _throttled(form) -> str | None:
    """The code of the limits' refusal among the form's errors, if it has one."""
    for error in form.errors.as_data().get("__all__", []):
        if error.code in throttle.Throttled.STATUS:
            return error.code
    return None


class LoginView(auth_views.LoginView):
    """Django's login view, answering 429 while the account or the address is locked out, and
    503 while the limits cannot be counted (no password is checked then)."""

    def form_valid(self, form):
        # A user with two-factor sign-in on is not logged in yet: the code is asked next.
        user = form.get_user()
        if otp.has_device(user):
            otp.park(self.request, user=user, next_url=self.get_success_url())
            return redirect("accounts:two_factor_verify")
        return super().form_valid(form)

    def form_invalid(self, form):
        response = super().form_invalid(form)
        code = _throttled(form)
        if code is not None:
            response.status_code = throttle.Throttled.STATUS[code]
            if code == "limits_unavailable":
                response["Retry-After"] = str(throttle.UNAVAILABLE_RETRY_SECONDS)
        return response


class PasswordResetView(auth_views.PasswordResetView):
    """Django's reset view; each request with a valid email counts against the limits, and a
    request past them sends nothing."""

    def form_valid(self, form):
        try:
            throttle.take("password_reset", self.request, email=form.cleaned_data["email"])
        except throttle.Throttled as refusal:
            form.add_error(None, forms.ValidationError(refusal.message, code=refusal.code))
            response = self.form_invalid(form)
            response.status_code = refusal.status
            return _retry_after(response, refusal)
        return super().form_valid(form)


def _project(request: ProjectRequest) -> Project:
    return require_project(request)


def _next_url(request: HttpRequest) -> str:
    """A page of this site to return to after adding a key, or ""."""
    next_url = request.POST.get("next") or request.GET.get("next") or ""
    safe = url_has_allowed_host_and_scheme(
        next_url, allowed_hosts={request.get_host()}, require_https=request.is_secure()
    )
    return next_url if safe else ""


def _render_account(request: ProjectRequest, partial: str, **extra: object) -> HttpResponse:
    """The account page, or only one of its sections when htmx asks for it."""
    project = request.project
    context: dict[str, object] = {
        "project": project,
        "next": _next_url(request),
        "api_key_form": ApiKeyForm(),
        "ssh_key_form": SshKeyForm(),
        **extra,
    }
    if project:  # a lazy object: falsy, never None, for a user in no project
        context["environments"] = project.environments.all()
        api_keys = list(keys.project_api_keys(project))
        in_project = SshKey.objects.filter(project=project).select_related("created_by")
        ssh_keys = list(in_project.order_by("name", "pk"))
        context["api_keys"], context["ssh_keys"] = api_keys, ssh_keys
        # *Revoke* and *Remove* only where the rule allows them (accounts/keys.py).
        roles = keys.holders_roles(project)
        context["removable_api_keys"] = keys.removable(
            user=request.user, keys=api_keys, roles=roles
        )
        context["removable_ssh_keys"] = keys.removable(
            user=request.user, keys=ssh_keys, roles=roles
        )
    template = f"accounts/account.html#{partial}" if request.htmx else "accounts/account.html"
    return render(request, template, context)


@login_required
def account(request: ProjectRequest) -> HttpResponse:
    return _render_account(request, "api_keys")


@login_required
def ssh_keys(request: ProjectRequest) -> HttpResponse:
    """The SSH keys section; `?next=` (e.g. the create-cluster page) is where adding returns."""
    next_url = _next_url(request)
    query = f"?{urlencode({'next': next_url})}" if next_url else ""
    return redirect(reverse("accounts:account") + query + "#ssh-keys")


@never_cache  # the response holds the one copy of the new key: no cache may keep it
@permissions.page_requires("keys.own")
@require_POST
@outages.committing
def create_api_key(request: ProjectRequest) -> HttpResponse:
    project = _project(request)
    form = ApiKeyForm(request.POST)
    if form.is_valid():
        try:
            key, raw = keys.issue_api_key(
                user=request.user,
                project=project,
                name=form.cleaned_data["name"],
                scopes=form.chosen_scopes(),
                max_machines_per_cluster=form.cleaned_data["max_machines_per_cluster"],
                max_usd_per_hour=form.cleaned_data["max_usd_per_hour"],
            )
        except keys.KeyRefused as refusal:
            form.add_error(refusal.field or "name", refusal.message)
        else:
            return _render_account(request, "api_keys", new_key=key, new_key_raw=raw)
    return _render_account(request, "api_keys", api_key_form=form)


def _confirm(request: ProjectRequest, **context: object) -> HttpResponse:
    return render(request, "accounts/confirm.html", context)


@permissions.page_requires("keys.own")
@require_http_methods(["GET", "POST"])
@outages.committing
def revoke_api_key(request: ProjectRequest, pk: int) -> HttpResponse:
    key = get_for_project(request, ApiKey.objects.all(), pk=pk)
    if (refusal := keys.removal_refusal(user=request.user, key=key)) is not None:
        raise PermissionDenied(refusal.message)
    if request.method == "GET":
        return _confirm(
            request,
            title=f"Revoke the API key '{key.name}'?",
            detail=(
                f"Programs using the key {key.prefix}… stop working at once. This cannot be "
                "undone; you can create a new key afterwards."
            ),
            action=reverse("accounts:revoke_api_key", args=[key.pk]),
            button="Revoke key",
        )
    revoked = keys.revoke_api_key(key=key, by=request.user)
    notice = f"API key '{key.name}' revoked." if revoked else None
    if request.htmx:
        return _render_account(request, "api_keys", api_keys_notice=notice)
    if notice:
        messages.success(request, notice)
    return redirect(reverse("accounts:account") + "#api-keys")


@permissions.page_requires("keys.own")
@require_POST
@outages.committing
def add_ssh_key(request: ProjectRequest) -> HttpResponse:
    project = _project(request)
    form = SshKeyForm(request.POST)
    added = None
    if form.is_valid():
        try:
            added = keys.add_ssh_key(
                project=project,
                user=request.user,
                name=form.cleaned_data["name"],
                public_key=form.cleaned_data["public_key"],
            )
        except keys.KeyRefused as refusal:
            form.add_error(refusal.field, refusal.message)
    if added is None:
        return _render_account(request, "ssh_keys", ssh_key_form=form)
    notice = f"SSH key '{added.name}' added."
    next_url = _next_url(request)
    if request.htmx and not next_url:
        return _render_account(request, "ssh_keys", ssh_keys_notice=notice)
    messages.success(request, notice)
    if request.htmx:
        return HttpResponseClientRedirect(next_url)
    return redirect(next_url or reverse("accounts:account") + "#ssh-keys")


@permissions.page_requires("keys.own")
@require_http_methods(["GET", "POST"])
@outages.committing
def remove_ssh_key(request: ProjectRequest, pk: int) -> HttpResponse:
    key = get_for_project(request, SshKey.objects.all(), pk=pk)
    if (refusal := keys.removal_refusal(user=request.user, key=key)) is not None:
        raise PermissionDenied(refusal.message)
    if request.method == "GET":
        return _confirm(
            request,
            title=f"Remove the SSH key '{key.name}'?",
            detail=(
                f"New clusters will no longer accept {key.fingerprint}. Clusters already "
                "running keep it on their machines until they are terminated."
            ),
            action=reverse("accounts:remove_ssh_key", args=[key.pk]),
            button="Remove key",
        )
    keys.remove_ssh_key(key=key, by=request.user)
    notice = f"SSH key '{key.name}' removed."
    if request.htmx:
        return _render_account(request, "ssh_keys", ssh_keys_notice=notice)
    messages.success(request, notice)
    return redirect(reverse("accounts:account") + "#ssh-keys")


# --- members and invitations (docs/accounts.md, "Members and invitations") ----------------------


def _team_project(request: ProjectRequest) -> Project:
    """The request's project, for a member whose role may see the team; a developer gets a
    403, as on the billing pages."""
    return permissions.require_page(request, "team.view")


def _render_members(
    request: ProjectRequest, project: Project, *, status: int = 200, **extra: object
) -> HttpResponse:
    role = permissions.request_role(request)
    context = {
        "project": project,
        "members": members.rows_of(project),
        "invitations": invitations.pending(project, now=timezone.now()).select_related(
            "invited_by"
        ),
        "invite_form": InviteForm(),
        "roles": Membership.Role.choices,
        "role_legend": permissions.legend(),
        "may_touch_owners": permissions.allowed(role, "team.make_owner"),
        "nav_section": "accounts",
        **extra,
    }
    return render(request, "accounts/members.html", context, status=status)


@login_required
def team(request: ProjectRequest) -> HttpResponse:
    return _render_members(request, _team_project(request))


@login_required
@require_POST
@outages.committing
def invite(request: ProjectRequest) -> HttpResponse:
    project = _team_project(request)
    form = InviteForm(request.POST)
    if form.is_valid():
        try:
            invitation = invitations.invite(
                project=project,
                by=request.user,
                email=form.cleaned_data["email"],
                role=form.cleaned_data["role"],
                now=timezone.now(),
            )
        except (invitations.InvitationRefused, permissions.PermissionRefused) as refusal:
            form.add_error(refusal.field, refusal.message)
        else:
            messages.success(request, f"Invitation sent to {invitation.email}.")
            return redirect("accounts:members")
    return _render_members(request, project, invite_form=form, status=422)


def _member(request: ProjectRequest, pk: int) -> Membership:
    return get_for_project(request, Membership.objects.select_related("user"), pk=pk)


def _refused(request: ProjectRequest, project: Project, refusal) -> HttpResponse:
    return _render_members(request, project, refusal=refusal.message, status=refusal.status)


@login_required
@require_POST
@outages.committing
def change_role(request: ProjectRequest, pk: int) -> HttpResponse:
    project = _team_project(request)
    membership = _member(request, pk)
    form = RoleForm(request.POST)
    if not form.is_valid():
        return _render_members(request, project, refusal="Choose a role.", status=422)
    try:
        members.change_role(
            project=project, by=request.user, membership=membership, role=form.cleaned_data["role"]
        )
    except (members.MembershipRefused, permissions.PermissionRefused) as refusal:
        return _refused(request, project, refusal)
    messages.success(request, f"{membership.user.email} is now a {form.cleaned_data['role']}.")
    return redirect("accounts:members")


@login_required
@require_POST
@outages.committing
def remove_member(request: ProjectRequest, pk: int) -> HttpResponse:
    project = require_project(request)
    membership = _member(request, pk)
    leaving = membership.user_id == request.user.pk
    if not leaving:
        project = _team_project(request)
    try:
        members.remove_member(project=project, by=request.user, membership=membership)
    except (members.MembershipRefused, permissions.PermissionRefused) as refusal:
        if leaving and not permissions.allowed(membership.role, "team.view"):
            raise PermissionDenied(refusal.message) from None
        return _refused(request, project, refusal)
    if leaving:
        request.session.pop(SESSION_KEY, None)
        messages.success(request, f"You left {project.name}.")
        return redirect(settings.LOGIN_REDIRECT_URL)
    messages.success(request, f"{membership.user.email} was removed from {project.name}.")
    return redirect("accounts:members")


@login_required
@require_POST
@outages.committing
def revoke_invitation(request: ProjectRequest, pk: int) -> HttpResponse:
    project = _team_project(request)
    invitation = get_for_project(request, Invitation.objects.all(), pk=pk)
    try:
        invitations.revoke(invitation=invitation, by=request.user)
    except permissions.PermissionRefused as refusal:
        return _refused(request, project, refusal)
    messages.success(request, f"The invitation of {invitation.email} was withdrawn.")
    return redirect("accounts:members")


@require_http_methods(["GET", "POST"])
def invitation(request: HttpRequest, token: str) -> HttpResponse:
    """The link in the invitation email. Anyone may open it: a link that does not work says
    why (410 used or expired, 404 unknown); a visitor is asked to log in or sign up and comes
    back here (`next`); the invited user joins with a POST (the button), never on a GET."""
    now = timezone.now()
    try:
        found = invitations.find(token, now=now)
    except invitations.InvitationRefused as refusal:
        page = {"refusal": refusal.message}
        return render(request, "accounts/invitation.html", page, status=refusal.status)
    context: dict[str, object] = {"invitation": found, "next": request.path}
    if request.method == "POST" and request.user.is_authenticated:
        try:
            membership = invitations.accept(token=token, user=request.user, now=now)
        except invitations.InvitationRefused as refusal:
            context["refusal"] = refusal.message
            return render(request, "accounts/invitation.html", context, status=refusal.status)
        request.session[SESSION_KEY] = membership.project_id
        messages.success(request, f"You joined {membership.project.name} as a {membership.role}.")
        return redirect(settings.LOGIN_REDIRECT_URL)
    return render(request, "accounts/invitation.html", context)


@login_required
@require_POST
def switch_project(request: ProjectRequest) -> HttpResponse:
    """The top bar's project switcher: only a project the user is a member of."""
    raw = str(request.POST.get("project", ""))
    if (
        not raw.isdigit()
        or not Membership.objects.filter(user=request.user, project_id=int(raw)).exists()
    ):
        raise Http404("You are not a member of that project.")
    request.session[SESSION_KEY] = int(raw)
    return redirect(settings.LOGIN_REDIRECT_URL)
