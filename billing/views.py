"""The Billing page, a cluster's per-machine rows, CSV export, card top-ups, the Stripe webhook,
the environments (budgets) page and the invoices. Rules live in
billing/{usage,payments,budgets,invoices}.py."""

import csv
import logging
from decimal import Decimal
from urllib.parse import urlencode, urlsplit

from django.conf import settings
from django.contrib import messages
from django.contrib.auth.decorators import login_required
from django.db.models import Model
from django.http import Http404, HttpRequest, HttpResponse
from django.http.request import RawPostDataException
from django.shortcuts import redirect, render
from django.urls import Resolver404, resolve, reverse
from django.utils import timezone
from django.utils.http import url_has_allowed_host_and_scheme
from django.views.decorators.cache import never_cache
from django.views.decorators.csrf import csrf_exempt
from django.views.decorators.http import require_GET, require_http_methods, require_POST

import audit
from accounts import permissions
from accounts.models import Environment
from accounts.projects import get_for_project, require_project
from accounts.requests import ProjectRequest
from billing import budgets, invoices, payments, usage
from billing.charts import spend_chart
from billing.context_processors import (
    BANNER_COOKIE,
    BANNER_COOKIE_SECONDS,
    banner_state,
    request_summary,
)
from billing.forms import BillingDetailsForm, BudgetForm, EnvironmentForm, TopUpForm
from billing.models import BillingDetails, Payment
from runcrate import outages
from runcrate.money import plain, usd

logger = logging.getLogger(__name__)


# Logged in, in a project, and allowed to see billing (owners and managers): a developer gets
# the 403 page with the permission table's sentence.
billing_view = permissions.page_requires("billing.view")


def _month(request: ProjectRequest) -> tuple[usage.Month, str]:
    """The month asked for (`?month=YYYY-MM`, default the current one), and "" ; or, for a
    month that is not one, the current month and a sentence saying so: a bad link shows the
    page with a message, never a 404 (docs/billing.md)."""
    raw = request.GET.get("month", "")
    try:
        return usage.Month.parse(raw), ""
    except usage.MonthInvalid:
        current = usage.Month.of(timezone.now())
        return current, (
            f"There is no month {raw.strip()[:20]!r}: a month is written YYYY-MM, like "
            f"{current.param}. Showing {current.label}."
        )


def _page_number(request: ProjectRequest) -> int:
    raw = request.GET.get("page", "1")
    return int(raw) if raw.isdigit() and int(raw) > 0 else 1


def _month_context(request: ProjectRequest, month: usage.Month) -> dict:
    project = request.project
    now = timezone.now()
    # The lines of clusters still billed come to now (docs/billing.md, "One cost").
    page = usage.statement_page(
        project_id=project.pk, month=month, number=_page_number(request), now=now, live=True
    )
    months = usage.months_since(project.created_at, now=now)
    if month not in months:
        months = sorted({*months, month}, reverse=True)
    return {
        "month": month,
        "months": months,
        "is_current_month": month == usage.Month.of(now),
        "totals": usage.month_totals(project_id=project.pk, month=month),
        "chart": spend_chart(usage.spend_per_day(project_id=project.pk, month=month)),
        "page": page,
        "lines": page.lines,
    }


@billing_view
@require_GET
@never_cache  # the balance, and a fresh Idempotency-Key in the Add credit form
def index(request: ProjectRequest) -> HttpResponse:
    month, notice = _month(request)
    context = _month_context(request, month)
    context["month_notice"] = notice
    status = 400 if notice else 200
    if request.htmx and request.htmx.target == "billing-month":
        return render(request, "billing/index.html#month", context, status=status)
    context.update(_top_context(request))
    return render(request, "billing/index.html", context, status=status)


def _top_context(request: ProjectRequest, form: TopUpForm | None = None) -> dict:
    project = request.project
    return_to = _return_to(request)
    return {
        "return_to": return_to,
        "return_label": _return_label(return_to),
        # The top bar's summary when it has one (one burn rate a request), else the project's.
        "summary": request_summary(request) or usage.summary(project_id=project.pk),
        "can_add_credit": payments.can_add_credit(),
        "demo_payments": payments.demo_payments(),
        "support_email": settings.RUNCRATE_SUPPORT_EMAIL,
        "topup_form": form
        or TopUpForm(initial={"idempotency_key": payments.new_idempotency_key()}),
        "min_topup": payments.MIN_TOPUP,
    }


def _billed_cluster(request: ProjectRequest, cluster_id: int) -> Model:
    # The project's clusters through its relation: billing does not import clusters.
    clusters = require_project(request).clusters.select_related("machine_type")
    return get_for_project(request, clusters, pk=cluster_id)


@billing_view
@require_GET
def cluster_usage(request: ProjectRequest, cluster_id: int) -> HttpResponse:
    """A cluster line opened: one row per machine for the month (htmx), or a page of its own."""
    cluster = _billed_cluster(request, cluster_id)
    month, notice = _month(request)
    collapsed = request.GET.get("collapsed") == "1"
    now = timezone.now()  # the rows the page's line shows (docs/billing.md, "One cost")
    rows = [] if collapsed else usage.machine_rows(cluster=cluster, month=month, now=now)
    context = {
        "cluster": cluster,
        "month": month,
        "collapsed": collapsed,
        "rows": rows,
        "total": sum((row.cost for row in rows), Decimal("0.00")),
        "total_seconds": sum(row.seconds for row in rows),
        "month_notice": notice,
    }
    status = 400 if notice else 200
    if request.htmx:
        return render(request, "billing/cluster_usage.html#machines", context, status=status)
    return render(request, "billing/cluster_usage.html", context, status=status)


@billing_view
@require_GET
def export_csv(request: ProjectRequest) -> HttpResponse:
    month, notice = _month(request)
    if notice:  # a file of the wrong month would mislead: back to the page, which says why
        messages.error(request, notice.replace(f" Showing {month.label}.", ""))
        return redirect("billing:index")
    response = HttpResponse(content_type="text/csv; charset=utf-8")
    response["Content-Disposition"] = f'attachment; filename="runcrate-billing-{month.param}.csv"'
    writer = csv.writer(response)
    for row in usage.csv_rows(project_id=request.project.pk, month=month):
        writer.writerow(row)
    return response


# ---- top-ups ---------------------------------------------------------------------------------


@billing_view
@require_POST
def add_credit(request: ProjectRequest) -> HttpResponse:
    if not payments.can_add_credit():
        messages.error(
            request,
            f"Card payments are not available here; contact {settings.RUNCRATE_SUPPORT_EMAIL}.",
        )
        return redirect("billing:index")
    form = TopUpForm(request.POST)
    if not form.is_valid():
        context = _month_context(request, usage.Month.of(timezone.now()))
        context.update(_top_context(request, form=form))
        return render(request, "billing/index.html", context, status=422)
    try:
        payment = payments.start_checkout(
            project=request.project,
            user=request.user,
            amount=form.cleaned_data["amount"],
            idempotency_key=form.cleaned_data["idempotency_key"],
        )
    except payments.PaymentRefused as refusal:
        messages.error(request, refusal.message)
        kept = Payment.objects.filter(
            project=request.project,
            idempotency_key=form.cleaned_data["idempotency_key"],
        ).first()
        if kept is None:
            return redirect("billing:index")
        _remember_return(request, kept)
        return redirect("billing:payment", pk=kept.pk)
    _remember_return(request, payment)
    return redirect(payment.checkout_url, permanent=False)


# Where a top-up returns once paid (`next`: the create form that needed it), kept in the session
# by payment, so Stripe's page in between needs to know nothing of it (docs/billing.md).
PAYMENT_RETURNS = "billing_payment_returns"


def _return_to(request: ProjectRequest) -> str:
    """A page of this site to go back to after paying (`next`), or ""."""
    back = request.POST.get("next") or request.GET.get("next") or ""
    safe = back.startswith("/") and url_has_allowed_host_and_scheme(
        back, allowed_hosts={request.get_host()}, require_https=request.is_secure()
    )
    return back if safe else ""


def _return_label(path: str) -> str:
    if not path:
        return ""
    try:
        view_name = resolve(urlsplit(path).path).view_name
    except Resolver404:
        return "Back to where you were"
    return "Back to the create form" if view_name == "clusters:new" else "Back to where you were"


def _remember_return(request: ProjectRequest, payment: Payment) -> None:
    return_to = _return_to(request)
    if return_to:
        returns = dict(request.session.get(PAYMENT_RETURNS, {}))
        returns[str(payment.pk)] = return_to
        request.session[PAYMENT_RETURNS] = returns


def _payment_return(request: ProjectRequest, payment: Payment) -> dict[str, str]:
    """The page a payment returns to, its button's words (none: Billing is the way back), and
    the way to Billing for another try, which keeps it."""
    return_to = request.session.get(PAYMENT_RETURNS, {}).get(str(payment.pk), "")
    billing_back = reverse("billing:index")
    if return_to:  # Billing again keeps the way back, for a second try
        billing_back += "?" + urlencode({"next": return_to})
    return {
        "return_to": return_to,
        "return_label": _return_label(return_to),
        "billing_back": billing_back + "#topup-title",
    }


def _payment_for_user(request: ProjectRequest, pk: int) -> Payment:
    return get_for_project(request, Payment.objects.all(), pk=pk)


@billing_view
@require_GET
def payment_detail(request: ProjectRequest, pk: int) -> HttpResponse:
    """Where Stripe sends the user back: pending until the webhook has credited the payment."""
    payment = _payment_for_user(request, pk)
    pending = payments.is_pending(payment)
    context = {
        "payment": payment,
        "pending": pending,
        "cancelled": request.GET.get("cancelled") == "1",
        "back_from_stripe": bool(request.GET.get("session_id")),
        "demo": payments.is_demo(payment),
        # A demo payment waits for its Pay button, not for Stripe: nothing to poll for.
        "polling": pending
        and not payment.last_error
        and payment.status != Payment.Status.CREATED
        and not payments.is_demo(payment),
        **_payment_return(request, payment),
    }
    if request.htmx:
        response = render(request, "billing/payment.html#status", context)
        if not context["polling"]:
            response.status_code = 286  # htmx: stop polling
        return response
    return render(request, "billing/payment.html", context)


@billing_view
@require_POST
def payment_retry(request: ProjectRequest, pk: int) -> HttpResponse:
    payment = _payment_for_user(request, pk)
    try:
        payment = payments.retry_checkout(payment=payment)
    except payments.PaymentRefused as refusal:
        messages.error(request, refusal.message)
        return redirect("billing:payment", pk=payment.pk)
    if payment.checkout_url and payments.is_pending(payment):
        return redirect(payment.checkout_url, permanent=False)
    return redirect("billing:payment", pk=payment.pk)


@login_required
@require_POST
def dismiss_banner(request: ProjectRequest) -> HttpResponse:
    """The low-balance banner's Dismiss: a cookie with the state it was dismissed in, so it
    comes back when that changes (billing/context_processors.py `banner_state`)."""
    state = banner_state(request)
    if request.htmx:
        response = HttpResponse("")
    else:
        back = request.POST.get("next", "")
        if not url_has_allowed_host_and_scheme(
            back, allowed_hosts={request.get_host()}, require_https=request.is_secure()
        ):
            back = reverse("billing:index")
        response = redirect(back)
    if state is not None:
        response.set_cookie(
            BANNER_COOKIE,
            state,
            max_age=BANNER_COOKIE_SECONDS,
            samesite="Lax",
            httponly=True,
            secure=request.is_secure(),
        )
    return response


def _demo_payment_for_user(request: ProjectRequest, pk: int) -> Payment:
    """A demo payment of the user's project; a 404 outside the demo or with Stripe keys set."""
    if not payments.demo_payments():
        raise Http404("There are no demo payments here.")
    payment = _payment_for_user(request, pk)
    if not payments.is_demo(payment):
        raise Http404("This is not a demo payment.")
    return payment


@billing_view
@require_GET
def demo_checkout(request: ProjectRequest, pk: int) -> HttpResponse:
    """The demo's stand-in for Stripe's payment page: an amount and a Pay button, no card."""
    payment = _demo_payment_for_user(request, pk)
    if not payments.is_pending(payment):
        return redirect("billing:payment", pk=payment.pk)
    context = {"payment": payment, **_payment_return(request, payment)}
    return render(request, "billing/demo_checkout.html", context)


@billing_view
@require_POST
def demo_pay(request: ProjectRequest, pk: int) -> HttpResponse:
    """The demo page's Pay: the signed event Stripe would send, through the webhook's path."""
    payment = _demo_payment_for_user(request, pk)
    result = payments.confirm_demo_payment(payment=payment)
    logger.info("demo payment %s: %s", payment.pk, result.outcome)
    return redirect("billing:payment", pk=payment.pk)


@csrf_exempt
@require_POST
def stripe_webhook(request: HttpRequest) -> HttpResponse:
    """Stripe's signed events; anything not signed with our secret, or stale, is a 400."""
    try:
        payload = request.body
    except RawPostDataException:
        # A form body (multipart) already read as a form by a middleware: never Stripe's JSON.
        return HttpResponse(
            "Rejected: a Stripe event is a JSON body, not a form.\n",
            status=400,
            content_type="text/plain",
        )
    try:
        result = payments.handle_webhook(
            payload=payload, signature=request.headers.get("Stripe-Signature")
        )
    except payments.WebhookRejected as rejected:
        logger.warning("Stripe webhook rejected: %s", rejected)
        return HttpResponse(f"Rejected: {rejected}\n", status=400, content_type="text/plain")
    return HttpResponse(f"{result.outcome}\n", content_type="text/plain")


# ---- environments and budgets ------------------------------------------------------------------


def _environments_context(
    request: ProjectRequest,
    *,
    forms: dict[int, BudgetForm] | None = None,
    create_form: EnvironmentForm | None = None,
) -> dict:
    project = request.project
    rows = budgets.environment_budgets(project=project)
    forms = forms or {}
    return {
        "rows": [
            (
                row,
                forms.get(row.environment.pk)
                or BudgetForm(
                    initial={"monthly_budget": row.budget}, prefix=f"env-{row.environment.pk}"
                ),
            )
            for row in rows
        ],
        "create_form": create_form or EnvironmentForm(),
        "month_start": budgets.month_start(),
    }


@billing_view
@require_http_methods(["GET", "POST"])
def environments(request: ProjectRequest) -> HttpResponse:
    """The project's environments with their budgets; POST creates one."""
    if request.method == "POST":
        form = EnvironmentForm(request.POST)
        if form.is_valid():
            try:
                environment = budgets.create_environment(
                    project=request.project,
                    name=form.cleaned_data["name"],
                    monthly_budget=form.cleaned_data["monthly_budget"],
                )
            except budgets.BudgetRefused as refusal:
                form.add_error(refusal.field or None, refusal.message)
            else:
                messages.success(request, f"Environment {environment.name} created.")
                return redirect("billing:environments")
        context = _environments_context(request, create_form=form)
        return render(request, "billing/environments.html", context, status=422)
    return render(request, "billing/environments.html", _environments_context(request))


@permissions.page_requires("budgets.manage")
@require_POST
@outages.committing
def set_budget(request: ProjectRequest, name: str) -> HttpResponse:
    environment = get_for_project(request, Environment.objects.all(), name=name)
    form = BudgetForm(request.POST, prefix=f"env-{environment.pk}")
    if not form.is_valid():
        context = _environments_context(request, forms={environment.pk: form})
        return render(request, "billing/environments.html", context, status=422)
    amount = form.cleaned_data["monthly_budget"]
    before = environment.monthly_budget
    try:
        stops = budgets.set_budget(
            environment=environment, amount=amount, confirm=request.POST.get("confirm") == "yes"
        )
    except budgets.BudgetBelowSpend as refusal:
        # One click must not stop (and wipe) every running cluster: say what it stops, and ask.
        context = {
            "environment": environment,
            "amount": refusal.amount,
            "stops": refusal.stops,
            "field_name": form["monthly_budget"].html_name,
        }
        return render(request, "billing/confirm_budget.html", context)
    audit.record(request, changes={"monthly_budget": _change(before, environment.monthly_budget)})
    if environment.monthly_budget is None:
        messages.success(request, f"{environment.name} has no monthly budget any more.")
    else:
        stopping = stops.clusters if stops else []
        messages.success(
            request,
            f"{environment.name}: monthly budget set to {usd(environment.monthly_budget)}."
            + (
                f" It is reached: {len(stopping)} cluster{'s' if len(stopping) != 1 else ''} "
                f"({', '.join(c.name for c in stopping)}) stop within a minute."
                if stopping
                else ""
            ),
        )
    return redirect(reverse("billing:environments"))


def _change(before: Decimal | None, after: Decimal | None) -> dict[str, str | None]:
    """A budget's before and after for the audit log, as the API writes money ("500.00")."""
    return {"before": plain(before), "after": plain(after)}


# ---- invoices ----------------------------------------------------------------------------------


def _invoices_context(request: ProjectRequest, form: BillingDetailsForm | None = None) -> dict:
    project = request.project
    return {
        "months": invoices.invoice_months(project=project, now=timezone.now()),
        "current_month": usage.Month.of(timezone.now()),
        "details_form": form or BillingDetailsForm(instance=invoices.details_of(project)),
        "seller": invoices.seller_lines(),
    }


@billing_view
@require_GET
def invoice_list(request: ProjectRequest) -> HttpResponse:
    """The months with an invoice, and the billing details they are made out to."""
    return render(request, "billing/invoices.html", _invoices_context(request))


@billing_view
@require_POST
def invoice_details(request: ProjectRequest) -> HttpResponse:
    """Save the billing details; invalid ones change nothing and say why (422)."""
    project = request.project
    form = BillingDetailsForm(
        request.POST, instance=invoices.details_of(project) or BillingDetails(project=project)
    )
    if not form.is_valid():
        return render(
            request, "billing/invoices.html", _invoices_context(request, form=form), status=422
        )
    form.save()
    messages.success(request, "Billing details saved: every invoice is made out to them.")
    return redirect("billing:invoices")


@billing_view
@require_GET
def invoice(request: ProjectRequest, month: str) -> HttpResponse:
    """One month's invoice; a month that is not one, in the future or without lines is a 404."""
    try:
        found = invoices.invoice_for(
            project=request.project, month=usage.Month.parse(month), now=timezone.now()
        )
    except (usage.MonthInvalid, invoices.NoInvoice) as refusal:
        raise Http404(refusal.message) from None
    return render(request, "billing/invoice.html", {"invoice": found})
