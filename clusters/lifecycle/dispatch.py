"""Handing work on: to Celery once the transaction commits by default, in memory for tests and
the benchmark (`CollectingDispatcher`).

Work is found by registration, never by import: the modules that do a kind of work register the
function that does it (`@runs("advance")`), and the Celery tasks that carry it register themselves
(`register_task`, in clusters/tasks.py, loaded with the app). So this module imports neither,
and nothing here reaches up to what it hands work to."""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from functools import partial
from typing import Any, TypeVar

from django.core.cache import cache
from django.db import transaction
from kombu.exceptions import OperationalError

from clusters.lifecycle.records import Action, ActionKind
from clusters.lifecycle.rules import ADVANCE_PENDING_SECONDS

log = logging.getLogger(__name__)

# --- what each kind of work is: registered by the modules that do and carry it ---------------

# The kinds handed on: a cluster's advance, work on its nodes under a lease, the release of hosts
# after their nodes (the same work, a stop, on a queue of its own), its network test, and a read of
# a node's logs.
KINDS = ("advance", "node_work", "release", "network_test", "fetch_logs")
_tasks: dict[str, Any] = {}  # kind -> the Celery task that carries it
_runs: dict[str, Callable[..., object]] = {}  # kind -> the function that does it, in process


def register_task(kind: str, task: Any) -> None:
    """`task` (a Celery task) carries `kind` to a worker."""
    if kind not in KINDS:
        raise ValueError(f"{kind!r} is not a kind of work handed on ({', '.join(KINDS)})")
    _tasks[kind] = task


Work = TypeVar("Work", bound=Callable[..., object])


def runs(kind: str) -> Callable[[Work], Work]:
    """Decorate the function that does `kind` (what a `CollectingDispatcher` calls in process,
    and what the task calls in the worker)."""
    if kind not in KINDS:
        raise ValueError(f"{kind!r} is not a kind of work handed on ({', '.join(KINDS)})")

    def register(function: Work) -> Work:
        _runs[kind] = function
        return function

    return register


def task(kind: str) -> Any:
    """The Celery task registered for `kind`; a clear error when none is (clusters/tasks.py
    registers them when Django loads the clusters app)."""
    try:
        return _tasks[kind]
    except KeyError:
        raise LookupError(
            f"no task carries {kind!r}: clusters.tasks registers them when the clusters app loads"
        ) from None


def _run(kind: str) -> Callable[..., object]:
    try:
        return _runs[kind]
    except KeyError:
        raise LookupError(f"nothing registered runs {kind!r} (@dispatch.runs)") from None


# --- handing work on: Celery by default, in memory for tests and the benchmark -----------------


def publish(what: str, send: Callable[[], object]) -> bool:
    """Send a task; False (logged) when the broker cannot take it. Called after the commit:
    what was committed stands, and the request that made it answers with it. Nothing is lost:
    the tick finds every cluster with work to do (and every lease that ran out) once the broker
    is back (docs/architecture.md, "When the broker is away")."""
    try:
        send()
    except (OperationalError, ConnectionError, OSError) as error:
        log.warning(
            "could not queue %s (the broker is unavailable: %s); the tick will", what, error
        )
        return False
    return True


def is_release(action: str) -> bool:
    """Whether node work (`Action.to_task`) is a host's release, which the `releases` queue
    carries so that it never waits in front of, or behind, live clusters' steps."""
    return Action.from_task(action).kind is ActionKind.STOP


def advance_pending_key(cluster_id: int) -> str:
    return f"clusters:advance-pending:{cluster_id}"


class Dispatcher:
    """Hands work to Celery once the current transaction commits.

    Advances are coalesced: while one is queued for a cluster (a marker in the cache, removed
    by the task before it reads anything), more requests add nothing, so 64 nodes reporting at
    once cost one advance, not 64. A marker whose task never ran expires; the tick covers it.
    """

    def advance(self, cluster_id: int) -> None:
        def enqueue() -> None:
            key = advance_pending_key(cluster_id)
            if not cache.add(key, True, timeout=ADVANCE_PENDING_SECONDS):
                return
            if not publish(
                f"advance of cluster {cluster_id}", lambda: task("advance").delay(cluster_id)
            ):
                cache.delete(key)  # not queued after all: let the next request try again

        transaction.on_commit(enqueue)

    def node_work(self, action: str, leases: list[tuple[int, str]]) -> None:
        """Hand `action` to the nodes of one cluster, each under its lease (node, token): one
        task for all of them. A stop (a host's release: wipe, reimage, verify) goes as a
        `release` task (`clusters.tasks.release_work`), on a queue and worker of its own."""
        (node_id, token), *also = leases
        what = f"{action} of node {node_id}" + (f" and {len(also)} more" if also else "")
        kind = "release" if is_release(action) else "node_work"
        transaction.on_commit(
            lambda: publish(
                what,
                lambda: task(kind).delay(node_id, action, token, *([also] if also else [])),
            )
        )

    def network_test(self, cluster_id: int, token: str) -> None:
        transaction.on_commit(
            lambda: publish(
                f"the network test of cluster {cluster_id}",
                lambda: task("network_test").delay(cluster_id, token),
            )
        )


class CollectingDispatcher(Dispatcher):
    """Keeps handed-off work in memory and runs it in this process on `run()`.

    Like Celery's, it takes the work once the transaction that handed it off commits: a task
    run before that reads the rows as they were. That matters when the work is handed off in
    another thread than the one that runs it (a test's live server, whose requests start work
    that the test's thread runs): taken at once, a network test could run in the gap before its
    request committed, find no test of its token, and end without writing anything, leaving the
    test `running` for good. Inside a test case's transaction, which never commits, it is taken
    at once. The lists are shared by those threads, so taking and handing off hold a lock."""

    def __init__(self) -> None:
        self.advances: list[int] = []
        # One entry per node handed work; those handed out together run as one task.
        self.work: list[tuple[int, str, str]] = []
        self.network_tests: list[tuple[int, str]] = []
        self.ran = 0
        self._batch_of: dict[str, int] = {}  # lease token -> the hand-off it came with
        self._batches = 0
        self._lock = threading.Lock()

    def _on_commit(self, take: Callable[[], None]) -> None:
        def locked() -> None:
            with self._lock:
                take()

        atomic_blocks = transaction.get_connection().atomic_blocks
        if atomic_blocks and atomic_blocks[0]._from_testcase:
            locked()
        else:
            transaction.on_commit(locked)

    def advance(self, cluster_id: int) -> None:
        def take() -> None:
            if cluster_id not in self.advances:
                self.advances.append(cluster_id)

        self._on_commit(take)

    def node_work(self, action: str, leases: list[tuple[int, str]]) -> None:
        def take() -> None:
            self._batches += 1
            for node_id, token in leases:
                self.work.append((node_id, action, token))
                self._batch_of[token] = self._batches

        self._on_commit(take)

    def _next_work(self) -> tuple[str, list[tuple[int, str]]]:
        """The first entry of `work`, with the entries still waiting that came with it."""
        node_id, action, token = self.work.pop(0)
        batch = self._batch_of.pop(token, None)
        leases = [(node_id, token)]
        for entry in [w for w in self.work if batch and self._batch_of.get(w[2]) == batch]:
            self.work.remove(entry)
            del self._batch_of[entry[2]]
            leases.append((entry[0], entry[2]))
        return action, leases

    def network_test(self, cluster_id: int, token: str) -> None:
        self._on_commit(lambda: self.network_tests.append((cluster_id, token)))

    def _take(self) -> Callable[[], object] | None:
        """The next task, taken off its list (node work first); None when nothing is left."""
        with self._lock:
            if self.work:
                action, leases = self._next_work()
                return partial(_run("node_work"), action=action, leases=leases)
            if self.network_tests:
                cluster_id, token = self.network_tests.pop(0)
                return partial(_run("network_test"), cluster_id=cluster_id, token=token)
            if self.advances:
                return partial(_run("advance"), cluster_id=self.advances.pop(0))
            return None

    def run(self, *, limit: int = 100_000) -> int:
        """Run everything handed off, and what that hands off, until nothing is left."""
        ran = 0
        while (task := self._take()) is not None:
            task()  # outside the lock: what it hands off is taken meanwhile
            ran += 1
            if ran > limit:
                raise RuntimeError("the handed-off work does not settle")
        self.ran += ran
        return ran


_dispatcher: Dispatcher = Dispatcher()


def enqueue_advance(cluster_id: int) -> None:
    """Ask for `advance` on this cluster (after the current transaction commits)."""
    _dispatcher.advance(cluster_id)


@contextmanager
def dispatching_to(dispatcher: Dispatcher) -> Iterator[Dispatcher]:
    global _dispatcher
    previous, _dispatcher = _dispatcher, dispatcher
    try:
        yield dispatcher
    finally:
        _dispatcher = previous


def current() -> Dispatcher:
    """Where handed-off work goes now (Celery, unless a test or the benchmark swapped it)."""
    return _dispatcher
