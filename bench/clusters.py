"""Cluster benchmarks for `python -m bench`, on its throwaway database (they write an
inventory, projects and clusters, and commit them).

Provisioning: many clusters on a fresh inventory with instant boot, carried to ready by the
reconciler run in this process (no worker, no broker). A round is what one beat tick and the
workers do between two ticks: advance every cluster the tick picks, and run everything that
hands off (per-node work, the agents' reports, follow-up advances) until the queue is empty.

The tick: the beat's tick task body, run in this process (the bench swaps the broker for an
in-memory one), over a growing number of ready clusters that have nothing to do.
"""

from __future__ import annotations

import itertools
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from datetime import timedelta
from decimal import Decimal

from django.db import connection, transaction
from django.test.utils import override_settings
from django.utils import timezone

from accounts.models import SshKey, User
from accounts.projects import create_project
from billing import ledger
from clusters import lifecycle
from clusters.models import Cluster, Node
from offers.models import GpuModel, Host, Location, MachineType

MAX_ROUNDS = 100


class _Counter:
    """Counts the queries, and the commits: each outermost transaction that commits, and each
    write run outside one (it commits on its own)."""

    def __init__(self) -> None:
        self.queries = 0
        self.commits = 0

    def __call__(self, execute: Callable, sql, params, many, context):
        self.queries += 1
        if not connection.in_atomic_block and sql.lstrip()[:6].upper() in (
            "INSERT",
            "UPDATE",
            "DELETE",
        ):
            self.commits += 1
        return execute(sql, params, many, context)

    @contextmanager
    def counting(self) -> Iterator[None]:
        commit = connection.commit

        def counted() -> None:
            self.commits += 1
            commit()

        connection.commit = counted  # what `atomic` calls when its outermost block commits
        try:
            with connection.execute_wrapper(self):
                yield
        finally:
            del connection.commit


class _TimedDispatcher(lifecycle.CollectingDispatcher):
    """Runs the handed-off work in this process and measures the time spent doing it."""

    def __init__(self) -> None:
        super().__init__()
        self.seconds = 0.0

    def run(self, *, limit: int = 10_000_000) -> int:
        started = time.perf_counter()
        try:
            return super().run(limit=limit)
        finally:
            self.seconds += time.perf_counter() - started


def _inventory(*, hosts: int, tag: str) -> MachineType:
    gpu, _ = GpuModel.objects.get_or_create(
        slug="bench-h100", defaults={"name": "H100 SXM 80GB (bench)", "memory_gib": 80}
    )
    location = Location.objects.create(
        code=f"bench-{tag}",
        name=f"Bench {tag}",
        country="US",
        capacity_reporting=Location.CapacityReporting.COUNT,
    )
    machine_type = MachineType.objects.create(
        slug=f"bench-{tag}-h100x8",
        location=location,
        gpu=gpu,
        gpus_per_machine=8,
        machine_kind=MachineType.Kind.VM,
        price_per_hour=Decimal("20.00"),
        boot_seconds=1,
    )
    Host.objects.bulk_create(
        Host(name=f"bench-{tag}-{i:05d}", machine_type=machine_type) for i in range(hosts)
    )
    return machine_type


def provision_clusters(*, clusters: int = 100, nodes: int = 8) -> dict:
    """Create `clusters` clusters of `nodes` machines and drive them to ready.

    Returns the rounds (ticks) it took, the worker time (advance and per-node work, seconds),
    the queries and commits that work ran (from the first tick to ready), the tasks it ran, and
    the time, queries and commits the creations took. Run in a transaction of its own
    (a test's `transaction=True`), not inside one: commits inside are savepoints.
    """
    tag = f"{int(time.time() * 1000) % 10**9}"
    machine_type = _inventory(hosts=clusters * nodes, tag=tag)
    user = User.objects.create(email=f"bench-{tag}@runcrate.localhost")
    project = create_project(owner=user, name=f"Bench {tag}")
    ledger.credit(project=project, amount=Decimal(clusters * nodes * 20 + 100), note="bench")
    SshKey.objects.create(
        project=project,
        name="bench",
        public_key="ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIBenchBenchBenchBenchBenchBench bench",
        fingerprint=f"SHA256:bench-{tag}",
    )
    environment = project.environments.get()
    dispatcher = _TimedDispatcher()
    counter = _Counter()
    names = (f"bench-{i}" for i in itertools.count())

    # Instant boot: the simulated data center answers as soon as it is asked. Deadlines are not
    # what this measures: one process running every worker's tasks in turn would outlast the
    # 30 s floor of a step and fail clusters that a pool of workers brings up in time.
    with (
        override_settings(RUNCRATE_SIM_SPEED=1e9, RUNCRATE_MIN_STEP_SECONDS=3600),
        lifecycle.dispatching_to(dispatcher),
    ):
        started = time.perf_counter()
        creating = _Counter()
        with creating.counting():
            created = [
                lifecycle.create_cluster(
                    project=project,
                    user=user,
                    environment=environment,
                    offer_slug=machine_type.slug,
                    nodes=nodes,
                    name=next(names),
                    software="none",
                )
                for _ in range(clusters)
            ]
        create_seconds = time.perf_counter() - started
        ids = [c.pk for c in created]

        rounds = 0
        with counter.counting():
            while rounds < MAX_ROUNDS:
                rounds += 1
                for cluster_id in lifecycle.clusters_needing_work():
                    dispatcher.advance(cluster_id)
                dispatcher.run()
                if not Cluster.objects.filter(pk__in=ids).exclude(status="ready").exists():
                    break

    ready = Cluster.objects.filter(pk__in=ids, status="ready").count()
    return {
        "clusters_ready": ready,
        "ticks": rounds,
        "worker_seconds": dispatcher.seconds,
        "queries": counter.queries,
        "commits": counter.commits,
        "tasks": dispatcher.ran,
        "create_seconds": create_seconds,
        "create_queries": creating.queries,
        "create_commits": creating.commits,
    }


# --- the tick -----------------------------------------------------------------------------


def build_ready_clusters(
    *, count: int, nodes: int = 2, tag: str = "tick", start: int = 0
) -> tuple[int, int]:
    """`count` ready clusters of `nodes` joined machines each (numbered from `start`), by bulk
    inserts, in a project of their own: what a fleet in service holds, with nothing to do."""
    project = _tick_project(tag)
    machine_type = MachineType.objects.filter(slug=f"bench-{tag}-h100x8").first() or _inventory(
        hosts=0, tag=tag
    )
    environment = project.environments.get()
    now = timezone.now() - timedelta(hours=1)
    with transaction.atomic():
        made = Cluster.objects.bulk_create(
            (
                Cluster(
                    project=project,
                    environment=environment,
                    name=f"{tag}-{index:06d}",
                    machine_type=machine_type,
                    size=nodes,
                    status=Cluster.Status.READY,
                    authorized_keys="ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIBenchTick bench",
                    created_at=now,
                    joined_at=now,
                    ready_at=now,
                    give_up_at=now + timedelta(minutes=25),
                )
                for index in range(start, start + count)
            ),
            batch_size=5000,
        )
        Node.objects.bulk_create(
            (
                Node(
                    cluster_id=cluster.pk,
                    index=index,
                    status=Node.Status.JOINED,
                    step=Node.Step.DONE,
                    reserved_at=now,
                    heartbeat_at=now + timedelta(minutes=59),
                )
                for cluster in made
                for index in range(nodes)
            ),
            batch_size=5000,
        )
    return count, count * nodes


def _tick_project(tag: str):
    user = User.objects.filter(email=f"bench-{tag}@runcrate.invalid").first()
    if user is None:
        user = User.objects.create(email=f"bench-{tag}@runcrate.invalid")
        return create_project(owner=user, name=f"Bench {tag}")
    return user.memberships.get().project


def tick_benchmark(
    *,
    sizes: Sequence[int] = (2_000, 20_000),
    runs: int = 30,
    nodes: int = 2,
    progress: Callable[[str], None] = lambda message: None,
) -> list[dict]:
    """The tick (`clusters.tasks.tick`, its task body in this process) at each number of ready
    clusters: the time of its SELECTs and of the whole tick (bench.harness.Timing), its queries."""
    from bench.harness import QueryTimer, Timing, settle
    from clusters.tasks import tick

    results = []
    built = 0
    for size in sizes:
        progress(f"Building {size:,} ready clusters for the tick…")
        started = time.perf_counter()
        build_ready_clusters(count=size - built, nodes=nodes, start=built)
        built = size
        settle()
        build_seconds = time.perf_counter() - started
        reads, whole = Timing(), Timing()
        queries = 0
        tick()  # once untimed, like every figure
        for _ in range(runs):
            timer = QueryTimer()
            with connection.execute_wrapper(timer):
                started = time.perf_counter()
                tick()
                whole.samples.append(time.perf_counter() - started)
            reads.samples.append(timer.reads_seconds())
            queries = len(timer.queries)
        results.append(
            {
                "clusters": Cluster.objects.filter(status=Cluster.Status.READY).count(),
                "nodes": Node.objects.count(),
                "reads": reads,
                "tick": whole,
                "queries": queries,
                "build_seconds": build_seconds,
            }
        )
    return results
