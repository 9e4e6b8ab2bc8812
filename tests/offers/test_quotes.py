"""Request a quote (SPEC §7): the form, the API, the emails, the rate limit, the isolation."""

from datetime import UTC, date, datetime, timedelta

import pytest
import time_machine
from django.core import mail
from django.utils import timezone

from offers.models import QuoteRequest
from offers.quotes import quotes_for
from tests.factories import GpuModelFactory, LocationFactory

QUOTE = "/offers/quote/"
QUOTES = "/offers/quotes/"
TODAY = date(2026, 3, 10)


@pytest.fixture(autouse=True)
def _today():
    with time_machine.travel(datetime(2026, 3, 10, 12, 0, tzinfo=UTC), tick=False):
        yield


@pytest.fixture
def catalog(db):
    GpuModelFactory(slug="h100-sxm", name="H100 SXM 80GB", memory_gib=80)
    GpuModelFactory(slug="a100", name="A100 SXM 80GB", memory_gib=80)
    LocationFactory(code="us-east-2", name="Columbus, Ohio")
    LocationFactory(code="eu-north-1", name="Kajaani, Finland")


def fields(**overrides) -> dict:
    data = {
        "gpu": "h100-sxm",
        "nodes": "128",
        "interconnect": "infiniband",
        "location": "us-east-2",
        "start_date": "2026-04-01",
        "duration_weeks": "12",
        "contact_name": "Ada Lovelace",
        "contact_email": "ada@example.com",
        "notes": "Pre-training a 70B model.",
    }
    data.update(overrides)
    return data


def api_fields(**overrides) -> dict:
    data = fields(**overrides)
    for key in ("nodes", "duration_weeks"):
        if isinstance(data[key], str) and data[key].isdigit():
            data[key] = int(data[key])
    return data


# --- the page -------------------------------------------------------------------------------


def test_it_prefills_the_form_from_the_picker(owner, catalog):
    html = (
        owner.browser_client()
        .get(f"{QUOTE}?gpu=h100-sxm&nodes=16&location=us-east-2&interconnect=roce")
        .content.decode()
    )

    assert '<option value="h100-sxm" selected>' in html
    assert 'name="nodes" value="16"' in html
    assert '<option value="roce" selected>' in html
    assert '<option value="us-east-2" selected>' in html
    assert 'name="contact_email" value="owner@example.com"' in html
    assert 'name="start_date" min="2026-03-10"' in html


def test_it_ignores_a_prefill_it_cannot_use(owner, catalog):
    response = owner.browser_client().get(f"{QUOTE}?gpu=nope&nodes=abc&interconnect=carrier")

    html = response.content.decode()
    assert response.status_code == 200
    assert "errorlist" not in html
    assert 'name="nodes" value="abc"' not in html
    assert '<option value="ethernet" selected>' in html


def test_it_stores_the_request_emails_both_sides_and_lists_it(
    owner, catalog, settings, django_capture_on_commit_callbacks
):
    settings.RUNCRATE_SALES_EMAIL = "sales@runcrate.test"
    client = owner.browser_client()

    with django_capture_on_commit_callbacks(execute=True):
        response = client.post(QUOTE, fields())

    assert response.status_code == 302
    assert response["Location"] == QUOTES
    quote = QuoteRequest.objects.get()
    assert quote.project == owner.project
    assert quote.requested_by == owner.user
    assert (quote.gpu.slug, quote.nodes, quote.interconnect) == ("h100-sxm", 128, "infiniband")
    assert quote.location.code == "us-east-2"
    assert (quote.start_date, quote.duration_weeks) == (date(2026, 4, 1), 12)
    assert quote.status == QuoteRequest.Status.NEW

    assert [m.to for m in mail.outbox] == [["ada@example.com"], ["sales@runcrate.test"]]
    ack, sales = mail.outbox
    assert ack.subject == "We have your quote request: 128 × H100 SXM 80GB"
    assert "Columbus, Ohio (us-east-2)" in ack.body
    assert "/offers/quotes/" in ack.body
    assert ack.alternatives[0].mimetype == "text/html"
    assert sales.subject.startswith(f"Quote request #{quote.pk}: 128 × H100 SXM 80GB, InfiniBand")
    assert sales.reply_to == ["ada@example.com"]
    assert "Pre-training a 70B model." in sales.body

    listing = client.get(response["Location"])
    html = listing.content.decode()
    assert "Quote request sent." in html
    assert f'data-quote="{quote.pk}"' in html
    assert "H100 SXM 80GB" in html


@pytest.mark.parametrize(
    ("field", "value", "message"),
    [
        ("gpu", "h999", "Select a valid choice."),
        ("nodes", "1", "Ask for 2 to 1,000 machines."),
        ("nodes", "1001", "Ask for 2 to 1,000 machines."),
        ("nodes", "many", "Enter the number of machines as a whole number."),
        ("interconnect", "carrier-pigeon", "Select a valid choice."),
        ("location", "mars-1", "Select a valid choice."),
        ("start_date", "2026-03-09", "The start date is in the past: pick today or later."),
        ("start_date", "next week", "Enter a date as YYYY-MM-DD."),
        ("duration_weeks", "0", "The duration is 1 to 156 weeks."),
        ("duration_weeks", "157", "The duration is 1 to 156 weeks."),
        ("contact_name", "", "This field is required."),
        ("contact_email", "ada-at-example", "Enter a valid email address."),
    ],
)
def test_it_explains_a_bad_field_beside_it_and_stores_nothing(
    owner, catalog, field, value, message
):
    response = owner.browser_client().post(QUOTE, fields(**{field: value}))

    assert response.status_code == 422
    html = response.content.decode()
    errors = html.split(f'id="id_{field}_error">')[1].split("</ul>")[0]
    assert message in errors
    assert html.count('class="errorlist"') == 1
    assert not QuoteRequest.objects.exists()
    assert mail.outbox == []


def test_it_shows_every_bad_field_at_once(owner, catalog):
    response = owner.browser_client().post(
        QUOTE, fields(start_date="2026-01-01", duration_weeks="0", contact_email="nope")
    )

    html = response.content.decode()
    assert response.status_code == 422
    for field in ("start_date", "duration_weeks", "contact_email"):
        assert f'id="id_{field}_error"' in html
    assert not QuoteRequest.objects.exists()


def test_it_accepts_a_start_today_and_no_location(owner, catalog):
    response = owner.browser_client().post(
        QUOTE, fields(start_date="2026-03-10", location="", notes="")
    )

    assert response.status_code == 302
    assert QuoteRequest.objects.get().location is None


def test_it_limits_each_project_to_five_requests_an_hour(owner, stranger, catalog):
    client = owner.browser_client()
    for _ in range(5):
        assert client.post(QUOTE, fields()).status_code == 302

    refused = client.post(QUOTE, fields())

    assert refused.status_code == 429
    assert "You have sent 5 quote requests in the last hour" in refused.content.decode()
    assert QuoteRequest.objects.count() == 5
    # Another project has its own allowance.
    assert stranger.browser_client().post(QUOTE, fields()).status_code == 302


def test_it_takes_requests_again_once_the_hour_has_passed(owner, catalog):
    client = owner.browser_client()
    for _ in range(5):
        client.post(QUOTE, fields())
    assert client.post(QUOTE, fields()).status_code == 429

    with time_machine.travel(timezone.now() + timedelta(minutes=61), tick=False):
        assert client.post(QUOTE, fields()).status_code == 302

    assert QuoteRequest.objects.count() == 6


def test_it_does_not_count_refused_requests_against_the_limit(owner, catalog):
    client = owner.browser_client()
    for _ in range(6):
        client.post(QUOTE, fields(nodes="1"))

    assert client.post(QUOTE, fields()).status_code == 302


def test_it_shows_a_teammate_the_projects_requests_and_a_stranger_none(
    owner, teammate, stranger, catalog
):
    owner.browser_client().post(QUOTE, fields(notes="owner's secret plan"))

    assert "H100 SXM 80GB" in teammate.browser_client().get(QUOTES).content.decode()
    html = stranger.browser_client().get(QUOTES).content.decode()
    assert "H100 SXM 80GB" not in html
    assert "No quote requests yet." in html
    assert list(quotes_for(stranger.project)) == []
    assert [q.notes for q in quotes_for(owner.project)] == ["owner's secret plan"]


def test_it_asks_anonymous_visitors_to_log_in(client, db):
    for path in (QUOTE, QUOTES):
        response = client.get(path)
        assert response.status_code == 302
        assert "/accounts/login/" in response["Location"]


# --- the API --------------------------------------------------------------------------------


def test_it_takes_a_quote_request_through_the_api(
    owner, catalog, settings, django_capture_on_commit_callbacks
):
    settings.RUNCRATE_SALES_EMAIL = "sales@runcrate.test"

    with django_capture_on_commit_callbacks(execute=True):
        response = owner.api().post("/api/v1/quotes", api_fields(), content_type="application/json")

    assert response.status_code == 201
    quote = QuoteRequest.objects.get()
    assert response.json() == {
        "data": {
            "id": quote.pk,
            "status": "new",
            "gpu": "h100-sxm",
            "nodes": 128,
            "interconnect": "infiniband",
            "location": "us-east-2",
            "start_date": "2026-04-01",
            "duration_weeks": 12,
            "contact_name": "Ada Lovelace",
            "contact_email": "ada@example.com",
            "notes": "Pre-training a 70B model.",
            "created_at": "2026-03-10T12:00:00Z",
        }
    }
    assert quote.project == owner.project
    assert [m.to for m in mail.outbox] == [["ada@example.com"], ["sales@runcrate.test"]]


@pytest.mark.parametrize(
    ("field", "value"),
    [
        ("gpu", "h999"),
        ("nodes", 1),
        ("nodes", 1001),
        ("nodes", "many"),
        ("interconnect", "carrier-pigeon"),
        ("location", "mars-1"),
        ("start_date", "2026-03-09"),
        ("start_date", "next week"),
        ("duration_weeks", 0),
        ("duration_weeks", 157),
        ("contact_name", "  "),
        ("contact_email", "ada-at-example"),
    ],
)
def test_it_refuses_a_bad_field_in_the_api_naming_it(owner, catalog, field, value):
    response = owner.api().post(
        "/api/v1/quotes", api_fields(**{field: value}), content_type="application/json"
    )

    assert response.status_code == 422
    error = response.json()["error"]
    assert error["code"] == "invalid_request"
    assert error["message"].startswith(f"{field}: ")
    assert not QuoteRequest.objects.exists()
    assert mail.outbox == []


def test_it_refuses_a_missing_field_in_the_api(owner, catalog):
    data = api_fields()
    del data["start_date"]

    response = owner.api().post("/api/v1/quotes", data, content_type="application/json")

    assert response.status_code == 422
    assert response.json()["error"]["message"].startswith("start_date: ")


def test_it_rate_limits_the_api_with_429(owner, catalog):
    client = owner.api()
    for _ in range(5):
        client.post("/api/v1/quotes", api_fields(), content_type="application/json")

    response = client.post("/api/v1/quotes", api_fields(), content_type="application/json")

    assert response.status_code == 429
    assert response.json()["error"]["code"] == "rate_limited"
    assert QuoteRequest.objects.count() == 5


def test_it_shares_the_limit_between_the_page_and_the_api(owner, catalog, settings):
    settings.RUNCRATE_QUOTE_RATE_LIMIT = 2
    owner.browser_client().post(QUOTE, fields())
    owner.api().post("/api/v1/quotes", api_fields(), content_type="application/json")

    assert owner.browser_client().post(QUOTE, fields()).status_code == 429


def test_it_lists_only_the_projects_quote_requests_in_the_api(owner, teammate, stranger, catalog):
    owner.api().post("/api/v1/quotes", api_fields(), content_type="application/json")
    stranger.api().post(
        "/api/v1/quotes", api_fields(gpu="a100", nodes=4), content_type="application/json"
    )
    mine = QuoteRequest.objects.get(project=owner.project)
    theirs = QuoteRequest.objects.get(project=stranger.project)

    listed = teammate.api().get("/api/v1/quotes").json()
    assert [q["id"] for q in listed["data"]] == [mine.pk]
    assert listed["meta"] == {"count": 1}
    assert owner.api().get(f"/api/v1/quotes/{mine.pk}").json()["data"]["gpu"] == "h100-sxm"

    response = owner.api().get(f"/api/v1/quotes/{theirs.pk}")
    assert response.status_code == 404
    assert response.json()["error"]["code"] == "not_found"


@pytest.mark.parametrize("method", ["get", "post"])
def test_it_answers_401_to_quotes_without_a_valid_key(client, owner, catalog, method):
    response = getattr(client, method)(
        "/api/v1/quotes", api_fields(), content_type="application/json"
    )

    assert response.status_code == 401
    assert not QuoteRequest.objects.exists()


def test_it_answers_404_to_a_user_in_no_project_and_stores_nothing(owner, catalog):
    # Removed from their last project: nobody's quote requests to list, no project to bill.
    owner.user.memberships.all().delete()
    client = owner.browser_client()

    listed = client.get(QUOTES)
    sent = client.post(QUOTE, fields())

    assert listed.status_code == 404
    assert sent.status_code == 404
    assert not QuoteRequest.objects.exists()
    assert mail.outbox == []
