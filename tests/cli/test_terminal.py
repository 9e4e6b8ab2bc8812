"""What a person sees at a terminal: rich tables and the live per-node display, not JSON."""

import re

import pytest
from django.utils import timezone

from offers.models import TrackRecord
from tests.cli.kit import assert_no_traceback, ready_cluster, run_cli_tty
from tests.clusters.lifecycle_kit import inventory
from tests.factories import HostFactory, MachineTypeFactory

pytestmark = pytest.mark.django_db(transaction=True)


def machine_rows(screen: str) -> list[list[str]]:
    return [
        [cell.strip() for cell in line.strip("│ ").split("│")]
        for line in screen.splitlines()
        if line.startswith("│ node-")
    ]


def test_create_wait_shows_every_machine_until_ready(env, tmp_path, account, ticker):
    offer = inventory(hosts=3, price="20.00")

    result = run_cli_tty(
        "clusters", "create", "--offer", offer.slug, "--nodes", "3", "--name", "live", "--wait",
        "--yes", env=env, tmp_path=tmp_path, drive=ticker,
    )  # fmt: skip

    assert result.code == 0, result.stderr
    screen = result.stdout
    assert screen.startswith("Plan for cluster live")  # the plan first, then the display
    first = screen[screen.index("cluster live (id ") :]  # the display, not JSON
    assert "provisioning" in first.splitlines()[0]  # its first frame, before any machine moved
    final = screen[screen.rindex("cluster live (id ") :]
    assert "ready" in final.splitlines()[0] and "$60.00/h" in final.splitlines()[0]
    assert machine_rows(final) == [
        [f"node-{i}", "joined", "done", "███", f"10.77.0.{i + 1}"] for i in range(3)
    ]
    assert "is ready: `runcrate ssh live`" in result.stderr
    assert_no_traceback(result)


def test_offers_are_a_table_with_the_community_warning(env, tmp_path, account):
    offer = inventory(hosts=2, price="20.00")
    community = MachineTypeFactory(gpu=offer.gpu, community=True, slug="comm-x")
    HostFactory.create_batch(2, machine_type=community)
    # 199 of 200 started, half of them within 8 minutes: the offers page's badge.
    TrackRecord.objects.create(
        machine_type=offer, clusters=200, started=199, ready_median_seconds=470,
        ready_p95_seconds=900, computed_at=timezone.now(),
    )  # fmt: skip

    result = run_cli_tty(
        "offers", "--gpu", offer.gpu.slug, "--nodes", "2", "--include-community",
        env=env, tmp_path=tmp_path,
    )  # fmt: skip

    assert result.code == 0, result.stderr
    lines = [line for line in result.stdout.splitlines() if line.startswith("│")]
    cells = [[cell.strip() for cell in line.strip("│").split("│")] for line in lines]
    first = cells.index(next(row for row in cells if row[0] == offer.slug))
    # An offer is a row of lines: its price column the cluster, each machine, one GPU.
    assert [row[2] for row in cells[first : first + 3]] == [
        "$40.00/h",
        "$20.00/h each",
        "$2.50/GPU-h",
    ]
    assert cells[first][3] == "available"
    assert cells[first + 1][1] == "99% started · ~8 min"
    community = next(i for i, row in enumerate(cells) if row[0] == "comm-x")
    assert "(community)" in " ".join(row[1] for row in cells[community : community + 4])
    assert cells[community + 1][1] == "no track record yet"
    assert "keep secrets off" in result.stdout


def test_list_show_events_and_balance_render_for_a_person(env, tmp_path, account, ticker):
    cluster = ready_cluster(account, ticker, name="seen")

    listed = run_cli_tty("clusters", "list", env=env, tmp_path=tmp_path)
    shown = run_cli_tty("clusters", "show", "seen", env=env, tmp_path=tmp_path)
    events = run_cli_tty("clusters", "events", "seen", env=env, tmp_path=tmp_path)
    balance = run_cli_tty("balance", env=env, tmp_path=tmp_path)
    gpus = run_cli_tty("gpus", env=env, tmp_path=tmp_path)
    usage = run_cli_tty("usage", env=env, tmp_path=tmp_path)
    volumes = run_cli_tty("volumes", "list", env=env, tmp_path=tmp_path)

    for result in (listed, shown, events, balance, gpus, usage, volumes):
        assert result.code == 0, result.stderr
        assert_no_traceback(result)
    row = next(line for line in listed.stdout.splitlines() if " seen " in line)
    cells = [cell.strip() for cell in row.strip("│").split("│")]
    assert cells[:5] == [
        str(cluster.pk),
        "seen",
        "ready",
        f"2 × 8× h100-sxm in {cluster.machine_type.location.code}",
        "$40.00/h",
    ]
    assert re.fullmatch(r"\$\d+\.\d\d so far", cells[5]), cells  # the one cost (docs/billing.md)
    assert "seen (id" in shown.stdout and "status      ready" in shown.stdout
    assert len(machine_rows(shown.stdout)) == 2
    assert "ready" in events.stdout and "created" in events.stdout
    assert "Balance      $10000.00 USD" in balance.stdout
    assert "Burn rate    $40.00/h" in balance.stdout
    assert "h100-sxm" in gpus.stdout
    assert "Usage in 2026-03" in usage.stdout
    assert volumes.stdout.strip() == "No volumes."
