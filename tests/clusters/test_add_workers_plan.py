"""Adding workers is planned and confirmed (issue 37; docs/clusters.md "Adding workers",
docs/api.md "Adding workers"): the Machines tab's form leads to a confirm page that shows what the
machines add per hour and the cluster's new total, checked by the add's own rules (the create's
money rules for the grown cluster) and reserving nothing; only its POST, with the page's
plan_token, adds them. The API's plan answers the same figures and a plan_token the add takes."""

from __future__ import annotations

import html as html_text
import re
from datetime import timedelta

import pytest
from django.utils import timezone

from accounts.models import Environment
from clusters.models import Cluster, Event, Node
from tests.clusters.front import credit, ssh_key
from tests.clusters.lifecycle_kit import Sim, at, create, inventory

BOOT = 180


@pytest.fixture
def cluster(owner, clock) -> Cluster:
    """owner's ready 3-node cluster of the simulated data center ($20.00 per machine-hour),
    with two hosts to spare."""
    credit(owner.project, "1000.00")
    ssh_key(owner.project, "laptop")
    machine_type = inventory(hosts=5, boot_seconds=BOOT)
    with Sim() as sim:
        made = create(owner.project, machine_type, nodes=3, user=owner.user)
        sim.run_until(clock, at(BOOT * 2))
    made.refresh_from_db()
    assert made.status == Cluster.Status.READY
    return made


def text_of(html: str) -> str:
    return " ".join(html_text.unescape(re.sub(r"<[^>]+>", " ", html)).split())


def page_url(cluster: Cluster) -> str:
    return f"/clusters/{cluster.pk}/workers/"


def token_of(html: str) -> str:
    found = re.search(r'name="plan_token" value="([^"]+)"', html)
    assert found, "no plan_token on the page"
    return found.group(1)


def machines(cluster: Cluster) -> int:
    return cluster.nodes.filter(status__in=Node.LIVE).count()


# --- the dashboard ------------------------------------------------------------------------------


def test_the_machines_tab_asks_the_confirm_page_first(owner, cluster):
    html = owner.browser_client().get(f"/clusters/{cluster.pk}/machines/").content.decode()

    form = re.search(r'<form id="add-workers".*?</form>', html, re.S)
    assert form and 'method="get"' in form.group(0)
    assert f'action="{page_url(cluster)}"' in form.group(0)
    assert "csrfmiddlewaretoken" not in form.group(0)  # a GET: it changes nothing


def test_the_confirm_page_shows_the_added_price_and_the_new_total(owner, cluster):
    response = owner.browser_client().get(page_url(cluster), {"count": "2"})

    assert response.status_code == 200
    html = response.content.decode()
    text = text_of(html)
    assert "Add 2 workers to" in text
    assert "+$40.00 per hour for 2 machines of $20.00 per hour" in text
    assert "Now 3 machines, $60.00 per hour" in text
    assert "After 5 machines, $100.00 per hour" in text
    assert "Your balance covers an hour of the grown cluster (at least $100.00)" in text
    assert "Add 2 workers for +$40.00/h" in text
    assert f'<form method="post" action="{page_url(cluster)}"' in html
    assert 'name="count" value="2"' in html and token_of(html)
    assert machines(cluster) == 3  # the page reserved nothing
    assert not Event.objects.filter(cluster=cluster, reason=Event.Reason.WORKERS_ADDED).exists()


def test_its_post_with_the_pages_token_adds_them(owner, cluster):
    client = owner.browser_client()
    token = token_of(client.get(page_url(cluster), {"count": "1"}).content.decode())

    with Sim():
        done = client.post(page_url(cluster), {"count": "1", "plan_token": token})

    assert done.status_code == 302
    assert done["Location"] == f"/clusters/{cluster.pk}/machines/"
    assert machines(cluster) == 4
    shown = text_of(client.get(done["Location"]).content.decode())
    assert "Adding 1 worker: each is billed once it is up." in shown


def test_a_second_click_on_the_same_confirm_adds_nothing_more(owner, cluster):
    client = owner.browser_client()
    token = token_of(client.get(page_url(cluster), {"count": "1"}).content.decode())

    with Sim():
        first = client.post(page_url(cluster), {"count": "1", "plan_token": token})
        again = client.post(page_url(cluster), {"count": "1", "plan_token": token})

    assert first.status_code == 302
    assert "(workers were added since)" in text_of(again.content.decode())
    assert machines(cluster) == 4
    assert "Now 4 machines, $80.00 per hour" in text_of(again.content.decode())


def test_a_post_without_the_confirm_changes_nothing_and_asks(owner, cluster):
    response = owner.browser_client().post(page_url(cluster), {"count": "2"})

    assert response.status_code == 200
    assert "+$40.00 per hour" in text_of(response.content.decode())
    assert machines(cluster) == 3


def test_a_token_for_another_count_adds_nothing_and_shows_the_price_now(owner, cluster):
    client = owner.browser_client()
    token = token_of(client.get(page_url(cluster), {"count": "1"}).content.decode())

    response = client.post(page_url(cluster), {"count": "2", "plan_token": token})

    text = text_of(response.content.decode())
    assert (
        "Nothing was added: the price you confirmed is more than 10 minutes old, or was for "
        "another number of workers" in text
    )
    assert "+$40.00 per hour" in text  # the plan of what was posted, to confirm again
    assert machines(cluster) == 3


def test_a_confirm_older_than_ten_minutes_adds_nothing(owner, cluster, clock):
    client = owner.browser_client()
    token = token_of(client.get(page_url(cluster), {"count": "1"}).content.decode())
    clock.move_to(timezone.now() + timedelta(minutes=11))

    response = client.post(page_url(cluster), {"count": "1", "plan_token": token})

    assert "is more than 10 minutes old" in text_of(response.content.decode())
    assert machines(cluster) == 3


@pytest.mark.parametrize(
    ("count", "words"),
    [
        ("3", "Only 2 machines of this type are free right now and this needs 3"),
        ("0", "Add at least one worker."),
        ("x", "Say how many workers to add, as a whole number."),
        ("62", "A cluster has at most 64 machines: this one has 3, so at most 61 more."),
    ],
)
def test_the_page_says_why_it_cannot(owner, cluster, count, words):
    html = owner.browser_client().get(page_url(cluster), {"count": count}).content.decode()

    assert words in text_of(html)
    assert 'name="plan_token"' not in html and machines(cluster) == 3


def test_the_money_rules_are_the_creates(owner, cluster):
    client = owner.browser_client()
    Environment.objects.filter(pk=cluster.environment_id).update(monthly_budget=0)

    budget = text_of(client.get(page_url(cluster), {"count": "1"}).content.decode())

    assert "its whole monthly budget of $0.00" in budget
    Environment.objects.filter(pk=cluster.environment_id).update(monthly_budget=None)
    credit(owner.project, "-990.00")  # $10 and change left; 4 machines need $80 for an hour

    balance = text_of(client.get(page_url(cluster), {"count": "1"}).content.decode())

    assert "a cluster of 4 machines" in balance and "$80.00" in balance
    assert machines(cluster) == 3


def test_a_confirmed_post_the_money_rules_now_refuse_adds_nothing(owner, cluster):
    client = owner.browser_client()
    token = token_of(client.get(page_url(cluster), {"count": "1"}).content.decode())
    Environment.objects.filter(pk=cluster.environment_id).update(monthly_budget=0)

    response = client.post(page_url(cluster), {"count": "1", "plan_token": token})

    assert "its whole monthly budget of $0.00" in text_of(response.content.decode())
    assert machines(cluster) == 3


def test_strangers_get_404_and_add_nothing(owner, stranger, cluster):
    client = stranger.browser_client()

    assert client.get(page_url(cluster), {"count": "1"}).status_code == 404
    assert client.post(page_url(cluster), {"count": "1", "plan_token": "x"}).status_code == 404
    assert machines(cluster) == 3


# --- the API ------------------------------------------------------------------------------------


def api_url(cluster: Cluster, *, plan: bool = False) -> str:
    return f"/api/v1/clusters/{cluster.pk}/workers" + ("/plan" if plan else "")


def test_the_api_plans_then_adds_with_its_token(owner, cluster):
    api = owner.api()
    plan = api.post(api_url(cluster, plan=True), {"count": 2}, "application/json")

    assert plan.status_code == 200, plan.content
    data = plan.json()["data"]
    assert data["cluster_id"] == cluster.pk and data["count"] == 2
    assert data["machine_price_per_hour"] == "20.00"
    assert data["added_price_per_hour"] == "40.00"
    assert data["machines_now"] == 3 and data["price_per_hour"] == "60.00"
    assert data["machines_after"] == 5 and data["new_price_per_hour"] == "100.00"
    assert data["balance_needed"] == "100.00"
    assert data["billing"].startswith("+$40.00/h: each is billed from the moment it is up")
    assert data["plan_token"] and data["plan_expires_at"]
    assert machines(cluster) == 3  # the plan reserved nothing

    with Sim():
        done = api.post(
            api_url(cluster), {"count": 2, "plan_token": data["plan_token"]}, "application/json"
        )

    assert done.status_code == 202, done.content
    assert machines(cluster) == 5
    with Sim():  # the same token again (a retry): the cluster grew since, nothing more is added
        again = api.post(
            api_url(cluster), {"count": 2, "plan_token": data["plan_token"]}, "application/json"
        )
    assert again.status_code == 422 and again.json()["error"]["code"] == "plan_mismatch"
    assert machines(cluster) == 5


def test_the_api_refuses_a_token_for_another_count_and_changes_nothing(owner, cluster):
    api = owner.api()
    token = api.post(api_url(cluster, plan=True), {"count": 1}, "application/json").json()["data"][
        "plan_token"
    ]

    other = api.post(api_url(cluster), {"count": 2, "plan_token": token}, "application/json")
    forged = api.post(api_url(cluster), {"count": 1, "plan_token": "nope"}, "application/json")

    assert other.status_code == 422 and other.json()["error"]["code"] == "plan_mismatch"
    assert forged.status_code == 422 and forged.json()["error"]["code"] == "plan_mismatch"
    assert f"POST /api/v1/clusters/{cluster.pk}/workers/plan" in forged.json()["error"]["message"]
    assert machines(cluster) == 3


def test_the_api_refuses_an_expired_plan(owner, cluster, clock):
    api = owner.api()
    token = api.post(api_url(cluster, plan=True), {"count": 1}, "application/json").json()["data"][
        "plan_token"
    ]
    clock.move_to(timezone.now() + timedelta(minutes=11))

    late = api.post(api_url(cluster), {"count": 1, "plan_token": token}, "application/json")

    assert late.status_code == 422 and late.json()["error"]["code"] == "plan_expired"
    assert machines(cluster) == 3


def test_the_plan_is_refused_as_the_add_is(owner, cluster):
    api = owner.api()
    Environment.objects.filter(pk=cluster.environment_id).update(monthly_budget=0)

    plan = api.post(api_url(cluster, plan=True), {"count": 1}, "application/json")
    add = api.post(api_url(cluster), {"count": 1}, "application/json")
    too_many = api.post(api_url(cluster, plan=True), {"count": 0}, "application/json")

    assert plan.status_code == add.status_code == 402
    assert plan.json()["error"] == add.json()["error"]
    assert add.json()["error"]["code"] == "budget_reached"
    assert too_many.status_code == 422 and too_many.json()["error"]["code"] == "invalid_count"
    assert machines(cluster) == 3
