"""Staff see the ledger (read-only: lines are only ever added) and add credit through a form,
or from the Project admin's "Add credit" action, which billing adds: it registers accounts'
Project admin again with the action (accounts knows nothing of billing)."""

from decimal import Decimal

from django import forms
from django.contrib import admin, messages
from django.core.exceptions import PermissionDenied
from django.db.models import QuerySet
from django.http import HttpRequest, HttpResponse, HttpResponseRedirect
from django.shortcuts import render
from django.urls import reverse

from accounts.admin import ProjectAdmin as AccountsProjectAdmin
from accounts.models import Project, User
from billing import ledger
from billing.models import LedgerEntry
from runcrate.admin import ReadOnlyAdmin, money_column
from runcrate.money import signed_usd, usd


class CreditForm(forms.Form):
    project = forms.ModelChoiceField(queryset=Project.objects.order_by("name"))
    amount = forms.CharField(
        help_text="USD, at most 2 decimals. A negative amount debits the project."
    )
    note = forms.CharField(max_length=255, required=False, help_text="Shown on the ledger line.")

    def clean_amount(self) -> Decimal:
        try:
            return ledger.parse_amount(self.cleaned_data["amount"])
        except ledger.InvalidAmount as error:
            raise forms.ValidationError(str(error)) from None


@admin.register(LedgerEntry)
class LedgerEntryAdmin(admin.ModelAdmin):
    list_display = (
        "created_at",
        "project",
        "kind",
        money_column("amount", "amount", format=signed_usd),
        "note",
        "cluster",
        "created_by",
    )
    list_filter = ("kind",)
    search_fields = ("project__name", "note", "created_by__email")
    list_select_related = ("project", "cluster", "created_by")
    date_hierarchy = "created_at"

    def has_change_permission(self, request: HttpRequest, obj=None) -> bool:
        return False

    def has_delete_permission(self, request: HttpRequest, obj=None) -> bool:
        return False

    def add_view(self, request: HttpRequest, form_url="", extra_context=None) -> HttpResponse:
        """'Add ledger entry' is the credit form: staff never write usage or top-up lines."""
        if not self.has_add_permission(request):
            raise PermissionDenied
        if request.method == "POST":
            form = CreditForm(request.POST)
            if form.is_valid():
                assert isinstance(request.user, User)  # the admin is for signed-in staff
                project = form.cleaned_data["project"]
                entry = ledger.credit(
                    project=project,
                    amount=form.cleaned_data["amount"],
                    note=form.cleaned_data["note"],
                    user=request.user,
                )
                self.message_user(
                    request,
                    f"{'Credited' if entry.amount > 0 else 'Debited'} "
                    f"{usd(abs(entry.amount))} — {project.name}'s balance is now "
                    f"{usd(ledger.balance(project=project))}.",
                    messages.SUCCESS,
                )
                return HttpResponseRedirect(reverse("admin:billing_ledgerentry_changelist"))
        else:
            form = CreditForm(initial={"project": request.GET.get("project")})
        context = {
            **self.admin_site.each_context(request),
            "title": "Add credit",
            "form": form,
            "opts": self.model._meta,
        }
        return render(request, "admin/billing/ledgerentry/add_credit.html", context)


@admin.action(description="Add credit to the selected project")
def add_credit(modeladmin: admin.ModelAdmin, request: HttpRequest, queryset: QuerySet[Project]):
    """An action for the Project admin: opens the credit form for the one selected project."""
    if queryset.count() != 1:
        modeladmin.message_user(request, "Select exactly one project to credit.", messages.WARNING)
        return None
    url = reverse("admin:billing_ledgerentry_add")
    return HttpResponseRedirect(f"{url}?project={queryset.get().pk}")


class ProjectAdmin(AccountsProjectAdmin):
    """Accounts' Project admin with billing's "Add credit" action."""

    # Accounts' Project admin has no action of its own (tests/billing/test_admin_actions.py
    # fails when it gets one that this list leaves out).
    actions = (add_credit,)


admin.site.unregister(Project)
admin.site.register(Project, ProjectAdmin)


# ---- card top-ups (billing/payments.py): read-only, Stripe's webhook is their only writer ----

from billing.models import Payment  # noqa: E402


@admin.register(Payment)
class PaymentAdmin(ReadOnlyAdmin, admin.ModelAdmin):
    list_display = (
        "created_at",
        "project",
        money_column("amount", "amount"),
        "status",
        money_column("amount_paid", "paid"),
        "credited_at",
        "stripe_session_id",
        "created_by",
    )
    list_filter = ("status",)
    search_fields = ("project__name", "stripe_session_id", "idempotency_key", "created_by__email")
    list_select_related = ("project", "created_by")
    date_hierarchy = "created_at"
    readonly_fields = [field.name for field in Payment._meta.fields]


# ---- who invoices are made out to (billing/invoices.py): the owner's, shown to staff -----------

from billing.models import BillingDetails  # noqa: E402


@admin.register(BillingDetails)
class BillingDetailsAdmin(admin.ModelAdmin):
    list_display = ("project", "company_name", "tax_id", "invoice_email", "updated_at")
    search_fields = ("project__name", "company_name", "tax_id", "invoice_email")
    list_select_related = ("project",)
