"""Machines that no longer serve the cluster (ended, failed, lost) are stopped and wiped; a
host goes back to the pool only found pristine, and offline when it cannot be wiped."""

from __future__ import annotations

import logging

from clusters.lifecycle.records import Action, ActionKind
from clusters.lifecycle.rules import RELEASE_ATTEMPTS
from clusters.lifecycle.unit import UnitOfWork
from clusters.models import Event, Node
from offers.models import Host

log = logging.getLogger(__name__)

Reason = Event.Reason


def release(work: UnitOfWork) -> None:
    reimaged, kept_out = [], []
    for node in work.nodes:
        if not node.holds_host or node.status not in Node.RELEASED:
            continue
        done = work.work_of(node)
        stop, start = done.stop, done.start
        if stop is not None and stop.ok:
            if stop.warning:
                work.event(Reason.VOLUME_SYNC_FAILED, stop.warning, node=node, output=stop.output)
            node.holds_host = False
            work.touch(node)
            # A host goes back to the pool only reimaged and found pristine; otherwise it
            # is dirty, offered to no one until staff reimage it (docs/inventory.md). One
            # whose machine was lost or replaced as unhealthy goes to staff either way.
            if node.quarantine:
                quarantine_host(work, node, stop.why)
                kept_out.append(node)
            elif stop.pristine:
                work.set_host(node, Host.State.FREE)
                reimaged.append(node)
            else:
                work.set_host(node, Host.State.DIRTY)
                assert node.host_id is not None  # set_host: reserved with its host
                work.host_reports[node.host_id] = stop.why
                kept_out.append(node)
        elif start is not None and start.reason == Reason.HOST_KEY_MISMATCH:
            # Never connected to, so nothing to wipe; and it must not serve anyone until
            # staff know why it offers another key (re-imaged, or not the machine at all).
            take_offline(
                work,
                node,
                f"The machine for {node.name} offered a host key that is not the pinned one; "
                "it was never touched and is offline until staff check it.",
                start.error,
            )
        elif stop is not None and stop.attempts >= RELEASE_ATTEMPTS:
            if node.quarantine:
                quarantine_host(work, node, stop.error)
            take_offline(
                work,
                node,
                f"The machine that served {node.name} could not be wiped after "
                f"{RELEASE_ATTEMPTS} attempts ({stop.error or 'no reason given'}); it is "
                "offline until staff look at it.",
                stop.error,
            )
        elif not work.backing_off(stop):
            work.hand_off(node, Action(ActionKind.STOP))
    if reimaged or kept_out:
        still_held = any(n.holds_host for n in work.nodes)
        work.event(
            Reason.HOST_RELEASED,
            released_words(reimaged=reimaged, kept_out=kept_out)
            + ("" if still_held else " Every machine of this cluster is released."),
        )


def released_words(*, reimaged: list[Node], kept_out: list[Node]) -> str:
    """The release event's words, true of what the stop did (its `Released.pristine`): machines
    reimaged and found pristine, and machines that were not (no reimage command ran, or the
    check found a difference), which no one else gets until staff reimage them. Staff's reason
    (`Released.why`) is kept on the host, not told the tenant."""
    said = []
    if reimaged:
        said.append(f"{_names(reimaged)}: stopped, reimaged and found clean")
    if kept_out:
        them = "them" if len(kept_out) > 1 else "it"
        said.append(
            f"{_names(kept_out)}: stopped and not reimaged yet; no one else gets {them} until "
            f"staff reimage {them}"
        )
    return f"Released {'; '.join(said)}."


def _names(nodes: list[Node]) -> str:
    return ", ".join(n.name for n in nodes)


def quarantine_host(work: UnitOfWork, node: Node, stopped: str) -> None:
    """The host of a machine that was lost or replaced as unhealthy goes offline for staff,
    with why and its health report (`Node.quarantine`) and what its stop found: only staff
    put it back, reimaged and verified (docs/inventory.md, "Quarantined hosts")."""
    assert node.host_id is not None  # reserved with its host
    work.set_host(node, Host.State.OFFLINE)
    report = node.quarantine + (f"\nIts release: {stopped}" if stopped else "")
    work.quarantined[node.host_id] = report
    work.host_reports[node.host_id] = report


def take_offline(work: UnitOfWork, node: Node, message: str, why: str) -> None:
    node.holds_host = False
    work.touch(node)
    work.set_host(node, Host.State.OFFLINE)
    work.event(Reason.RELEASE_FAILED, message, node=node)
    log.error(
        "host %s (cluster %s, %s) could not be released; now offline: %s",
        node.reserved_host.name,
        work.cluster.pk,
        node.name,
        why,
    )
