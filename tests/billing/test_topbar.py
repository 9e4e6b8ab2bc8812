"""The balance in the top bar of every page, and the runway banner while a cluster runs and the
balance covers less than the policy's one threshold, an hour (docs/billing.md "The top bar"):
one query more on a full page, none on a poll."""

import copy
import re
from datetime import UTC, datetime, timedelta
from decimal import Decimal

import pytest
import time_machine
from django.db import connection
from django.test.utils import CaptureQueriesContext

from billing.meter import burn_rates
from clusters.models import Volume
from tests.billing.conftest import add_credit, bill_cluster
from tests.factories import LocationFactory

NOW = datetime(2026, 3, 20, 12, 0, tzinfo=UTC)
HTMX = {"HX-Request": "true"}
PROCESSOR = "billing.context_processors.balance"


@pytest.fixture(autouse=True)
def _frozen():
    with time_machine.travel(NOW, tick=False):
        yield


@pytest.fixture
def without_topbar(settings):
    """The settings without the top bar's context processor, to count what it costs."""

    def turn_off():
        templates = copy.deepcopy(settings.TEMPLATES)
        templates[0]["OPTIONS"]["context_processors"].remove(PROCESSOR)
        settings.TEMPLATES = templates

    return turn_off


def topbar(html: str) -> str:
    return html.split("<main", 1)[0]


def banner(html: str) -> str:
    found = re.search(r'<div class="balance-banner[^"]*" role="status">.*?</div>', html, re.S)
    return " ".join(found.group(0).split()) if found else ""


def volume(project, *, size_gb: int, price: str) -> Volume:
    location = LocationFactory()
    return Volume.objects.create(
        project=project,
        name=f"v{size_gb}",
        location=location,
        size_gb=size_gb,
        price_per_gb_month=Decimal(price),
    )


def test_it_shows_the_balance_linking_to_billing(owner):
    add_credit(owner.project, "1234.50")

    html = owner.browser_client().get("/clusters/").content.decode()

    assert re.search(
        r'<a class="topbar-balance" href="/billing/"[^>]*><span class="visually-hidden">'
        r"Balance </span>\$1,234.50</a>",
        topbar(html),
    )
    assert banner(html) == ""  # nothing runs


def test_it_keeps_the_balance_from_developers(teammate, owner):
    add_credit(owner.project, "1234.50")

    html = teammate.browser_client().get("/clusters/").content.decode()

    assert "topbar-balance" not in html and "$1,234.50" not in html


def test_it_warns_only_while_the_balance_covers_less_than_an_hour(owner):
    # 2 machines at $10/h and 1,000 GB at $0.072 per GB-month ($0.10/h): $20.10/h.
    bill_cluster(owner.project, size=2, price="10.00", at=NOW - timedelta(minutes=5))
    volume(owner.project, size_gb=1000, price="0.0720")
    assert burn_rates({owner.project.pk})[owner.project.pk] == Decimal("20.10")
    add_credit(owner.project, "10.05")  # half an hour
    client = owner.browser_client()

    low = banner(client.get("/clusters/").content.decode())
    add_credit(owner.project, "10.04")  # $20.09: 59 min 58 s, still under the hour
    still = banner(client.get("/clusters/").content.decode())
    add_credit(owner.project, "0.01")  # $20.10: exactly an hour, the threshold
    enough = client.get("/clusters/").content.decode()

    # What will happen and when: the time is `about` (runcrate/durations.py), the moment the
    # balance reaches zero is a <time> the browser shows in its own zone.
    assert low.startswith(
        '<div class="balance-banner" role="status"> <p><strong>Your running clusters stop in '
        'about 30 min</strong>, at <time datetime="2026-03-20T12:30:00Z" data-when="datetime">'
        "2026-03-20 12:30:00 UTC</time>, when your balance of $10.05 runs out ($20.10/h for "
        "running clusters and stored volumes). A stop is like a terminate: what is on their "
        "machines is lost (volumes are kept). Add credit before then to keep them running.</p> "
        '<a class="btn btn-small" href="/billing/#topup-title">Add credit</a> '
        '<form method="post" action="/billing/banner/dismiss/"'
    )
    assert low.endswith(">Dismiss</button> </form> </div>")
    assert "stop in about 1 h</strong>" in still
    assert banner(enough) == ""
    assert 'class="topbar-balance"' in topbar(enough)


def test_no_banner_right_after_a_top_up_that_lifts_the_balance_above_the_threshold(owner):
    # The case: 4 machines at $22.32/h, nearly out, then $500 (about 5 h 36 min).
    bill_cluster(owner.project, size=4, price="22.32", at=NOW - timedelta(minutes=5))
    add_credit(owner.project, "20.00")
    client = owner.browser_client()
    before = banner(client.get("/clusters/").content.decode())

    add_credit(owner.project, "500.00")
    after = client.get("/billing/").content.decode()

    assert "Your running clusters stop in about 13 min" in before
    assert banner(after) == ""
    assert 'class="topbar-balance"' in topbar(after)  # no warning colour either


def test_no_banner_on_an_empty_new_account(owner):
    client = owner.browser_client()

    for page in ("/clusters/", "/billing/", "/offers/"):
        html = client.get(page).content.decode()
        assert banner(html) == ""
        assert "stopped" not in topbar(html)
    billing = client.get("/billing/").content.decode()
    assert "Running clusters are stopped" not in billing
    assert "Add credit to start a cluster." in billing
    # $0.00 with nothing running is no alarm: no red, no warning colour
    assert 'class="topbar-balance"' in topbar(billing)
    assert '<div class="value" id="balance">$0.00</div>' in billing


def test_no_banner_while_only_volumes_are_kept(owner):
    volume(owner.project, size_gb=1000, price="0.0720")  # $0.10/h of storage, nothing runs
    add_credit(owner.project, "0.05")  # half an hour of it

    html = owner.browser_client().get("/clusters/").content.decode()

    assert banner(html) == ""


def test_it_says_when_the_balance_ran_out(owner):
    bill_cluster(owner.project, size=2, price="10.00", at=NOW - timedelta(minutes=5))
    add_credit(owner.project, "-3.20", kind="adjustment")

    html = owner.browser_client().get("/clusters/").content.decode()

    assert (
        "Your balance has run out (\u2212$3.20).</strong> Your running clusters are stopped at "
        "the meter's next run, within a minute" in banner(html)
    )
    assert 'class="topbar-balance is-bad"' in topbar(html)
    assert "balance-banner is-bad" in html


@pytest.mark.parametrize("page", ["/clusters/", "/accounts/", "/storage/", "/billing/"])
def test_it_costs_one_query_on_a_full_page_whatever_runs(owner, without_topbar, page):
    bill_cluster(owner.project, size=3, price="10.00", at=NOW - timedelta(hours=9))
    volume(owner.project, size_gb=99, price="0.05")
    client = owner.browser_client()
    client.get(page)  # warm the session
    with CaptureQueriesContext(connection) as one_runs:
        client.get(page)
    for n in range(5):
        bill_cluster(owner.project, size=3, price="10.00", at=NOW - timedelta(hours=n))
        volume(owner.project, size_gb=100 + n, price="0.05")
    with CaptureQueriesContext(connection) as six_run:
        html = client.get(page).content.decode()
    without_topbar()
    with CaptureQueriesContext(connection) as without:
        client.get(page)

    assert "$" in topbar(html)
    # The Billing page shows the same summary, and reads the top bar's: no query of its own.
    topbar_queries = 0 if page == "/billing/" else 1
    assert len(six_run) == len(one_runs) == len(without) + topbar_queries


def test_a_fragment_pays_nothing_for_the_top_bar(owner, without_topbar):
    cluster = bill_cluster(owner.project, size=2, price="10.00", at=NOW - timedelta(hours=1))
    client = owner.browser_client()
    client.get("/clusters/", headers=HTMX)
    with CaptureQueriesContext(connection) as rows:
        client.get("/clusters/", headers=HTMX)
    with CaptureQueriesContext(connection) as status:
        client.get(f"/clusters/{cluster.pk}/", headers=HTMX)
    without_topbar()
    with CaptureQueriesContext(connection) as rows_without:
        client.get("/clusters/", headers=HTMX)
    with CaptureQueriesContext(connection) as status_without:
        client.get(f"/clusters/{cluster.pk}/", headers=HTMX)

    assert len(rows) == len(rows_without)
    assert len(status) == len(status_without)


def dismiss(client, *, htmx: bool = False, next_url: str = "/clusters/"):
    return client.post("/billing/banner/dismiss/", {"next": next_url}, headers=HTMX if htmx else {})


def test_a_dismissed_banner_stays_away_until_the_balance_runs_out(owner):
    bill_cluster(owner.project, size=2, price="10.00", at=NOW - timedelta(minutes=5))
    add_credit(owner.project, "15.00")  # 45 minutes: low
    client = owner.browser_client()
    assert banner(client.get("/clusters/").content.decode())

    dismissed = dismiss(client)
    after = client.get("/clusters/").content.decode()
    add_credit(owner.project, "-16.00", kind="adjustment")  # -$1: out
    out = client.get("/clusters/").content.decode()

    assert dismissed.status_code == 302 and dismissed["Location"] == "/clusters/"
    assert banner(after) == ""
    assert 'class="topbar-balance is-warn"' in topbar(after)  # the top bar still says it
    assert "balance-banner is-bad" in banner(out)


def test_a_dismissed_banner_comes_back_the_next_day(owner):
    bill_cluster(owner.project, size=2, price="10.00", at=NOW - timedelta(minutes=5))
    add_credit(owner.project, "15.00")
    client = owner.browser_client()
    dismiss(client, htmx=True)
    assert banner(client.get("/clusters/").content.decode()) == ""

    with time_machine.travel(NOW + timedelta(hours=13), tick=False):  # the next day, UTC
        html = client.get("/clusters/").content.decode()

    assert banner(html)


def test_the_htmx_dismiss_answers_an_empty_banner_and_sets_the_cookie(owner):
    bill_cluster(owner.project, size=2, price="10.00", at=NOW - timedelta(minutes=5))
    add_credit(owner.project, "15.00")

    response = dismiss(owner.browser_client(), htmx=True)

    assert response.status_code == 200 and response.content == b""
    cookie = response.cookies["balance_banner_dismissed"]
    assert cookie.value == f"{owner.project.pk}.low.20260320"
    assert cookie["httponly"] and cookie["samesite"] == "Lax"


@pytest.mark.parametrize("next_url", ["https://evil.example/", "//evil.example/x", ""])
def test_the_dismiss_goes_back_only_to_a_page_of_ours(owner, next_url):
    response = dismiss(owner.browser_client(), next_url=next_url)

    assert response.status_code == 302 and response["Location"] == "/billing/"


def test_the_dismiss_needs_csrf_and_a_login(owner):
    from django.test import Client

    strict = Client(enforce_csrf_checks=True)
    strict.force_login(owner.user)

    assert strict.post("/billing/banner/dismiss/").status_code == 403
    assert Client().post("/billing/banner/dismiss/").status_code == 302  # to the login
    assert owner.browser_client().get("/billing/banner/dismiss/").status_code == 405


def test_the_banner_names_no_setting_nor_command(owner):
    bill_cluster(owner.project, size=2, price="10.00", at=NOW - timedelta(minutes=5))
    add_credit(owner.project, "5.00")

    shown = banner(owner.browser_client().get("/clusters/").content.decode())

    assert shown
    for internal in ("Stripe", "STRIPE_", "manage.py", "RUNCRATE_"):
        assert internal not in shown
