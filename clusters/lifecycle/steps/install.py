"""Step `install`: the software is installed on every joined node, then checked from the
head until the check finds every node ready, or the install's time runs out."""

from __future__ import annotations

from clusters.lifecycle.records import Action, ActionKind, CheckOutcome, Failure
from clusters.lifecycle.rules import CHECK_EVERY, INSTALL_SECONDS
from clusters.lifecycle.unit import UnitOfWork
from clusters.machines.base import CheckState
from clusters.machines.software.checks import installer_verdict
from clusters.models import Cluster, Event, Node
from runcrate.durations import in_words

Status = Cluster.Status
Step = Node.Step
NodeStatus = Node.Status
Reason = Event.Reason


def install_key(work: UnitOfWork, targets: list[Node]) -> str:
    """Which install the work is for: the cluster's n-th, or the joining machines up to the last
    one added (by row: a replacement reuses its name, never its row); a result for another
    install is not this one's."""
    if work.cluster.status == Status.INSTALLING:
        return f"install-{work.cluster.install_attempts}"
    return f"workers-{max(n.pk for n in targets)}"


def install(work: UnitOfWork, targets: list[Node]) -> tuple[list[Failure], list[Node]]:
    """Install on every target, then check from the head; returns failures and the nodes
    whose software became ready in this pass."""
    key = install_key(work, targets)
    software = work.cluster.get_software_display()
    failures, installed = _install_everywhere(work, targets, key=key, software=software)
    if failures:
        return failures, []
    check = work.work_of(work.head).check
    this_check = check if check is not None and check.key == key else None
    became_ready: list[Node] = []
    if len(installed) == len(targets):
        unreadable, became_ready = _read_check(work, targets, key=key, this_check=this_check)
        if unreadable is not None:
            return [unreadable], []
    return _timed_out(work, targets, this_check=this_check, software=software), became_ready


def _install_everywhere(
    work: UnitOfWork, targets: list[Node], *, key: str, software: str
) -> tuple[list[Failure], list[Node]]:
    """Hand the install to each target without this install's result; returns the installs
    that failed and the targets installed."""
    failures, installed = [], []
    for node in targets:
        result = work.work_of(node).install
        if result is None or result.key != key:
            work.hand_off(node, Action(ActionKind.INSTALL, key))
        elif not result.ok:
            said = result.error or installer_verdict(result.output)
            failures.append(
                Failure(
                    Reason.INSTALL_FAILED,
                    node,
                    Step.INSTALL,
                    f"Installing {software} failed on {node.name}"
                    + (f": {said}." if said else "."),
                    output=result.output or result.error,
                )
            )
        else:
            if node.installed_at is None:
                node.installed_at = result.at
                work.touch(node)
            installed.append(node)
    return failures, installed


def _read_check(
    work: UnitOfWork, targets: list[Node], *, key: str, this_check: CheckOutcome | None
) -> tuple[Failure | None, list[Node]]:
    """Installed everywhere: the targets the head's check found ready finish, and the check is
    handed to the head again when it is due; returns the failure of a check that could not be
    read, and the targets that became ready."""
    head = work.head
    became_ready = []
    if this_check is not None:
        for node in targets:
            if node.name in this_check.ready and node.step == Step.INSTALL:
                work.finish_node(node)
                became_ready.append(node)
        if this_check.state == CheckState.FAILED:
            return Failure(
                Reason.INSTALL_FAILED,
                head,
                Step.INSTALL,
                f"The readiness check could not be read: {'; '.join(this_check.problems.values())}",
                output=this_check.output,
            ), became_ready
    stale = this_check is None
    if this_check is not None and this_check.state != CheckState.READY:
        assert this_check.at is not None  # written back with its time
        stale = work.now >= this_check.at + CHECK_EVERY
    if stale and any(n.step == Step.INSTALL for n in targets):
        work.hand_off(head, Action(ActionKind.CHECK, key))
    return None, became_ready


def _timed_out(
    work: UnitOfWork, targets: list[Node], *, this_check: CheckOutcome | None, software: str
) -> list[Failure]:
    """The targets still installing past their deadline, each with what the check said of it."""
    failures = []
    for node in targets:
        if node.step == Step.INSTALL and work.now >= work.deadline(node, work.now):
            problems = this_check.problems if this_check is not None else {}
            why = problems.get(node.name) or "its software never became ready"
            failures.append(
                Failure(
                    Reason.INSTALL_TIMEOUT,
                    node,
                    Step.INSTALL,
                    f"{software} was not ready on {node.name} within "
                    f"{in_words(INSTALL_SECONDS)}: {why}.",
                    output=this_check.output if this_check is not None else "",
                )
            )
    return failures


def installing(work: UnitOfWork) -> None:
    """An installing cluster: ready once every node's software is; degraded (its machines
    up and billed) at the first install that fails."""
    targets = [n for n in work.nodes if n.status == NodeStatus.JOINED]
    failures, _ = install(work, targets)
    if failures:
        failure = failures[0]
        work.set_status(Status.DEGRADED)
        # What the page's banner says: which node, at which step, and what the installer
        # said there; and every other node it failed on, each with what its installer said.
        message = " ".join(f.message for f in failures)
        output = (
            "\n".join(f"--- {f.node.name}\n{f.output}" for f in failures)
            if len(failures) > 1
            else failure.output
        )
        work.cluster.failure_reason = failure.reason
        work.cluster.failure_node = failure.node.name
        work.cluster.failure_step = Step.INSTALL
        work.cluster.failure_message = work.for_user(message)
        for node in targets:
            if node.step == Step.INSTALL:
                node.step_deadline = None
                work.touch(node)
        work.event(
            failure.reason,
            f"{message} The cluster is degraded: its machines stay up, reachable "
            "and billed. Retry the install or terminate the cluster.",
            node=failure.node,
            step=Step.INSTALL,
            output=output,
        )
        return
    if all(n.step == Step.DONE for n in targets):
        work.event(Reason.INSTALLED, f"{work.cluster.get_software_display()} is ready.")
        work.mark_ready()
