"""The balance: a running total per project, moved with every ledger line and checked against
the ledger (billing/balances.py)."""

from datetime import UTC, datetime, timedelta
from decimal import Decimal

import pytest
from django.core.management import CommandError, call_command
from django.db import IntegrityError, connection, transaction
from django.test.utils import CaptureQueriesContext

from accounts.models import Project
from billing import balances, ledger, usage
from billing.meter import charge_accrued, charge_usage
from billing.models import LedgerEntry, Payment, balance_of
from tests.billing.conftest import add_credit, bill_cluster, end_cluster
from tests.factories import ProjectFactory

T0 = datetime(2026, 3, 10, 9, 0, tzinfo=UTC)


def stored(project) -> Decimal:
    return Project.objects.values_list("balance", flat=True).get(pk=project.pk)


def test_every_kind_of_line_moves_the_stored_balance_and_the_check_agrees(db):
    project, other = ProjectFactory(), ProjectFactory()
    add_credit(project, "100.00", at=T0)
    ledger.credit(project=project, amount="-2.50", note="staff debit")
    add_credit(other, "7.00", at=T0)
    cluster = bill_cluster(project, size=2, price="36.00", at=T0)
    bill_cluster(other, size=1, price="3.60", at=T0)
    charge_accrued(now=T0 + timedelta(seconds=100))  # 2.00 and 0.10
    end_cluster(cluster, at=T0 + timedelta(seconds=150))
    charge_usage(cluster=cluster)  # 1.00 more
    charge_accrued(now=T0 + timedelta(hours=2, seconds=5))  # 3.60 × 2 h 5 s on `other`

    assert stored(project) == Decimal("100.00") - Decimal("2.50") - Decimal("3.00")
    assert stored(other) == Decimal("7.00") - Decimal("7.21")
    assert balance_of(project.pk) == stored(project)
    assert balances.balances({project.pk, other.pk}) == {
        project.pk: stored(project),
        other.pk: stored(other),
    }
    assert balances.check() == []


def test_the_check_reports_a_balance_the_ledger_does_not_explain_and_repairs_it(db, capsys):
    project, fine = ProjectFactory(), ProjectFactory()
    add_credit(project, "50.00")
    add_credit(fine, "10.00")
    Project.objects.filter(pk=project.pk).update(balance=Decimal("49.99"))

    assert balances.check() == [
        balances.Difference(project_id=project.pk, stored=Decimal("49.99"), ledger=Decimal("50.00"))
    ]
    with pytest.raises(CommandError, match="1 balance"):
        call_command("check_balances")
    assert f"project {project.pk}: balance 49.99 USD, ledger 50.00 USD" in capsys.readouterr().out

    call_command("check_balances", "--repair")

    assert stored(project) == Decimal("50.00")
    assert balances.check() == []
    call_command("check_balances")
    assert "Every balance is the sum of its ledger." in capsys.readouterr().out


def test_a_line_that_cannot_be_written_leaves_the_balance_alone(db):
    project = ProjectFactory()
    add_credit(project, "10.00")

    payment = Payment.objects.create(project=project, amount=Decimal("5.00"), idempotency_key="k")

    # Only a top-up may credit a payment: the database refuses this line, and its balance move.
    with pytest.raises(IntegrityError), transaction.atomic():
        LedgerEntry.objects.create(
            project=project, kind="adjustment", amount=Decimal("5.00"), payment=payment
        )

    assert stored(project) == Decimal("10.00")


def _balance_queries(project) -> list[str]:
    with CaptureQueriesContext(connection) as queries:
        balance_of(project.pk)
        usage.summary(project_id=project.pk)
    return [query["sql"] for query in queries.captured_queries]


def test_reading_the_balance_does_not_read_the_ledger_however_long_it_is(db):
    project = ProjectFactory()
    add_credit(project, "1.00")
    short = _balance_queries(project)
    LedgerEntry.objects.bulk_create(
        LedgerEntry(project=project, kind="adjustment", amount=Decimal("0.01")) for _ in range(2000)
    )
    Project.objects.filter(pk=project.pk).update(balance=Decimal("21.00"))

    long = _balance_queries(project)

    assert len(long) == len(short) == 4  # the balance twice (one row each), the burn rate (2)
    assert not [sql for sql in long if LedgerEntry._meta.db_table in sql]
    assert usage.summary(project_id=project.pk).balance == Decimal("21.00")
    assert balances.check() == []
