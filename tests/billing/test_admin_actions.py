"""Billing's Project admin (billing/admin.py) re-registers accounts' with the "Add credit"
action: it lists its actions itself, so none of accounts' may be left behind."""

from accounts.admin import ProjectAdmin as AccountsProjectAdmin
from billing.admin import ProjectAdmin, add_credit


def test_it_keeps_every_action_of_accounts_project_admin_and_adds_credit():
    assert ProjectAdmin.actions == (*(AccountsProjectAdmin.actions or ()), add_credit)
