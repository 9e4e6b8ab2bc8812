"""`python -m bench.labtime`: create → ready and releases, timed on the host lab's real hosts
with the product's real processes (docs/lab.md, "Timing clusters on the lab").

It brings the lab up with the hosts the runs need (as `make lab` does), loads them into a
throwaway PostgreSQL database (`<name>_labtime`, their baselines recorded), starts the product
as `HOST=172.30.77.1 make run` does (bin/run.py: the web server, the default, machines,
releases, logs and notify workers, the beat), creates each cluster through the lifecycle,
waits for it with a bounded poll, prints each phase's time from the cluster's own records, then
ends it and times its hosts' release. Everything it started is stopped at the end, the database
dropped, and the lab taken down if it was down before (else its hosts are reset).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import re
import signal
import statistics
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from urllib.parse import urlsplit, urlunsplit

ROOT = Path(__file__).resolve().parent.parent
SOFTWARE = ("none", "slurm", "ray", "kubernetes")
MACHINE_TYPE = "lab-h100x2-vm"  # hostlab's inventory: location `lab`, 2 stand-in H100s a host
POLL_SECONDS = 0.5


@dataclass(frozen=True)
class Run:
    """One cluster to time: its software and size."""

    software: str
    nodes: int

    @classmethod
    def parse(cls, text: str) -> Run:
        software, _, count = text.partition(":")
        if software not in SOFTWARE or not count.isdigit() or not 2 <= int(count) <= 60:
            raise argparse.ArgumentTypeError(
                f"{text!r}: a run is SOFTWARE:NODES, software one of {', '.join(SOFTWARE)}, "
                "2 to 60 nodes"
            )
        return cls(software, int(count))

    def __str__(self) -> str:
        return f"{self.software} × {self.nodes}"


def load_average() -> str:
    return " ".join(f"{value:.1f}" for value in os.getloadavg())


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m bench.labtime", description=__doc__)
    parser.add_argument(
        "runs",
        nargs="+",
        type=Run.parse,
        metavar="SOFTWARE:NODES",
        help="clusters to time one after another, e.g. none:8 slurm:8 ray:6",
    )
    parser.add_argument(
        "--during-release",
        type=int,
        default=0,
        metavar="NODES",
        help="also time a `none` cluster of NODES on spare hosts quietly, then again created "
        "while the last run's hosts are released (and one host's release alone)",
    )
    parser.add_argument(
        "--acceptance-floor",
        type=int,
        metavar="MBIT",
        help="the product's acceptance minimum for this run (RUNCRATE_ACCEPTANCE_MIN_MBIT, with "
        "RUNCRATE_ACCEPTANCE_LINK_FRACTION 0.01): on a loaded lab, times rather than a verdict",
    )
    parser.add_argument("--boot-seconds", type=int, default=300, help="the inventory's (300)")
    parser.add_argument(
        "--timeout", type=float, default=420, help="the most a cluster or a release may take"
    )
    return parser


def main(argv: list[str] | None = None) -> int:
    options = build_parser().parse_args(argv)
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "config.settings")
    import django

    django.setup()
    from django.db import connection

    from lab import hostlab

    reason = hostlab.unavailable_reason()
    if reason:
        print(f"labtime: the lab cannot run here: {reason}", file=sys.stderr)
        return 2
    if connection.vendor != "postgresql" or not os.environ.get("REDIS_URL"):
        print(
            "labtime: the product's processes share the database and the broker: set "
            "DATABASE_URL to PostgreSQL and REDIS_URL (a Redis database of its own)",
            file=sys.stderr,
        )
        return 2
    return measure(options)


def measure(options: argparse.Namespace) -> int:
    from django.conf import settings

    from bench.harness import throwaway_database

    spare = options.during_release
    hosts = max(run.nodes for run in options.runs) + spare
    started = time.monotonic()
    print(f"labtime: {hosts} lab hosts; load average {load_average()}", flush=True)
    with (
        throwaway_database(settings.VAR_DIR, suffix="labtime") as described,
        lab_hosts(hosts) as lab,
    ):
        print(f"labtime: database {described}", flush=True)
        register(lab, options.boot_seconds)
        project, user = person()
        with product(settings.VAR_DIR / "labtime", floor=options.acceptance_floor):
            results = [
                time_run(run, project, user, options.timeout, during=spare if last else 0)
                for last, run in _with_last(options.runs)
            ]
            ok = all(results)
    print(f"labtime: done in {time.monotonic() - started:.0f} s; load average {load_average()}")
    return 0 if ok else 1


def _with_last(runs: list[Run]) -> Iterator[tuple[bool, Run]]:
    for index, run in enumerate(runs):
        yield index == len(runs) - 1, run


@contextlib.contextmanager
def lab_hosts(count: int) -> Iterator:
    """The lab with `count` GPU hosts (and the gateway, as `make lab`), each reset; taken down
    at the end if it was down before and nobody else uses it, else its hosts reset again."""
    from clusters.machines.session import operator_public_key
    from lab import hostlab

    was_up = hostlab.current() is not None
    lab = hostlab.up(count, authorized_key=operator_public_key(), gateway=True)
    for host in lab.hosts:
        lab.reset(host.name)
    try:
        yield lab
    finally:
        if not was_up and not hostlab.others_using():
            hostlab.down()
        else:
            for host in lab.hosts:
                lab.reset(host.name)


def register(lab, boot_seconds: int) -> None:
    """The hosts in the inventory as staff load them: `manage.py load_inventory`, which records
    each host's baseline (what every release is verified against)."""
    from django.conf import settings
    from django.core.management import call_command

    path = settings.VAR_DIR / "labtime" / "inventory.json"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(lab.inventory(boot_seconds=boot_seconds, gateway_hosts=0)))
    began = time.monotonic()
    call_command("load_inventory", str(path), verbosity=0)
    print(f"labtime: inventory loaded, baselines in {time.monotonic() - began:.0f} s", flush=True)


def person():
    """The bench's user: a project with credit, an SSH key and an API key."""
    from bench.harness import bench_person

    user, _ = bench_person()
    return user.memberships.get().project, user


def product_env(var: Path) -> dict[str, str]:
    """`HOST=172.30.77.1 make run`'s environment, on the throwaway database (whose name the
    connection now has), a free port the lab's hosts may reach, tasks logged (LOG_LEVEL=INFO)."""
    from django.db import connection

    from lab import hostlab

    parts = urlsplit(os.environ["DATABASE_URL"])
    url = urlunsplit(parts._replace(path="/" + connection.settings_dict["NAME"]))
    return {
        **os.environ,
        "DATABASE_URL": url,
        "HOST": hostlab.BRIDGE_ADDRESS,
        "PORT": str(_free_lab_port()),
        "LOG_LEVEL": "INFO",
        "PYTHONUNBUFFERED": "1",
    }


def _free_lab_port() -> int:
    import socket

    from lab import hostlab

    for port in range(8700, 8900):
        with socket.socket() as probe:
            if probe.connect_ex((hostlab.BRIDGE_ADDRESS, port)) != 0:
                return port
    raise RuntimeError("no free port in 8700-8899 on the lab's bridge")


@contextlib.contextmanager
def product(var: Path, *, floor: int | None = None) -> Iterator[None]:
    """bin/run.py, as `make run` starts it (after its migrate: the database is migrated), its
    output in `var/run.log`; stopped at the end (SIGTERM, then SIGKILL to its group)."""
    var.mkdir(parents=True, exist_ok=True)
    env = product_env(var)
    if floor is not None:
        env |= {
            "RUNCRATE_ACCEPTANCE_MIN_MBIT": str(floor),
            "RUNCRATE_ACCEPTANCE_LINK_FRACTION": "0.01",
        }
        print(f"labtime: acceptance floor {floor} Mbit/s for this run (not the product's)")
    log = (var / "run.log").open("w")
    process = subprocess.Popen(  # noqa: S603 - our own bin/run.py
        [sys.executable, str(ROOT / "bin" / "run.py")],
        cwd=ROOT,
        env=env,
        stdout=log,
        stderr=subprocess.STDOUT,
        start_new_session=True,
    )
    try:
        _wait_for(lambda: _started(var / "run.log"), 120, "the web server and the workers")
        print(f"labtime: the product runs (bin/run.py, port {env['PORT']})", flush=True)
        yield
    finally:
        process.send_signal(signal.SIGTERM)
        try:
            process.wait(timeout=30)
        except subprocess.TimeoutExpired:
            os.killpg(process.pid, signal.SIGKILL)
            process.wait()
        log.close()


WORKERS = ("default", "machines", "releases", "logs", "notify")


def _started(log: Path) -> bool:
    """The web server answers and every worker said it is ready (Celery's INFO line)."""
    text = log.read_text()
    return "is running:" in text and all(
        re.search(rf"{name}@\S+ ready\.", text) for name in WORKERS
    )


def _wait_for(condition: Callable[[], bool], seconds: float, what: str) -> None:
    deadline = time.monotonic() + seconds
    while not condition():
        if time.monotonic() > deadline:
            raise RuntimeError(f"{what}: not within {seconds:.0f} s")
        time.sleep(POLL_SECONDS)


def create(project, user, run: Run, name: str):
    from clusters import lifecycle

    return lifecycle.create_cluster(
        project=project,
        user=user,
        environment=project.environments.get(name="default"),
        offer_slug=MACHINE_TYPE,
        nodes=run.nodes,
        name=name,
        software=run.software,
    )


def wait_ready(cluster, timeout: float) -> bool:
    """A bounded poll until the cluster is ready or has failed; whether it is ready."""
    from clusters.models import Cluster

    done = {Cluster.Status.READY, Cluster.Status.FAILED, Cluster.Status.DEGRADED}
    deadline = time.monotonic() + timeout
    while cluster.status not in done and time.monotonic() < deadline:
        time.sleep(POLL_SECONDS)
        cluster.refresh_from_db()
    return cluster.status == Cluster.Status.READY


def _spread(created: datetime, moments: list) -> str:
    found = [(moment - created).total_seconds() for moment in moments if moment]
    if not found:
        return "-"
    return f"{min(found):5.1f} … {max(found):5.1f} s"


def phases(cluster) -> list[tuple[str, str]]:
    """Each phase's times after the create, from the cluster's own records: first … last
    node."""
    from clusters.lifecycle import NodeWork

    nodes = list(cluster.nodes.order_by("index"))
    created = cluster.created_at
    began = [work.start.began if (work := NodeWork.of(n)).start else None for n in nodes]
    rows = [
        ("start handed to the driver", _spread(created, began)),
        ("booted (bootstrap done)", _spread(created, [n.running_at for n in nodes])),
        ("agents checked in", _spread(created, [n.agent_at for n in nodes])),
    ]
    rounds: dict[int, list] = {}
    mbit: dict[int, list[float]] = {}
    report = {row["name"]: row for row in (cluster.acceptance or {}).get("nodes", [])}
    for n in nodes:
        row = report.get(n.name, {})
        number = row.get("round") or 0
        rounds.setdefault(number, []).append(n.network_reported_at)
        if isinstance(row.get("bandwidth_mbit"), int | float):
            mbit.setdefault(number, []).append(row["bandwidth_mbit"])
    for number in sorted(rounds):
        label = f"acceptance round {number}" if number else "network reported"
        figure = _spread(created, rounds[number])
        if mbit.get(number):
            figure += f" ({min(mbit[number]):,.0f} … {max(mbit[number]):,.0f} Mbit/s)"
        rows.append((label, figure))
    rows.append(("joined (network passed)", _spread(created, [cluster.joined_at])))
    if cluster.software != "none":
        rows.append(("software installed", _spread(created, [n.installed_at for n in nodes])))
    rows.append(("ready", _spread(created, [cluster.ready_at])))
    return rows


def time_create(project, user, run: Run, name: str, timeout: float):
    """Create, wait, print the phases; the cluster, and whether it is ready."""
    load = load_average()
    cluster = create(project, user, run, name)
    ready = wait_ready(cluster, timeout)
    seconds = ((cluster.ready_at or cluster.ended_at) or cluster.created_at) - cluster.created_at
    verdict = (
        f"ready in {seconds.total_seconds():.1f} s"
        if ready
        else f"{cluster.status} ({cluster.failure_reason}: {cluster.failure_message})"
    )
    print(f"\n{run} ({name}): {verdict}; load average {load} at create, {load_average()} now")
    for label, figure in phases(cluster):
        print(f"  {label:28} {figure}")
    sys.stdout.flush()
    return cluster, ready


def end(cluster) -> tuple[list[int], datetime]:
    """Terminate the cluster (as its owner's Terminate does; a failed one is released by
    itself, from its end); its hosts and the instant."""
    from django.utils import timezone

    from clusters import lifecycle

    hosts = list(cluster.nodes.values_list("host_id", flat=True))
    cluster.refresh_from_db()
    if cluster.is_final:
        return hosts, cluster.ended_at
    ended = timezone.now()
    lifecycle.terminate(cluster=cluster)
    return hosts, ended


def wait_released(hosts: list[int], ended: datetime, timeout: float) -> list[float] | None:
    """Each host's seconds from the terminate to `free`, by a bounded poll (None, saying why,
    if one is not free within `timeout` or went dirty or offline)."""
    from offers.models import Host

    rows = Host.objects.filter(pk__in=hosts)
    deadline = time.monotonic() + timeout
    while rows.exclude(state=Host.State.FREE).exists():
        if time.monotonic() > deadline or rows.filter(state__in=("dirty", "offline")).exists():
            print(f"  release: not every host free: {dict(rows.values_list('name', 'state'))}")
            return None
        time.sleep(POLL_SECONDS)
    return sorted((host.state_changed_at - ended).total_seconds() for host in rows)


TASK_DONE = re.compile(
    r"^releases +\| \[(?P<at>[\d-]+ [\d:]+),(?P<ms>\d+): INFO/\w+(-\d+)?\] Task "
    r"clusters\.tasks\.release_work\[[^]]+\] succeeded in (?P<seconds>[\d.]+)s"
)


def release_tasks(since: datetime) -> list[float]:
    """The releases worker's own time for each host's release (`release_work`) that ended after
    `since`, from its log (LOG_LEVEL=INFO: Celery's "succeeded in" line; the log's clock is this
    machine's, in its local time zone)."""
    from django.conf import settings

    local = since.astimezone().replace(tzinfo=None)
    found = []
    for line in (settings.VAR_DIR / "labtime" / "run.log").read_text().splitlines():
        match = TASK_DONE.match(line)
        if match and datetime.fromisoformat(f"{match['at']}.{match['ms']}") >= local:
            found.append(float(match["seconds"]))
    return sorted(found)


def print_release(
    label: str, ended: datetime, seconds: list[float] | None, alone: float | None = None
) -> None:
    if seconds is None:
        return
    line = (
        f"  {label}: {len(seconds)} hosts free {seconds[0]:.1f} … {seconds[-1]:.1f} s after the "
        f"terminate (median {statistics.median(seconds):.1f} s); load average {load_average()}"
    )
    if alone:
        line += f"; the last {seconds[-1] / alone:.2f}× one host's release alone ({alone:.1f} s)"
    tasks = release_tasks(ended)
    if tasks:
        line += f"; each host's release task ran {tasks[0]:.1f} … {tasks[-1]:.1f} s"
    print(line, flush=True)


def release_alone() -> float:
    """One host's release work alone, nothing else running: the reimage and the verification
    against its baseline that every release does (clusters/machines/ssh.py), on a free host."""
    from clusters.machines.ssh import reimage_and_verify, verify_host
    from offers.models import Host

    host = Host.objects.filter(state=Host.State.FREE).order_by("-name").first()
    began = time.monotonic()
    differences = reimage_and_verify(host, host.reimage_command)
    seconds = time.monotonic() - began
    verified = time.monotonic()
    verify_host(host)  # the verification again, alone: what of it the reimage is not
    alone = time.monotonic() - verified
    state = "pristine" if not differences else f"{len(differences)} differences"
    print(
        f"\none host's release alone ({host.name}: reimage and verify): {seconds:.1f} s, "
        f"{state} (the verification alone {alone:.1f} s); load average {load_average()}",
        flush=True,
    )
    return seconds


def time_run(run: Run, project, user, timeout: float, *, during: int) -> bool:
    """Time one run's create → ready and its release; with `during`, also a `none` cluster of
    that size quietly and again created while this run's hosts are released."""
    if not during:
        cluster, ready = time_create(project, user, run, f"{run.software}-{run.nodes}", timeout)
        hosts, ended = end(cluster)
        print_release("its release", ended, wait_released(hosts, ended, timeout))
        return ready
    small = Run("none", during)
    alone = release_alone()
    quiet, usual = time_create(project, user, small, f"quiet-{during}", timeout)
    hosts, ended = end(quiet)
    print_release("its release", ended, wait_released(hosts, ended, timeout), alone)
    cluster, ready = time_create(project, user, run, f"{run.software}-{run.nodes}", timeout)
    hosts, ended = end(cluster)
    beside, ok = time_create(project, user, small, f"during-{during}", timeout)
    released = wait_released(hosts, ended, timeout)
    print_release("the big cluster's release", ended, released, alone)
    if ok and usual:
        took = (beside.ready_at - beside.created_at) / (quiet.ready_at - quiet.created_at)
        print(f"  the cluster created during the release: {took:.2f}× its quiet time")
    hosts, ended = end(beside)
    print_release("its release", ended, wait_released(hosts, ended, timeout))
    return ready and ok and usual


if __name__ == "__main__":
    sys.exit(main())
