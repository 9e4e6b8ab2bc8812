"""Request a quote (SPEC §7): reserved capacity, clusters past the self-serve limits, or a fast
InfiniBand/RoCE network. The page and the API both call `request_quote`."""

import contextlib
import logging
import time
from datetime import date

from django.conf import settings
from django.core.cache import cache
from django.core.exceptions import ValidationError
from django.core.validators import validate_email
from django.db import transaction
from django.db.models import QuerySet
from django.urls import reverse
from django.utils import timezone

from accounts.models import Project, User
from offers.models import GpuModel, MachineType, QuoteRequest
from offers.visibility import visible_locations
from runcrate.emails import send_templated
from runcrate.errors import Refused

logger = logging.getLogger(__name__)

QUOTE_MIN_NODES = 2
QUOTE_MAX_NODES = 1000
QUOTE_MIN_WEEKS = 1
QUOTE_MAX_WEEKS = 156  # three years
NAME_MAX_LENGTH = 150
NOTES_MAX_LENGTH = 5000

# The rate limit counts stored requests per project in one-minute buckets of the cache and sums
# the last hour of them: a sliding hour, with no read-then-write race (each bucket is `incr`ed).
RATE_WINDOW_SECONDS = 3600
RATE_BUCKET_SECONDS = 60


class QuoteInvalid(Refused):
    """A field of a quote request is wrong; `field` names it. `message` (the API's) starts with
    the field's name; `problem` is the sentence a form shows beside the field."""

    def __init__(self, field: str, problem: str) -> None:
        super().__init__("invalid_request", f"{field}: {problem}", field=field)
        self.problem = problem


class QuoteRateLimited(Refused):
    """The project sent its quota of quote requests in the last hour."""

    def __init__(self, limit: int) -> None:
        super().__init__(
            "rate_limited",
            f"You have sent {limit} quote requests in the last hour, the most we take: "
            "our team already has them and will reply. Try again later for a new one.",
            status=429,
        )
        self.limit = limit


def quotes_for(project: Project) -> QuerySet[QuoteRequest]:
    """The project's quote requests, newest first, with what their rows show."""
    return QuoteRequest.objects.filter(project=project).select_related("gpu", "location")


def _bucket_keys(project: Project, now: float) -> tuple[str, list[str]]:
    current = int(now // RATE_BUCKET_SECONDS)
    span = RATE_WINDOW_SECONDS // RATE_BUCKET_SECONDS
    keys = [
        f"quote-rate:{project.pk}:{bucket}" for bucket in range(current - span + 1, current + 1)
    ]
    return keys[-1], keys


def _take_rate_slot(project: Project) -> None:
    """Count one request against the project's hourly limit, or raise QuoteRateLimited.

    The bucket is incremented first and the hour summed after, so two requests racing for the
    last slot can both be refused but never both admitted.
    """
    limit = settings.RUNCRATE_QUOTE_RATE_LIMIT
    current, keys = _bucket_keys(project, time.time())
    cache.add(current, 0, timeout=RATE_WINDOW_SECONDS + RATE_BUCKET_SECONDS)
    cache.incr(current)
    # Some backends' incr rewrites the entry with the default timeout: set it again.
    cache.touch(current, timeout=RATE_WINDOW_SECONDS + RATE_BUCKET_SECONDS)
    if sum(cache.get_many(keys).values()) > limit:
        cache.decr(current)
        raise QuoteRateLimited(limit)


def _release_rate_slot(project: Project) -> None:
    current, _ = _bucket_keys(project, time.time())
    # The bucket may have expired or rolled over: then there is nothing to give back.
    with contextlib.suppress(ValueError):
        cache.decr(current)


def check_start_date(start_date: date) -> None:
    """A quote starts today or later."""
    if start_date < timezone.localdate():
        raise QuoteInvalid("start_date", "The start date is in the past: pick today or later.")


def _clean(
    *,
    gpu: str,
    nodes: int,
    interconnect: str,
    location: str | None,
    start_date: date,
    duration_weeks: int,
    contact_name: str,
    contact_email: str,
    notes: str,
) -> dict:
    gpu_model = GpuModel.objects.filter(slug=gpu).first()
    if gpu_model is None:
        raise QuoteInvalid("gpu", f"Unknown GPU '{gpu}': use the slug of a GPU model.")
    if not QUOTE_MIN_NODES <= nodes <= QUOTE_MAX_NODES:
        raise QuoteInvalid("nodes", f"Ask for {QUOTE_MIN_NODES} to {QUOTE_MAX_NODES:,} machines.")
    if interconnect not in MachineType.Interconnect.values:
        choices = ", ".join(MachineType.Interconnect.values)
        raise QuoteInvalid("interconnect", f"Choose one of: {choices}.")
    location_obj = None
    if location:
        # A failure-drill location is quoted to no one (offers/visibility.py): unknown here.
        location_obj = visible_locations(drills=False).filter(code=location).first()
        if location_obj is None:
            raise QuoteInvalid(
                "location", f"Unknown location '{location}': use a location code, or leave it out."
            )
    check_start_date(start_date)
    if not QUOTE_MIN_WEEKS <= duration_weeks <= QUOTE_MAX_WEEKS:
        raise QuoteInvalid(
            "duration_weeks", f"The duration is {QUOTE_MIN_WEEKS} to {QUOTE_MAX_WEEKS} weeks."
        )
    contact_name = contact_name.strip()
    if not contact_name:
        raise QuoteInvalid("contact_name", "Say who we should reply to.")
    if len(contact_name) > NAME_MAX_LENGTH:
        raise QuoteInvalid("contact_name", f"Keep the name under {NAME_MAX_LENGTH} characters.")
    contact_email = contact_email.strip()
    try:
        validate_email(contact_email)
    except ValidationError:
        raise QuoteInvalid("contact_email", "Enter a valid email address.") from None
    if len(notes) > NOTES_MAX_LENGTH:
        raise QuoteInvalid("notes", f"Keep the notes under {NOTES_MAX_LENGTH:,} characters.")
    return {
        "gpu": gpu_model,
        "nodes": nodes,
        "interconnect": interconnect,
        "location": location_obj,
        "start_date": start_date,
        "duration_weeks": duration_weeks,
        "contact_name": contact_name,
        "contact_email": contact_email,
        "notes": notes.strip(),
    }


def _send_emails(quote: QuoteRequest) -> None:
    context = {"quote": quote, "quotes_url": settings.SITE_URL + reverse("offers:quotes")}
    try:
        send_templated(template="quote-received", to=[quote.contact_email], context=context)
        send_templated(
            template="quote-sales",
            to=[settings.RUNCRATE_SALES_EMAIL],
            context=context,
            reply_to=[quote.contact_email],
        )
    except Exception:
        # The request is stored and listed for staff in admin either way; a mail outage must
        # not turn a saved request into an error page that invites a duplicate.
        logger.exception("Could not send the emails of quote request %s", quote.pk)


def request_quote(
    *,
    project: Project,
    user: User | None,
    gpu: str,
    nodes: int,
    interconnect: str,
    start_date: date,
    duration_weeks: int,
    contact_name: str,
    contact_email: str,
    location: str | None = None,
    notes: str = "",
) -> QuoteRequest:
    """Store a quote request and email the requester and sales once it is committed.

    `gpu` is a GPU model's slug and `location` a location's code (or None for anywhere).
    Raises QuoteInvalid naming the first bad field, or QuoteRateLimited past
    settings.RUNCRATE_QUOTE_RATE_LIMIT requests per project per hour; both change nothing.
    """
    fields = _clean(
        gpu=gpu,
        nodes=nodes,
        interconnect=interconnect,
        location=location,
        start_date=start_date,
        duration_weeks=duration_weeks,
        contact_name=contact_name,
        contact_email=contact_email,
        notes=notes,
    )
    _take_rate_slot(project)
    try:
        with transaction.atomic():
            quote = QuoteRequest.objects.create(project=project, requested_by=user, **fields)
            transaction.on_commit(lambda: _send_emails(quote))
    except BaseException:
        _release_rate_slot(project)
        raise
    return quote
