"""A host's log shown and downloaded with its control characters made visible (issue 33, item
11, L7): the tenant is root on the host, so a text may carry any escape sequence; the Logs tab
and the `.txt` download show ESC as ␛ (runcrate.text `visible_controls`), and `cat` of a
download replays nothing. The raw bytes only on request (`?raw=1`), named `.raw.txt`."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest
import time_machine

from clusters.models import Cluster, LogFetch, NodeLog
from runcrate.text import visible_controls
from tests.billing.conftest import bill_cluster

NOW = datetime(2026, 3, 20, 12, 0, tzinfo=UTC)
# Red text, the cursor moved home, the screen cleared, the window's title set, a carriage
# return hiding what came before, and a C1 CSI: what a booby-trapped `tail` might print.
TRAP = "ok\x1b[31m red\x1b[H\x1b[2J\x1b]0;pwned\x07 hidden\rshown\x9b1m\n\tindented\n"


@pytest.fixture(autouse=True)
def _frozen():
    with time_machine.travel(NOW, tick=False):
        yield


def kept_text(person) -> Cluster:
    cluster = bill_cluster(person.project, size=2, at=NOW - timedelta(hours=1))
    fetch = LogFetch.objects.create(node=cluster.nodes.get(index=1), group="logs", fetched_at=NOW)
    NodeLog.objects.create(
        fetch=fetch, kind="system", command="journalctl", output=TRAP, fetched_at=NOW
    )
    return cluster


def test_visible_controls_shows_every_control_but_line_feed_and_tab():
    assert visible_controls(TRAP) == (
        "ok␛[31m red␛[H␛[2J␛]0;pwned␇ hidden␍shown\\x9b1m\n\tindented\n"
    )
    every = "".join(chr(code) for code in range(0xA0))
    shown = visible_controls(every)
    controls = [c for c in shown if ord(c) < 0x20 or 0x7F <= ord(c) < 0xA0]
    assert controls == ["\t", "\n"]
    assert visible_controls("\u202eevil\u2066") == "\\u202eevil\\u2066"  # bidi reordering
    assert visible_controls("plain text, ünïcode ✓") == "plain text, ünïcode ✓"


def test_the_logs_tab_shows_escapes_as_visible_characters(owner):
    cluster = kept_text(owner)

    page = owner.browser_client().get(f"/clusters/{cluster.pk}/logs/node/?node=node-1")

    assert page.status_code == 200
    body = page.content.decode()
    assert "\x1b" not in body and "\x07" not in body and "\r" not in body and "\x9b" not in body
    assert "ok␛[31m red␛[H␛[2J␛]0;pwned␇ hidden␍shown\\x9b1m" in body
    assert f"/clusters/{cluster.pk}/logs/node-1/system.txt?raw=1" in body


def test_the_download_shows_them_too_and_gives_the_raw_bytes_only_on_request(owner):
    cluster = kept_text(owner)
    client = owner.browser_client()
    url = f"/clusters/{cluster.pk}/logs/node-1/system.txt"

    shown = client.get(url)
    raw = client.get(f"{url}?raw=1")

    assert shown.status_code == raw.status_code == 200
    assert shown.content.decode() == visible_controls(TRAP)
    assert b"\x1b" not in shown.content and b"\r" not in shown.content
    assert shown["Content-Disposition"] == (
        f'attachment; filename="{cluster.name}-node-1-system-20260320T120000Z.txt"'
    )
    assert raw.content.decode() == TRAP
    assert raw["Content-Disposition"] == (
        f'attachment; filename="{cluster.name}-node-1-system-20260320T120000Z.raw.txt"'
    )
    # Anything else than raw=1 is the shown text.
    assert client.get(f"{url}?raw=yes").content == shown.content
