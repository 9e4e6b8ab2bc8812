"""The balance a create needs is one rule (`billing.balances.balance_needed`: one hour of the
whole cluster, never less than RUNCRATE_MIN_BALANCE): the create's refusal, the create page's
price card and the API's balance answer all show what it computes, and move with it."""

from decimal import Decimal

import pytest

from billing.balances import balance_needed
from clusters import lifecycle
from clusters.errors import ClusterRefused
from tests.clusters.front import credit, machine_type_with_hosts, ssh_key


@pytest.mark.parametrize(
    ("floor", "needed"),
    [
        ("10.00", "12.00"),  # one hour of two machines at 6.00 is more than the floor
        ("50.00", "50.00"),  # the floor is more than one hour
    ],
)
def test_every_surface_shows_the_balance_the_rule_computes(owner, settings, floor, needed):
    settings.RUNCRATE_MIN_BALANCE = Decimal(floor)
    machine_type = machine_type_with_hosts(free=2, price_per_hour=Decimal("6.00"))
    ssh_key(owner.project)
    credit(owner.project, "11.00")  # short of either figure
    assert balance_needed(Decimal("12.00")) == Decimal(needed)

    page = owner.browser_client().get(f"/clusters/new/?offer={machine_type.slug}&nodes=2")
    summary = page.context["summary"]
    assert (summary["needed"], summary["short"]) == (Decimal(needed), True)
    assert f"${needed}" in page.content.decode()

    answer = owner.api().get("/api/v1/billing/balance", {"price_per_hour": "12.00"})
    assert answer.json()["data"]["balance_needed"] == needed
    assert answer.json()["data"]["minimum_balance"] == floor

    with pytest.raises(ClusterRefused) as refused:
        lifecycle.create_cluster(
            project=owner.project,
            user=owner.user,
            environment=owner.project.environments.get(name="default"),
            offer_slug=machine_type.slug,
            nodes=2,
            name="short",
            software="none",
        )
    assert refused.value.code == "insufficient_balance"
    assert f"needs at least ${needed}" in refused.value.message


def test_the_balance_answer_refuses_a_price_that_is_not_an_amount(owner):
    answer = owner.api().get("/api/v1/billing/balance", {"price_per_hour": "lots"})

    assert answer.status_code == 422
    assert answer.json()["error"]["code"] == "invalid_price"
