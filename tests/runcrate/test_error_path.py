"""One error path: every refusal in the product subclasses `Refused`, and the API's one handler
turns any of them into `{"error": {"code", "message"}}` with its status."""

import json

import pytest
from django.test import RequestFactory

from accounts.api_auth import KeyNotAllowed
from accounts.keys import KeyRefused
from accounts.signup import EmailTaken
from billing.budgets import BudgetRefused
from billing.ledger import InvalidAmount
from billing.payments import PaymentRefused, WebhookRejected
from billing.usage import MonthInvalid
from clusters.errors import ClusterRefused
from clusters.idempotency import IdempotencyRefused
from clusters.volumes import VolumeRefused
from offers.inventory import InventoryError
from offers.quotes import QuoteInvalid, QuoteRateLimited
from runcrate.api import ApiError, api
from runcrate.errors import Refused


@pytest.mark.parametrize(
    ("refusal", "status", "code"),
    [
        (ClusterRefused("key_limit_exceeded", "Too much."), 403, "key_limit_exceeded"),
        (ClusterRefused("name_taken", "Taken."), 409, "name_taken"),
        (VolumeRefused("volume_in_use", "In use."), 409, "volume_in_use"),
        (KeyRefused("ssh_key_exists", "Have it."), 409, "ssh_key_exists"),
        (KeyNotAllowed("scope_missing", "No."), 403, "scope_missing"),
        (BudgetRefused("invalid_budget", "Bad."), 422, "invalid_budget"),
        (MonthInvalid("Bad month."), 422, "invalid_month"),
        (InvalidAmount("Bad amount."), 422, "invalid_amount"),
        (PaymentRefused("amount_too_small", "Small."), 422, "amount_too_small"),
        (WebhookRejected("Unsigned."), 400, "webhook_rejected"),
        (EmailTaken("a@example.com"), 409, "email_taken"),
        (QuoteInvalid("nodes", "Too few."), 422, "invalid_request"),
        (QuoteRateLimited(5), 429, "rate_limited"),
        (InventoryError(["hosts[0]: no address"]), 422, "invalid_inventory"),
        (IdempotencyRefused("idempotency_key_reused", "Reused."), 422, "idempotency_key_reused"),
        (ApiError(404, "not_found", "Nothing."), 404, "not_found"),
    ],
)
def test_it_renders_every_refusal_through_the_one_handler(refusal, status, code):
    assert isinstance(refusal, Refused)

    response = api.on_exception(RequestFactory().get("/api/v1/anything"), refusal)

    assert response.status_code == status
    assert json.loads(response.content) == {"error": {"code": code, "message": refusal.message}}


def test_it_keeps_the_field_a_form_shows_the_message_beside():
    refusal = QuoteInvalid("nodes", "Ask for at least 2.")

    assert refusal.field == "nodes"
    assert refusal.problem == "Ask for at least 2."
    assert refusal.message == "nodes: Ask for at least 2."
