"""The minimum balance a create needs is one rule, and the create page says what the create
does: for a balance a cent under, at, and a cent over what the create needs (one hour of the
whole cluster, never less than RUNCRATE_MIN_BALANCE), with another cluster already running,
the create page (the full page, its price summary, to an owner and to a developer) shows the
same figure and the same allowed or refused state as the API's create, whose refusal is
`insufficient_balance`. A page that computed its own figure or comparison differently fails."""

import re
from decimal import Decimal

import pytest

from clusters import lifecycle
from tests.billing.conftest import bill_cluster
from tests.clusters.front import credit, machine_type_with_hosts, ssh_key
from tests.factories import LocationFactory

SLUG = "use2-h100x8-vm"
NEEDS = re.compile(r"needs at least (\$[\d,]+\.\d\d)")
CENT = Decimal("0.01")


@pytest.fixture(autouse=True)
def _work_in_memory():
    # Nothing is handed to Celery: what the lifecycle hands off stays in memory, unrun.
    with lifecycle.dispatching_to(lifecycle.CollectingDispatcher()):
        yield


def squash(html: str) -> str:
    return " ".join(re.sub(r"<[^>]+>", " ", html).split())


def page_says(client, nodes: int, *, htmx: bool = False) -> tuple[bool, str | None]:
    """(whether the price card lets the create through, the figure it says is needed)."""
    headers = {"HX-Request": "true"} if htmx else {}
    response = client.get(f"/clusters/new/?offer={SLUG}&nodes={nodes}", headers=headers)
    assert response.status_code == 200
    html = response.content.decode()
    # The price card alone (the top bar shows the balance on every page).
    card = html[html.index('id="price-summary"') :].split('class="note small ready-estimate"')[0]
    needs = NEEDS.search(squash(card))
    covers = 'class="small muted balance-covers"' in card
    assert covers != bool(needs), card  # the card says one or the other
    return covers, needs.group(1) if needs else None


def api_says(person, nodes: int) -> tuple[bool, str | None]:
    """(whether the API creates the cluster, the figure its refusal says is needed)."""
    body = {"name": "train", "offer_id": SLUG, "nodes": nodes, "software": "none"}
    response = person.api().post("/api/v1/clusters", body, content_type="application/json")
    if response.status_code == 201:
        return True, None
    error = response.json()["error"]
    assert (response.status_code, error["code"]) == (402, "insufficient_balance"), error
    return False, NEEDS.search(error["message"]).group(1)


@pytest.mark.parametrize(
    ("price", "nodes", "minimum", "needed"),
    [
        ("10.00", 3, "10.00", "30.00"),  # one hour of the whole cluster
        ("2.00", 2, "10.00", "10.00"),  # never less than the minimum, however cheap
        ("5.00", 2, "10.00", "10.00"),  # one hour is exactly the minimum
        ("5.00", 2, "25.00", "25.00"),  # the minimum is a setting, read by both
    ],
)
@pytest.mark.parametrize("off", [-CENT, Decimal(0), CENT])
def test_the_create_page_shows_the_figure_and_the_answer_of_the_apis_create(
    owner, teammate, settings, price, nodes, minimum, needed, off
):
    settings.RUNCRATE_MIN_BALANCE = Decimal(minimum)
    ssh_key(owner.project)
    machine_type_with_hosts(
        free=nodes,
        slug=SLUG,
        price_per_hour=Decimal(price),
        location=LocationFactory(code="us-east-2", name="Columbus, Ohio"),
    )
    bill_cluster(owner.project, size=2, price="7.00")  # what already runs: $14.00/h
    credit(owner.project, str(Decimal(needed) + off))
    allowed = off >= 0

    owner_page = page_says(owner.browser_client(), nodes)
    owner_summary = page_says(owner.browser_client(), nodes, htmx=True)
    developer_page = page_says(teammate.browser_client(), nodes)
    api = api_says(owner, nodes)  # last: a create that goes through reserves the machines

    figure = None if allowed else f"${needed}"
    assert api == (allowed, figure)
    assert owner_page == owner_summary == developer_page == api
