"""In Chromium, with the CLI and an MCP client (issue 37, "One cost"): one cluster that adds a
worker and terminates gives the same cost to the cent everywhere at the same instant (the clock
frozen for the test and the live server alike): the page's header, its Billing tab and the sum
of the tab's rows, the Clusters list, the Billing page, the API, `runcrate clusters show --json`
and the MCP server's `get_cluster`; the CLI's terminate prints the final cost.

`RUNCRATE_COST_SHOTS=<folder>` saves the cost header at 1280 and 390 px there."""

import os
import re
from datetime import timedelta
from decimal import Decimal
from pathlib import Path

import pytest
from django.utils import timezone

from billing.meter import charge_accrued
from clusters import lifecycle
from clusters.models import Cluster, Node
from tests.cli.kit import (  # noqa: F401 - fixtures
    account,
    clock,
    drive_until,
    env,
    ready_cluster,
    run_cli,
    run_cli_tty,
    sim,
    ticker,
)
from tests.conftest import log_in
from tests.mcp.kit import payload, talk

pytestmark = [pytest.mark.browser, pytest.mark.django_db(transaction=True)]

PASSWORD = "correct-horse-battery"


def usd(text: str) -> Decimal:
    """`$1,234.56` (or `−$…`, `+$…`) as a Decimal, its sign dropped."""
    return Decimal(re.sub(r"[^\d.]", "", text))


def mcp_cluster(cli_env: dict, tmp_path, cluster_id: int, name: str) -> dict:
    async def conversation(session):
        return await session.call_tool("get_cluster", {"cluster": cluster_id})

    return payload(talk(cli_env, tmp_path, conversation, name=name))["cluster"]


def page_figures(page, cluster: Cluster) -> dict[str, Decimal]:
    """The cost as the header, the Billing tab, its rows, the list and the Billing page say it."""
    page.goto(f"/clusters/{cluster.pk}/billing/")
    header = usd(page.locator("#cluster-cost .cost-figure").inner_text())
    tab = usd(page.locator("#billing-cost").inner_text())
    rows = sum(map(usd, page.locator("#billing-machines .machine-cost").all_inner_texts()))
    page.goto("/clusters/")
    row = page.locator("#cluster-rows tr", has=page.get_by_role("link", name=cluster.name))
    listed = usd(row.locator("td.cost-so-far").inner_text().split("\n")[0])
    page.goto("/billing/")
    line = page.locator("tr.line-usage", has_text=f"Cluster usage — {cluster.name}")
    billing = usd(line.locator("td.amount-debit").inner_text())
    return {
        "header": header,
        "billing tab": tab,
        "billing tab's rows": rows,
        "clusters list": listed,
        "billing page": billing,
    }


def shoot(page, cluster: Cluster, name: str) -> None:
    folder = os.environ.get("RUNCRATE_COST_SHOTS")
    if not folder:
        return
    for width in (1280, 390):
        page.set_viewport_size({"width": width, "height": 900})
        page.goto(f"/clusters/{cluster.pk}/billing/")
        page.screenshot(path=str(Path(folder) / f"{name}-{width}.png"))
    page.set_viewport_size({"width": 1280, "height": 900})


def test_one_cluster_has_one_cost_everywhere_through_a_worker_and_terminate(
    page, tmp_path, request
):
    # The CLI's fixtures (tests/cli/kit.py): the clock frozen for the test and the live server
    # alike, the simulated data center's beat, a funded account and the CLI's environment.
    frozen, beat = request.getfixturevalue("clock"), request.getfixturevalue("ticker")
    person, cli = request.getfixturevalue("account"), request.getfixturevalue("env")
    person.user.set_password(PASSWORD)
    person.user.save()
    cluster = ready_cluster(person, beat, hosts=4, price="5.58", name="train")
    lifecycle.add_workers(cluster=cluster, count=1)

    def worker_joined(_seconds: float) -> bool:
        cluster.refresh_from_db()
        joined = cluster.nodes.filter(status=Node.Status.JOINED).count()
        return joined == 3 and cluster.status == Cluster.Status.READY

    drive_until(worker_joined, drive=beat, timeout=30)
    # Time passes; the meter last ran 47 s before the instant every figure is read at.
    frozen.shift(timedelta(hours=1, minutes=13, seconds=29))
    charge_accrued(now=timezone.now() - timedelta(seconds=47))
    log_in(page, person)

    figures = page_figures(page, cluster)
    api = person.api_data(f"/clusters/{cluster.pk}")
    shown = run_cli("clusters", "show", "train", "--json", env=cli, tmp_path=tmp_path).json()
    mcp = mcp_cluster(cli, tmp_path, cluster.pk, "running")
    shoot(page, cluster, "cost-running")

    cost = Decimal(api["cost_so_far"])
    assert cost > 0 and api["final_cost"] is None
    assert figures == dict.fromkeys(figures, cost), figures
    assert Decimal(shown["cost_so_far"]) == Decimal(mcp["cost_so_far"]) == cost
    assert sum(Decimal(m["cost"]) for m in api["machines"]) == cost
    assert api["nodes"] == shown["nodes"] == mcp["nodes"] == 3  # the worker counts
    page.goto("/clusters/")
    expect_size = page.locator("#cluster-rows tr", has=page.get_by_role("link", name="train"))
    assert "3 machines" in expect_size.locator("td[data-label=Size]").inner_text()

    # At a terminal, as a person runs it (the CLI this checkout's, where PYTHONPATH says).
    tty_env = {**cli, **{k: v for k, v in os.environ.items() if k == "PYTHONPATH"}}
    terminated = run_cli_tty(
        "clusters", "terminate", "train", "--yes", env=tty_env, tmp_path=tmp_path
    )
    assert terminated.code == 0, terminated.stderr
    api = person.api_data(f"/clusters/{cluster.pk}")
    final = Decimal(api["final_cost"])
    last = terminated.stdout.strip().splitlines()[-1]
    assert last == f"Terminated: 3 machines for {api['billed_for']}, ${api['final_cost']}"
    assert final == cost  # the clock stands still: terminate ends billing at that instant

    # Terminating and then terminated: the same final figure, and three machines, everywhere.
    for status in ("terminating", "terminated"):
        cluster.refresh_from_db()
        assert cluster.status == status
        figures = page_figures(page, cluster)
        api = person.api_data(f"/clusters/{cluster.pk}")
        mcp = mcp_cluster(cli, tmp_path, cluster.pk, status)
        assert figures == dict.fromkeys(figures, final), (status, figures)
        assert Decimal(api["final_cost"]) == Decimal(mcp["final_cost"]) == final
        page.goto(f"/clusters/{cluster.pk}/")
        assert "3 machines ·" in page.locator("#cluster-status").inner_text()
        if status == "terminating":
            shoot(page, cluster, "cost-terminating")
            drive_until(
                lambda _s: Cluster.objects.get(pk=cluster.pk).is_final, drive=beat, timeout=30
            )
    shoot(page, cluster, "cost-terminated")
