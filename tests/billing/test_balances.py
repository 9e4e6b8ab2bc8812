"""The balance: a running total per project, moved with every ledger line and checked against
the ledger (billing/balances.py)."""

from datetime import UTC, datetime, timedelta
from decimal import Decimal

import pytest
import time_machine
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
    charge_usage(cluster_id=cluster.pk)  # 1.00 more
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
    assert f"project {project.pk}: balance $49.99, ledger $50.00" in capsys.readouterr().out

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

    assert len(long) == len(short) == 3  # the balance twice (one row each), the burn rate
    assert not [sql for sql in long if LedgerEntry._meta.db_table in sql]
    assert usage.summary(project_id=project.pk).balance == Decimal("21.00")
    assert balances.check() == []


def test_the_billing_page_runs_the_same_queries_at_1_and_3001_ledger_lines(owner):
    now = datetime(2026, 3, 20, 12, 0, tzinfo=UTC)
    add_credit(owner.project, "100.00", at=now - timedelta(days=40))
    client = owner.browser_client()
    client.get("/billing/")  # warm the session and the template cache

    with time_machine.travel(now, tick=False):
        with CaptureQueriesContext(connection) as short:
            client.get("/billing/")
        # Three thousand lines of earlier months (a long ledger), then the same page.
        LedgerEntry.objects.bulk_create(
            LedgerEntry(
                project=owner.project,
                kind="adjustment",
                amount=Decimal("0.01"),
                created_at=now - timedelta(days=40, minutes=minute),
            )
            for minute in range(3000)
        )
        balances.repair(balances.check())  # the bulk insert went around the running total
        with CaptureQueriesContext(connection) as long:
            response = client.get("/billing/")

    assert len(long) == len(short)
    assert response.context["summary"].balance == Decimal("130.00")
    # The balance is read from the project, not summed: no query sums the whole ledger.
    table = LedgerEntry._meta.db_table
    whole_ledger = [
        query["sql"]
        for query in long.captured_queries
        if table in query["sql"]
        and "SUM" in query["sql"]
        and "created_at" not in query["sql"]
        and "period_start" not in query["sql"]
    ]
    assert whole_ledger == []
