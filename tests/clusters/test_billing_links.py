"""A link to the Billing page only for whom the permission table lets see it (billing.view,
accounts/permissions.py): a developer reads where the figures come from, with no link to a 403."""

import re
from datetime import UTC, datetime, timedelta
from decimal import Decimal

import time_machine

from accounts import permissions
from tests.billing.conftest import bill_cluster
from tests.clusters.front import credit, machine_type_with_hosts

NOW = datetime(2026, 3, 20, 12, 0, tzinfo=UTC)
BILLING_LINK = 'href="/billing/'


@time_machine.travel(NOW, tick=False)
def test_the_cluster_billing_tab_links_to_billing_only_for_whom_may_see_it(owner, teammate):
    cluster = bill_cluster(owner.project, size=2, at=NOW - timedelta(minutes=30))
    tab = f"/clusters/{cluster.pk}/billing/"
    assert permissions.role_of(teammate.user, owner.project) == "developer"

    as_owner = owner.browser_client().get(tab).content.decode()
    as_developer = teammate.browser_client().get(tab).content.decode()

    assert "Each machine" in as_owner and "Each machine" in as_developer
    assert BILLING_LINK in as_owner
    assert BILLING_LINK not in as_developer
    assert "its owners and managers see it on the Billing page" in as_developer
    assert teammate.browser_client().get("/billing/").status_code == 403


def test_the_create_form_asks_a_developer_to_get_credit_added_rather_than_link_to_a_403(
    owner, teammate
):
    machine_type = machine_type_with_hosts(free=4, price_per_hour=Decimal("20.00"))
    credit(owner.project, "30.00")
    url = f"/clusters/new/?offer={machine_type.slug}&nodes=4"

    as_owner = owner.browser_client().get(url).content.decode()
    as_developer = teammate.browser_client().get(url).content.decode()

    assert "needs at least $80.00" in as_owner and "needs at least $80.00" in as_developer
    assert re.search(r'href="/billing/[^"]*">Add credit</a>', as_owner)
    assert BILLING_LINK not in as_developer
    assert "Ask an owner or manager of the project to add credit." in as_developer
