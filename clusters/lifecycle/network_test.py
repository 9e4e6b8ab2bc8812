"""The network test a user asks for (docs/lifecycle.md, "The network test"): the action that
starts it, the task's slow part (the driver's measurement, outside any transaction) and its
write-back, and how the pages and the API read the last result."""

from __future__ import annotations

import logging
import secrets
from datetime import datetime, timedelta

from django.db import transaction
from django.utils import timezone
from django.utils.dateparse import parse_datetime

from accounts.models import User
from clusters import connect
from clusters.errors import ClusterRefused
from clusters.lifecycle import dispatch
from clusters.lifecycle.rules import lock_cluster, with_node_names
from clusters.lifecycle.work import install_plan
from clusters.machines import get_driver
from clusters.machines.base import DriverError, NetworkTestResult
from clusters.models import Cluster, Event, Node
from runcrate.durations import in_words

log = logging.getLogger(__name__)

# How long a test may run: past it the test reads as failed and another may start (a worker
# that died mid-test leaves it behind). Every remote command is bounded well inside it.
NETWORK_TEST_SECONDS = 15 * 60

Reason = Event.Reason


def run_network_test(*, cluster: Cluster, user: User | None = None) -> Cluster:
    """Start a network test between the machines of a ready (or degraded) cluster: refused with
    `invalid_state` otherwise (or without node-0 and another machine up), and with
    `network_test_running` while one runs. The measurement is a task's, after commit."""
    now = timezone.now()
    with transaction.atomic():
        locked = lock_cluster(cluster.pk)
        if locked is None:
            raise ClusterRefused("invalid_state", "This cluster is gone.")
        nodes = list(locked.nodes.order_by("index", "pk"))
        refusal = locked.network_test_refusal(nodes, now)
        if refusal is not None:
            raise ClusterRefused(*refusal)
        machines = [n.name for n in nodes if n.status == Node.Status.JOINED]
        token = secrets.token_hex(16)
        locked.network_test = {
            "state": "running",
            "token": token,
            "started_at": now.isoformat(),
            "expires_at": (now + timedelta(seconds=NETWORK_TEST_SECONDS)).isoformat(),
            "finished_at": None,
            "requested_by": user.email if user else None,
            "machines": machines,
            "method": None,
            "simulated": False,
            "results": {},
            "error": None,
        }
        version = locked.bump_version()
        locked.save(update_fields=["network_test", "version"])
        who = f" by {user.email}" if user else ""
        Event.objects.create(
            cluster=locked,
            at=now,
            reason=Reason.NETWORK_TEST_STARTED,
            message=f"Network test requested{who}: measuring between {', '.join(machines)}.",
            version=version,
        )
        dispatch.current().network_test(locked.pk, token)
    return locked


@dispatch.runs("network_test")
def do_network_test(*, cluster_id: int, token: str) -> bool:
    """Measure, if `token` is still the running test's, and write the result back only if it
    still is. Returns whether the result was written (a second run of the task writes none)."""
    cluster = (
        Cluster.objects.select_related("machine_type__gpu", "machine_type__location")
        .filter(pk=cluster_id)
        .first()
    )
    if cluster is None or (cluster.network_test or {}).get("token") != token:
        return False
    if not cluster.network_test_running():
        return False
    nodes = list(
        cluster.nodes.filter(status=Node.Status.JOINED)
        .select_related("host")
        .order_by("index", "pk")
    )
    result = _measure(cluster, nodes)
    return _write_back(cluster_id=cluster_id, token=token, result=result)


def _measure(cluster: Cluster, nodes: list[Node]) -> NetworkTestResult:
    if len(nodes) < 2 or nodes[0].index != 0:
        return NetworkTestResult(
            ok=False, error="node-0 and at least one other machine must be up to be measured."
        )
    try:
        driver = get_driver(nodes[0].reserved_host)
        return driver.network_test(cluster, nodes=nodes, plan=install_plan(cluster, nodes))
    except DriverError as error:  # the driver says what went wrong: no traceback needed
        log.warning("cluster %s: the network test failed: %s", cluster.pk, error.message)
        return NetworkTestResult(
            ok=False, error=with_node_names(error.message, nodes)[:1000], output=error.output
        )
    except Exception as error:  # a broken test must not read as running for 15 minutes
        log.exception("cluster %s: the network test broke", cluster.pk)
        return NetworkTestResult(ok=False, error=f"The test broke: {type(error).__name__}.")


def _write_back(*, cluster_id: int, token: str, result: NetworkTestResult) -> bool:
    now = timezone.now()
    with transaction.atomic():
        locked = lock_cluster(cluster_id)
        test = (locked.network_test or {}) if locked else {}
        if test.get("token") != token or test.get("state") != "running":
            return False  # another test took its place, or this one was written already
        assert locked is not None  # else `test` was empty
        test = {
            **test,
            "state": "done" if result.ok else "failed",
            "finished_at": now.isoformat(),
            "method": result.method or None,
            "simulated": result.simulated,
            "results": result.results,
            "error": result.error or None,
        }
        locked.network_test = test
        version = locked.bump_version()
        locked.save(update_fields=["network_test", "version"])
        Event.objects.create(
            cluster=locked,
            at=now,
            reason=Reason.NETWORK_TEST_DONE if result.ok else Reason.NETWORK_TEST_FAILED,
            message=_summary(test),
            output=result.output[-20_000:],
            version=version,
        )
    return True


def _summary(test: dict) -> str:
    """The event's sentence: the figures, or why there are none."""
    results = test["results"] or {}
    if test["state"] == "failed":
        return f"Network test failed: {test['error']}"
    if test["method"] == "nccl":
        largest = results["sizes"][-1]
        simulated = ", simulated" if test["simulated"] else ""
        figures = (
            f"all_reduce_perf{simulated}: bus bandwidth {largest['busbw_gbs']:.2f} GB/s at "
            f"{_size(largest['bytes'])}, {results['avg_busbw_gbs']:.3g} GB/s on average"
        )
    else:
        pairs = "; ".join(
            f"{p['node']} → {p['to']} {p['gbit_s']:.2f} Gbit/s" for p in results["pairs"]
        )
        figures = f"the agents' own test: {pairs}"
    expected = connect.ETHERNET_GBITS
    return f"Network test done ({figures}). Ethernet is expected to give about {expected}."


def _size(size: int) -> str:
    for unit, scale in (("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)):
        if size >= scale and size % scale == 0:
            return f"{size // scale} {unit}"
    return f"{size} B"


def _time(us: float) -> str:
    if us < 1000:
        return f"{us:.0f} µs"
    return f"{us / 1000:.1f} ms" if us < 1_000_000 else f"{us / 1_000_000:.2f} s"


PASSED = "passed"
BELOW_ETHERNET = "below what Ethernet should give"
MIN_NCCL_BUSBW_GBS = 0.1  # nccl: all_reduce_perf's peak bus bandwidth, GB/s
MIN_AGENT_GBITS = 1.0  # agent: every machine's bandwidth to node-0, Gbit/s
VERDICT_RULE = (
    f"passed when all_reduce_perf's peak bus bandwidth is at least {MIN_NCCL_BUSBW_GBS} GB/s "
    f"(nccl), or every machine reaches node-0 at {MIN_AGENT_GBITS:g} Gbit/s or more (agent): "
    "the lower end of what the Ethernet private network is expected to give"
)


def verdict(*, state: str, method: str | None, peak_busbw_gbs: float | None, pairs) -> str | None:
    """PASSED or BELOW_ETHERNET for a finished test, by VERDICT_RULE; None while it runs, when
    it failed before measuring, or when it measured nothing. The API, the CLI and the MCP
    server all show this one verdict."""
    if state != "done":
        return None
    if method == "nccl":
        if peak_busbw_gbs is None:
            return None
        return PASSED if peak_busbw_gbs >= MIN_NCCL_BUSBW_GBS else BELOW_ETHERNET
    rates = [pair.get("gbit_s") for pair in pairs or []]
    if not rates:
        return None
    # A machine that could not be measured (its error instead of a figure) did not pass.
    passed = all(rate is not None and rate >= MIN_AGENT_GBITS for rate in rates)
    return PASSED if passed else BELOW_ETHERNET


def network_test_report(cluster: Cluster, now: datetime | None = None) -> dict | None:
    """The last network test as the page and the API show it, or None when none was asked for.
    A test that ran past its time reads as failed; its token never leaves the database."""
    test = cluster.network_test or {}
    if not test.get("state"):
        return None
    state, error = test["state"], test.get("error")
    if state == "running" and not cluster.network_test_running(now):
        state = "failed"
        error = (
            f"It did not finish within {in_words(NETWORK_TEST_SECONDS)} (its worker may have "
            "stopped); run it again."
        )
    results = test.get("results") or {}
    sizes = [
        {**row, "size": _size(row["bytes"]), "time": _time(row["time_us"])}
        for row in results.get("sizes") or []
    ]
    peak = max((row["busbw_gbs"] for row in sizes), default=None)
    return {
        "state": state,
        "method": test.get("method"),
        "verdict": verdict(
            state=state, method=test.get("method"), peak_busbw_gbs=peak, pairs=results.get("pairs")
        ),
        "verdict_rule": VERDICT_RULE,
        "simulated": bool(test.get("simulated")),
        "started_at": parse_datetime(test.get("started_at") or ""),
        "finished_at": parse_datetime(test.get("finished_at") or ""),
        "requested_by": test.get("requested_by"),
        "machines": test.get("machines") or [],
        "error": error,
        "sizes": sizes or None,
        "avg_busbw_gbs": results.get("avg_busbw_gbs"),
        "peak_busbw_gbs": peak,
        "pairs": results.get("pairs"),
        "command": results.get("command"),
        "expected": connect.expected_bandwidth(),
    }
