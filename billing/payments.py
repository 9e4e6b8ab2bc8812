"""Card top-ups through Stripe Checkout (SPEC §4, docs/billing.md).

1. `start_checkout` stores a `Payment` with its Idempotency-Key (committed) before it asks
   Stripe for a Checkout Session, so a retry (the form sent twice, Stripe not answering)
   sends the same key and gets the same session instead of a second one.
2. The balance is credited only by the webhook, verified with the signing secret:
   `checkout.session.completed` when it is paid, or `checkout.session.async_payment_succeeded`.
   Exactly once per payment, whatever the order, repetition or concurrency of the events: one
   payment per session (unique), and one top-up line per payment (a unique constraint on
   `LedgerEntry.payment`), written in the transaction that marks the payment paid. Only a
   positive amount in USD credits.
3. The demo that `make run` starts (`RUNCRATE_DEMO`), with no Stripe keys at all, has demo
   payments instead: the same `Payment`, a demo page in place of Stripe's, and a confirmation
   that builds the event Stripe would send, signs it with the demo secret (derived from
   SECRET_KEY) and hands it to `handle_webhook`, the path that credits a real payment. Its
   ledger line is a demo top-up; with any Stripe key set there are no demo payments.
"""

import hashlib
import hmac
import json
import logging
import time
import uuid
from dataclasses import dataclass
from decimal import Decimal
from typing import TYPE_CHECKING

import stripe
from django.conf import settings
from django.db import IntegrityError, transaction
from django.urls import reverse
from django.utils import timezone

from accounts.models import Project, User
from billing.models import LedgerEntry, Payment
from runcrate.errors import Refused
from runcrate.money import TOO_LARGE, TOO_PRECISE, TOO_SMALL, NotAnAmount, read_amount, usd

if TYPE_CHECKING:
    from stripe.params.checkout import SessionCreateParams

logger = logging.getLogger(__name__)

MIN_TOPUP = Decimal("10.00")
MAX_TOPUP = Decimal("10000.00")
CURRENCY = "usd"
# Stripe's client retries a request that failed on the network with the same key.
NETWORK_RETRIES = 2
# A signed event older than this is refused (Stripe's own default).
TOLERANCE_SECONDS = 300
# A signed event dated later than this ahead of our clock is refused: Stripe signs at sending,
# so a timestamp in the future is a replay prepared for later, or a clock we cannot trust.
# The margin is the clock skew between Stripe and us that is still honest.
FUTURE_TOLERANCE_SECONDS = 60

PENDING = {Payment.Status.CREATED, Payment.Status.OPEN, Payment.Status.PROCESSING}

CARD_TOPUP_NOTE = "Card top-up"
DEMO_TOPUP_NOTE = "Demo top-up (no card charged)"
DEMO_SESSION_PREFIX = "cs_demo_"


class PaymentRefused(Refused):
    """A top-up refused before anything was asked of Stripe."""


class WebhookRejected(Refused):
    """The request is not a genuine, recent Stripe event: answer 400, change nothing."""

    def __init__(self, message: str) -> None:
        super().__init__("webhook_rejected", message, status=400)


def payments_configured() -> bool:
    return bool(settings.STRIPE_SECRET_KEY and settings.STRIPE_WEBHOOK_SECRET)


def demo_payments() -> bool:
    """Demo top-ups: only in the demo (`RUNCRATE_DEMO`), and only while no Stripe key at all is
    set, so a real key never sits beside the demo secret."""
    return bool(
        settings.RUNCRATE_DEMO
        and not settings.STRIPE_SECRET_KEY
        and not settings.STRIPE_WEBHOOK_SECRET
    )


def can_add_credit() -> bool:
    """The Billing page offers its Add credit form: by card, or the demo's payment."""
    return payments_configured() or demo_payments()


def demo_webhook_secret() -> str:
    """The demo's signing secret: derived from SECRET_KEY, so it is the same in every process
    of one installation and never written anywhere."""
    digest = hmac.new(
        settings.SECRET_KEY.encode(), b"runcrate demo webhook secret", hashlib.sha256
    ).hexdigest()
    return f"whsec_demo_{digest}"


def _webhook_secret() -> str:
    if settings.STRIPE_WEBHOOK_SECRET:
        return settings.STRIPE_WEBHOOK_SECRET
    return demo_webhook_secret() if demo_payments() else ""


def new_idempotency_key() -> str:
    return uuid.uuid4().hex


def parse_amount(raw: object) -> Decimal:
    try:
        return read_amount(raw, minimum=MIN_TOPUP, maximum=MAX_TOPUP)
    except NotAnAmount as error:
        if error.reason == TOO_PRECISE:
            raise PaymentRefused(
                "invalid_amount", "The amount takes at most 2 decimal places."
            ) from None
        if error.reason == TOO_SMALL:
            raise PaymentRefused(
                "amount_too_small", f"The minimum top-up is {usd(MIN_TOPUP)}."
            ) from None
        if error.reason == TOO_LARGE:
            raise PaymentRefused(
                "amount_too_large",
                f"A card top-up is at most {usd(MAX_TOPUP)}; ask us for an invoice above that.",
            ) from None
        raise PaymentRefused(
            "invalid_amount", f"Enter an amount in USD, like 50.00, not {str(raw)!r}."
        ) from None


def _client() -> stripe.StripeClient:
    return stripe.StripeClient(
        settings.STRIPE_SECRET_KEY,
        base_addresses={"api": settings.STRIPE_API_BASE} if settings.STRIPE_API_BASE else None,
        max_network_retries=NETWORK_RETRIES,
    )


def start_checkout(
    *, project: Project, user: User, amount: Decimal, idempotency_key: str
) -> Payment:
    """The payment for this key, with a Checkout Session to send the user to.

    Raises PaymentRefused when card payments are not configured or Stripe does not answer;
    in the latter case the payment stays, with its key, for `retry_checkout`.
    """
    if not can_add_credit():
        raise PaymentRefused("payments_not_configured", "Card payments are not available here.")
    amount = parse_amount(amount)
    idempotency_key = (idempotency_key or "").strip()[:64] or new_idempotency_key()
    # Committed before Stripe is called: a retry finds it and sends the same key.
    payment, _ = Payment.objects.get_or_create(
        idempotency_key=idempotency_key,
        defaults={"project": project, "created_by": user, "amount": amount},
    )
    if (
        payment.project_id != project.pk
        or payment.amount != amount
        or payment.status in Payment.FINAL
    ):
        # The same form sent for another amount, a form from before a payment that is over
        # (the browser's back button), or a key that is not this project's: that is a new
        # payment, under a new key.
        payment = Payment.objects.create(
            project=project,
            created_by=user,
            amount=amount,
            idempotency_key=new_idempotency_key(),
        )
    if payment.checkout_url:
        return payment
    if demo_payments():
        return _create_demo_session(payment)
    return _create_session(payment, email=user.email)


def retry_checkout(*, payment: Payment) -> Payment:
    """Ask Stripe again for the session of a payment it did not answer for, same key."""
    if payment.checkout_url or payment.status != Payment.Status.CREATED:
        return payment
    if not can_add_credit():
        raise PaymentRefused("payments_not_configured", "Card payments are not available here.")
    if demo_payments():
        return _create_demo_session(payment)
    email = payment.created_by.email if payment.created_by is not None else None
    return _create_session(payment, email=email)


def _create_session(payment: Payment, *, email: str | None) -> Payment:
    page = settings.SITE_URL + reverse("billing:payment", args=[payment.pk])
    params: SessionCreateParams = {
        "mode": "payment",
        "line_items": [
            {
                "quantity": 1,
                "price_data": {
                    "currency": CURRENCY,
                    "unit_amount": int(payment.amount * 100),
                    "product_data": {"name": "Runcrate credit"},
                },
            }
        ],
        "client_reference_id": str(payment.pk),
        "metadata": {"payment_id": str(payment.pk), "project_id": str(payment.project_id)},
        "success_url": page + "?session_id={CHECKOUT_SESSION_ID}",
        "cancel_url": page + "?cancelled=1",
    }
    if email:
        params["customer_email"] = email
    try:
        session = _client().v1.checkout.sessions.create(
            params=params, options={"idempotency_key": payment.idempotency_key}
        )
    except stripe.StripeError as error:
        logger.warning("Stripe refused or did not answer for payment %s: %s", payment.pk, error)
        message = getattr(error, "user_message", None) or str(error) or type(error).__name__
        Payment.objects.filter(pk=payment.pk).update(last_error=message[:500])
        raise PaymentRefused(
            "stripe_unavailable",
            "Stripe did not create the payment page. Nothing was charged; try again.",
        ) from error
    # The webhook may already have set the session (Stripe answered, we did not hear it).
    Payment.objects.filter(pk=payment.pk, status=Payment.Status.CREATED).update(
        status=Payment.Status.OPEN,
        stripe_session_id=session.id,
        checkout_url=session.url or "",
        last_error="",
    )
    payment.refresh_from_db()
    return payment


# ---- the demo's payments ----------------------------------------------------------------------


def _create_demo_session(payment: Payment) -> Payment:
    """The demo's stand-in for a Checkout Session: its page is ours (`billing:demo_checkout`)."""
    session_id = DEMO_SESSION_PREFIX + uuid.uuid4().hex
    Payment.objects.filter(pk=payment.pk, status=Payment.Status.CREATED).update(
        status=Payment.Status.OPEN,
        stripe_session_id=session_id,
        checkout_url=reverse("billing:demo_checkout", args=[payment.pk]),
        last_error="",
    )
    payment.refresh_from_db()
    return payment


def is_demo(payment: Payment) -> bool:
    return (payment.stripe_session_id or "").startswith(DEMO_SESSION_PREFIX)


def demo_event(payment: Payment) -> bytes:
    """The `checkout.session.completed` event Stripe would send once this payment is paid."""
    event = {
        "id": f"evt_demo_{uuid.uuid4().hex}",
        "object": "event",
        "type": "checkout.session.completed",
        "created": int(time.time()),
        "livemode": False,
        "data": {
            "object": {
                "id": payment.stripe_session_id,
                "object": "checkout.session",
                "mode": "payment",
                "payment_status": "paid",
                "status": "complete",
                "amount_total": int(payment.amount * 100),
                "currency": CURRENCY,
                "client_reference_id": str(payment.pk),
                "metadata": {
                    "payment_id": str(payment.pk),
                    "project_id": str(payment.project_id),
                },
            }
        },
    }
    return json.dumps(event).encode()


def sign(payload: bytes, *, secret: str, at: int | None = None) -> str:
    """A Stripe-Signature header for `payload`, as Stripe computes it (`t=`, `v1=`)."""
    timestamp = int(time.time()) if at is None else at
    signed = f"{timestamp}.".encode() + payload
    digest = hmac.new(secret.encode(), signed, hashlib.sha256).hexdigest()
    return f"t={timestamp},v1={digest}"


def confirm_demo_payment(*, payment: Payment) -> "WebhookResult":
    """The demo page's Pay button: the signed event Stripe would send, through the webhook's
    own path, so the demo credits the way a card does (exactly once: a second confirmation is a
    `duplicate`)."""
    if not demo_payments() or not is_demo(payment):
        raise PaymentRefused("not_a_demo_payment", "This is not a demo payment.")
    payload = demo_event(payment)
    return handle_webhook(payload=payload, signature=sign(payload, secret=demo_webhook_secret()))


# ---- the webhook ------------------------------------------------------------------------------


@dataclass(frozen=True)
class WebhookResult:
    event_type: str
    # credited, duplicate, invalid_amount, processing, failed, expired, ignored, unknown_payment
    outcome: str
    payment_id: int | None = None


def verify_event(*, payload: bytes, signature: str | None) -> dict:
    """The event, when the payload is signed with our secret, at most TOLERANCE_SECONDS old and
    not dated more than FUTURE_TOLERANCE_SECONDS ahead; else WebhookRejected."""
    secret = _webhook_secret()
    if not secret:
        raise WebhookRejected("No webhook signing secret is configured.")
    try:
        stripe.WebhookSignature.verify_header(payload, signature, secret, TOLERANCE_SECONDS)
        event = json.loads(payload)
    except stripe.SignatureVerificationError as error:
        raise WebhookRejected(str(error).split(".")[0]) from None
    except (ValueError, UnicodeDecodeError):
        raise WebhookRejected("The body is not a JSON event.") from None
    assert signature  # verify_header refuses a missing or empty one
    if signed_at(signature) > time.time() + FUTURE_TOLERANCE_SECONDS:
        raise WebhookRejected("The signature's timestamp is in the future")
    if not isinstance(event, dict) or not isinstance(event.get("type"), str):
        raise WebhookRejected("The body is not a Stripe event.")
    return event


def signed_at(signature: str) -> int:
    """The timestamp (`t=`) of a Stripe-Signature header that verified: the first one, the one
    Stripe's own check reads."""
    for item in signature.split(","):
        key, _, value = item.partition("=")
        if key == "t":
            return int(value)
    raise WebhookRejected("The signature has no timestamp")


def handle_webhook(*, payload: bytes, signature: str | None) -> WebhookResult:
    event = verify_event(payload=payload, signature=signature)
    event_type = event["type"]
    session = (event.get("data") or {}).get("object") or {}
    if not event_type.startswith("checkout.session.") or not isinstance(session, dict):
        return WebhookResult(event_type, "ignored")
    payment = _payment_for(session)
    if payment is None:
        logger.warning("Stripe event %s for a session we did not create", event.get("id"))
        return WebhookResult(event_type, "unknown_payment")
    if event_type == "checkout.session.completed":
        if session.get("payment_status") in ("paid", "no_payment_required"):
            return WebhookResult(event_type, _credit(payment, session), payment.pk)
        return WebhookResult(
            event_type,
            _move(
                payment,
                session,
                {Payment.Status.CREATED, Payment.Status.OPEN},
                Payment.Status.PROCESSING,
            ),
            payment.pk,
        )
    if event_type == "checkout.session.async_payment_succeeded":
        return WebhookResult(event_type, _credit(payment, session), payment.pk)
    if event_type == "checkout.session.async_payment_failed":
        return WebhookResult(
            event_type, _move(payment, session, PENDING, Payment.Status.FAILED), payment.pk
        )
    if event_type == "checkout.session.expired":
        return WebhookResult(
            event_type,
            _move(
                payment,
                session,
                {Payment.Status.CREATED, Payment.Status.OPEN},
                Payment.Status.EXPIRED,
            ),
            payment.pk,
        )
    return WebhookResult(event_type, "ignored", payment.pk)


def _payment_for(session: dict) -> Payment | None:
    session_id = session.get("id")
    payment = Payment.objects.filter(stripe_session_id=session_id).first() if session_id else None
    if payment is not None:
        return payment
    # Stripe made the session but its answer never reached us: find it by our own reference,
    # checked against the project in the metadata.
    reference = str(session.get("client_reference_id") or "")
    metadata = session.get("metadata") or {}
    project_id = str(metadata.get("project_id", ""))
    if not reference.isdigit() or not project_id:
        return None
    return Payment.objects.filter(
        pk=int(reference),
        project_id=project_id,
        stripe_session_id__isnull=True,
    ).first()


# The most one payment may credit, in cents: what a ledger line holds, far above MAX_TOPUP.
MAX_CREDIT_CENTS = 10**14 - 1


def _amount_paid(session: dict) -> Decimal | None:
    """What Stripe collected, when it is a positive amount of our currency; else None.

    Even a genuine, signed event credits nothing else: a negative, zero or missing
    `amount_total`, or another currency, is a session we did not create as it reads."""
    total = session.get("amount_total")
    if (
        isinstance(total, int)
        and not isinstance(total, bool)
        and 0 < total <= MAX_CREDIT_CENTS
        and session.get("currency") == CURRENCY
    ):
        return Decimal(total).scaleb(-2)
    return None


def _credit(payment: Payment, session: dict) -> str:
    now = timezone.now()
    amount = _amount_paid(session)
    if amount is not None and amount != payment.amount:
        # The session was made for `payment.amount` (`unit_amount`, quantity 1): a genuine
        # event for another total is not the top-up the user asked for. Nothing is credited;
        # staff see why on the payment and settle it by hand (an adjustment).
        logger.warning(
            "Stripe session %s for payment %s: amount_total %s is not the %s asked; nothing "
            "credited",
            session.get("id"),
            payment.pk,
            amount,
            payment.amount,
        )
        Payment.objects.filter(pk=payment.pk, credited_at__isnull=True).update(
            last_error=f"Stripe reported {usd(amount)} paid, not the {usd(payment.amount)} "
            "asked; nothing was credited."
        )
        return "amount_mismatch"
    if amount is None:
        logger.warning(
            "Stripe session %s for payment %s: amount_total %r %r is not a positive amount in "
            "%s; nothing credited",
            session.get("id"),
            payment.pk,
            session.get("amount_total"),
            session.get("currency"),
            CURRENCY,
        )
        return "invalid_amount"
    try:
        with transaction.atomic():
            # The top-up line is unique per payment (billing/models.py): a second credit of the
            # same payment, however it raced here, fails on the database's own index.
            LedgerEntry.objects.create(
                project_id=payment.project_id,
                kind=LedgerEntry.Kind.TOPUP,
                payment=payment,
                amount=amount,
                # In the demo, the one secret that verifies is the demo's.
                note=DEMO_TOPUP_NOTE if demo_payments() else CARD_TOPUP_NOTE,
                created_by_id=payment.created_by_id,
                created_at=now,
            )
            Payment.objects.filter(pk=payment.pk).update(
                credited_at=now,
                status=Payment.Status.PAID,
                amount_paid=amount,
                stripe_session_id=session.get("id") or payment.stripe_session_id,
            )
    except IntegrityError:
        return "duplicate"
    logger.info("credited payment %s: %s USD", payment.pk, amount)
    return "credited"


def _move(payment: Payment, session: dict, sources: set, target: str) -> str:
    """A status change that never undoes a credit nor a later state (out-of-order events)."""
    changes: dict = {"status": target}
    if session.get("id") and not payment.stripe_session_id:
        changes["stripe_session_id"] = session["id"]
    moved = Payment.objects.filter(
        pk=payment.pk, status__in=sources, credited_at__isnull=True
    ).update(**changes)
    return target if moved else "duplicate"


def is_pending(payment: Payment) -> bool:
    return payment.status in PENDING
