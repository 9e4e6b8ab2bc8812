import re
from decimal import Decimal

from django import forms

from billing import budgets, payments
from billing.models import BillingDetails

TAX_ID = re.compile(r"[A-Z0-9][A-Z0-9 .\-]*")


class TopUpForm(forms.Form):
    amount = forms.CharField(
        label="Amount (USD)",
        initial="50.00",
        widget=forms.TextInput(attrs={"inputmode": "decimal", "autocomplete": "off"}),
        help_text=f"At least {payments.MIN_TOPUP} USD, charged once to your card by Stripe.",
    )
    # Made when the form is shown; the payment stores it before Stripe is called, so sending
    # the form twice reuses it (and gets the same Checkout page).
    idempotency_key = forms.CharField(widget=forms.HiddenInput, max_length=64)

    def clean_amount(self) -> Decimal:
        try:
            return payments.parse_amount(self.cleaned_data["amount"])
        except payments.PaymentRefused as refusal:
            raise forms.ValidationError(refusal.message) from None


class BudgetForm(forms.Form):
    monthly_budget = forms.CharField(
        label="Monthly budget (USD)",
        required=False,
        widget=forms.TextInput(attrs={"inputmode": "decimal", "placeholder": "No budget"}),
        help_text="Leave empty for no budget.",
    )

    def clean_monthly_budget(self) -> Decimal | None:
        try:
            return budgets.parse_budget(self.cleaned_data["monthly_budget"])
        except budgets.BudgetRefused as refusal:
            raise forms.ValidationError(refusal.message) from None


class EnvironmentForm(BudgetForm):
    name = forms.CharField(
        label="Name",
        max_length=40,
        widget=forms.TextInput(attrs={"placeholder": "staging", "autocomplete": "off"}),
        help_text="Lowercase letters, digits and hyphens.",
    )

    field_order = ["name", "monthly_budget"]


class BillingDetailsForm(forms.ModelForm):
    """Who invoices are made out to. Every field is stripped; the address keeps its lines."""

    class Meta:
        model = BillingDetails
        fields = ["company_name", "address", "tax_id", "invoice_email"]
        labels = {"company_name": "Company name"}
        widgets = {
            "company_name": forms.TextInput(attrs={"autocomplete": "organization"}),
            "address": forms.Textarea(attrs={"rows": 4, "autocomplete": "street-address"}),
            "tax_id": forms.TextInput(attrs={"autocomplete": "off"}),
            "invoice_email": forms.EmailInput(attrs={"autocomplete": "email"}),
        }

    def clean_tax_id(self) -> str:
        value: str = self.cleaned_data["tax_id"].strip().upper()
        if value and not TAX_ID.fullmatch(value):
            raise forms.ValidationError(
                "A VAT or tax ID is letters, digits, spaces, dots and hyphens, like DE123456789."
            )
        return value
