"""The refusal of what the balance does not cover, worded for who reads it: the customer reads
"Your balance …", staff acting for the project in the admin read "The project's balance …"
(one home: billing.balances.short_of_balance)."""

from decimal import Decimal

import pytest
from django.urls import reverse

from billing import balances
from clusters.errors import ClusterRefused
from clusters.models import Cluster
from tests.clusters.conftest import sim  # noqa: F401 - the fixture, used by name
from tests.clusters.lifecycle_kit import create, inventory, new_project
from tests.clusters.test_quoted_clusters import (  # noqa: F401 - fixtures, used by name
    form_data,
    infiniband,
    staff,
    won_quote,
)


def test_it_says_whose_balance_to_each_reader(settings):
    settings.RUNCRATE_MIN_BALANCE = Decimal("10.00")
    words = {"balance": Decimal("4"), "needed": Decimal("47.84"), "doing": "creating this cluster"}

    customer = balances.short_of_balance(**words)
    staff_reads = balances.short_of_balance(**words, staff=True)

    assert customer == (
        "Your balance is $4.00; creating this cluster needs at least $47.84 (one hour of the "
        "whole cluster; never less than $10.00)."
    )
    assert staff_reads == customer.replace("Your balance", "The project's balance")


def test_the_lifecycle_refuses_the_customer_in_their_words_and_carries_the_staffs(db, sim):  # noqa: F811
    machine_type = inventory(hosts=2, price="20.00")
    _, project = new_project(balance="4.00")

    with pytest.raises(ClusterRefused) as refused:
        create(project, machine_type, nodes=2)

    assert refused.value.code == "insufficient_balance"
    assert refused.value.message.startswith("Your balance is $4.00; creating this cluster")
    assert refused.value.message_for(staff=False) == refused.value.message
    assert refused.value.message_for(staff=True).startswith(
        "The project's balance is $4.00; creating this cluster needs at least $40.00"
    )


def test_the_admin_tells_staff_of_the_projects_balance(staff, infiniband, sim):  # noqa: F811
    _, poor = new_project(balance="874.99")

    refused = staff.post(
        reverse("admin:clusters_cluster_add"), form_data(won_quote(poor, infiniband), infiniband)
    )

    errors = " ".join(refused.context["form"].non_field_errors())
    assert errors.startswith("The project's balance is $874.99; ")
    assert "Your balance" not in refused.content.decode()
    assert not Cluster.objects.exists()
