from decimal import Decimal

from django import forms

from billing import budgets, payments


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
