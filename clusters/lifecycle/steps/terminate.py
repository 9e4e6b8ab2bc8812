"""A terminating cluster ends (terminated, or stopped for its balance or budget) once every
one of its machines is released."""

from __future__ import annotations

from clusters.lifecycle.unit import UnitOfWork
from clusters.models import Cluster, Event

Status = Cluster.Status
Reason = Event.Reason


def finish_terminating(work: UnitOfWork) -> None:
    if any(n.holds_host for n in work.nodes):
        return
    cluster = work.cluster
    stopped = bool(cluster.stop_reason)
    work.set_status(Status.STOPPED if stopped else Status.TERMINATED)
    # A machine whose stop never succeeded went offline (take_offline): say which.
    unwiped = [n.name for n in work.nodes if n.host_id and not work.work_of(n).stopped]
    if unwiped:
        ended = (
            f"every machine was stopped, but {', '.join(unwiped)} could not be wiped: "
            f"{'they are' if len(unwiped) > 1 else 'it is'} out of service until staff "
            "check, and nothing more is billed."
        )
    else:
        ended = "every machine was stopped and wiped."
    work.event(
        Reason.TERMINATED,
        f"Stopped because {cluster.get_stop_reason_display()}; {ended}"
        if stopped
        else f"Terminated: {ended}",
    )
