"""The notification channels' pages (docs/notifications.md, "The page"): a project's signed
webhooks and Slack channels, adding one (a webhook's secret shown once), a test, removing one,
and each one's delivery log. Owners and managers only, as the permission table's
`notifications.manage` says; a developer gets the 403 page saying so, as on billing
(accounts/permissions.py `require_page`)."""

from django.contrib import messages
from django.contrib.auth.decorators import login_required
from django.core.paginator import Paginator
from django.http import HttpResponse
from django.shortcuts import get_object_or_404, redirect, render
from django.utils import timezone
from django.views.decorators.cache import never_cache
from django.views.decorators.http import require_GET, require_http_methods, require_POST

from accounts import permissions
from accounts.models import Project
from accounts.requests import ProjectRequest
from notifications import endpoints
from notifications.addresses import UrlRefused
from notifications.forms import EndpointForm
from notifications.models import SWITCH_OFF_AFTER, Delivery, Endpoint
from runcrate import outages

PAGE_SIZE = 50
# The id of the webhook just added, kept in the session until the list shows its secret, once.
NEW_ENDPOINT_SESSION_KEY = "notifications_new_endpoint"


def _notifications_project(request: ProjectRequest) -> Project:
    return permissions.require_page(request, endpoints.MANAGE)


def _get_endpoint_for_user(request: ProjectRequest, endpoint_id: int) -> Endpoint:
    """One of the request's project's endpoints (with its last success and failure); any other
    id is a 404."""
    project = _notifications_project(request)
    return get_object_or_404(endpoints.endpoints_of(project), pk=endpoint_id)


def _render_list(
    request: ProjectRequest,
    project: Project,
    *,
    form: EndpointForm | None = None,
    new_endpoint_id: object = None,
    status: int = 200,
) -> HttpResponse:
    listed = list(endpoints.endpoints_of(project))
    context = {
        "endpoints": listed,
        "form": form or EndpointForm(),
        "new_endpoint": next((e for e in listed if e.pk == new_endpoint_id), None),
        "switch_off_days": SWITCH_OFF_AFTER.days,
        "max_endpoints": endpoints.MAX_ENDPOINTS,
        "nav_section": "accounts",
    }
    return render(request, "notifications/list.html", context, status=status)


@never_cache  # the page after adding a webhook holds the one showing of its secret
@login_required
@require_GET
def endpoint_list(request: ProjectRequest) -> HttpResponse:
    project = _notifications_project(request)
    new_endpoint_id = request.session.pop(NEW_ENDPOINT_SESSION_KEY, None)
    return _render_list(request, project, new_endpoint_id=new_endpoint_id)


@login_required
@require_POST
@outages.committing
def add_endpoint(request: ProjectRequest) -> HttpResponse:
    project = _notifications_project(request)
    form = EndpointForm(request.POST)
    if form.is_valid():
        try:
            endpoint = endpoints.create_endpoint(
                project=project,
                user=request.user,
                url=form.cleaned_data["url"],
                events=form.cleaned_data["events"],
                kind=form.cleaned_data["kind"],
            )
        except (endpoints.EndpointRefused, UrlRefused) as refusal:
            form.add_error(refusal.field, refusal.message)
        else:
            if endpoint.kind == Endpoint.Kind.WEBHOOK:
                request.session[NEW_ENDPOINT_SESSION_KEY] = endpoint.pk
            messages.success(request, f"{endpoint.get_kind_display()} added: {endpoint.short_url}")
            return redirect("notifications:list")
    return _render_list(request, project, form=form, status=422)


@login_required
@require_GET
def deliveries(request: ProjectRequest, endpoint_id: int) -> HttpResponse:
    endpoint = _get_endpoint_for_user(request, endpoint_id)
    queryset = endpoint.deliveries.prefetch_related("tries").order_by("-created_at", "-pk")
    page = Paginator(queryset, PAGE_SIZE).get_page(request.GET.get("page"))
    context = {
        "endpoint": endpoint,
        "page": page,
        "switch_off_days": SWITCH_OFF_AFTER.days,
        "nav_section": "accounts",
    }
    return render(request, "notifications/deliveries.html", context)


@login_required
@require_POST
def send_test(request: ProjectRequest, endpoint_id: int) -> HttpResponse:
    endpoint = _get_endpoint_for_user(request, endpoint_id)
    ping = endpoints.send_test(endpoint=endpoint, now=timezone.now())
    ping.refresh_from_db()  # a switched-off endpoint's failed test is failed in the database
    if ping.state == Delivery.State.DELIVERED:
        messages.success(request, f"Test delivered: the endpoint answered {ping.last_status_code}.")
    elif ping.state == Delivery.State.PENDING:
        messages.error(
            request,
            f"Test not delivered: {ping.last_error or 'no answer'}. It is retried like any "
            "delivery: its attempts are in the log below.",
        )
    else:
        messages.error(
            request,
            f"Test not delivered: {ping.last_error or 'no answer'}. The channel stays switched "
            "off until a test it answers with a 2xx.",
        )
    return redirect("notifications:deliveries", endpoint_id=endpoint.pk)


@login_required
@require_http_methods(["GET", "POST"])
@outages.committing
def remove_endpoint(request: ProjectRequest, endpoint_id: int) -> HttpResponse:
    """A GET asks to confirm (the list's Remove is a link, so it works without JavaScript);
    the POST removes."""
    endpoint = _get_endpoint_for_user(request, endpoint_id)
    if request.method == "GET":
        context = {"endpoint": endpoint, "nav_section": "accounts"}
        return render(request, "notifications/remove.html", context)
    endpoints.remove_endpoint(endpoint=endpoint)
    messages.success(request, f"{endpoint.get_kind_display()} removed: {endpoint.short_url}")
    return redirect("notifications:list")
