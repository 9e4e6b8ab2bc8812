"""A made-up month of ended clusters for the demo (`manage.py seed_demo`), so that `make run`
shows a track record on its offers at once (docs/offers.md, "Track record").

They live in a project of their own with no members ("Demo history"): no user sees them, no
host is held, nothing is billed. Every cluster has the events the lifecycle writes for it
(created, then ready or a failure at its step, then terminated), so the track records are
computed from them the way the beat computes them from real ones.
"""

import random
from datetime import datetime, timedelta

from django.utils import timezone

from accounts.models import Environment, Project
from accounts.projects import DEFAULT_ENVIRONMENT
from clusters.estimates import real_time_to_ready
from clusters.models import Cluster, Event, Node, give_up_after
from clusters.track_record import refresh_track_records
from offers.models import MachineType

HISTORY_PROJECT = "Demo history"
Reason = Event.Reason
FAILURES = [
    (Node.Step.RUNNING, Reason.BOOT_TIMEOUT, "node-1 did not come up."),
    (Node.Step.AGENT, Reason.AGENT_TIMEOUT, "node-1's agent did not check in."),
    (Node.Step.NETWORK, Reason.NETWORK_UNREACHABLE, "node-1 could not reach node-0."),
]


def _acceptance(rng: random.Random, nodes: int, at: datetime) -> dict:
    rows: list[dict[str, str | float | None]] = [
        {"name": "node-0", "bandwidth_mbit": None, "latency_ms": None}
    ]
    rows += [
        {
            "name": f"node-{i}",
            "bandwidth_mbit": float(rng.randint(1100, 1900)),
            "latency_ms": round(rng.uniform(0.2, 0.9), 2),
        }
        for i in range(1, nodes)
    ]
    return {"measured_at": at.isoformat(), "nodes": rows}


def seed_demo_history(*, now: datetime | None = None, per_type: int = 8) -> int:
    """`per_type` ended clusters for every self-serve machine type over the last 28 days, then
    the track records; returns how many clusters it made."""
    now = now or timezone.now()
    rng = random.Random(13)  # the same history on every laptop
    project = Project.objects.create(name=HISTORY_PROJECT)
    environment = Environment.objects.create(project=project, name=DEFAULT_ENVIRONMENT)
    # Never a failure-drill location's (its hosts fail on purpose: a made-up record of clusters
    # that started there would say the opposite); its record is only what really ran there.
    machine_types = MachineType.objects.filter(
        interconnect__in=MachineType.SELF_SERVE_INTERCONNECTS, location__drill=False
    ).order_by("slug")
    clusters, outcomes = [], []
    for machine_type in machine_types:
        for index in range(per_type):
            created = now - timedelta(days=rng.uniform(0.5, 28))
            nodes = rng.choice([2, 2, 4, 8])
            failure = FAILURES[rng.randrange(len(FAILURES))] if rng.random() < 0.06 else None
            # Around the create form's estimate at real speed (clusters/estimates.py), so the
            # record and the estimate beside it agree: a little under it to half again over.
            usual = real_time_to_ready(boot_seconds=machine_type.boot_seconds, software="none")
            ready = created + usual * rng.uniform(0.85, 1.5) + timedelta(seconds=5 * nodes)
            ended = (ready if failure else ready + timedelta(hours=rng.uniform(1, 30))).replace(
                microsecond=0
            )
            clusters.append(
                Cluster(
                    project=project,
                    environment=environment,
                    name=f"history-{machine_type.pk}-{index}",
                    machine_type=machine_type,
                    size=nodes,
                    status=Cluster.Status.FAILED if failure else Cluster.Status.TERMINATED,
                    authorized_keys="",
                    created_at=created,
                    joined_at=None if failure else ready - timedelta(seconds=30),
                    ready_at=None if failure else ready,
                    ended_at=ended,
                    give_up_at=created + give_up_after(machine_type.slow_boot),
                    failure_reason=failure[1] if failure else "",
                    failure_node="node-1" if failure else "",
                    failure_step=failure[0] if failure else "",
                    failure_message=failure[2] if failure else "",
                    acceptance={} if failure else _acceptance(rng, nodes, ready),
                )
            )
            outcomes.append((created, ready, ended, failure))
    Cluster.objects.bulk_create(clusters)
    events = []
    for cluster, outcome in zip(clusters, outcomes, strict=True):
        events += _history_events(cluster, *outcome)
    Event.objects.bulk_create(events)
    refresh_track_records(now=now)
    return len(clusters)


def _history_events(
    cluster: Cluster,
    created: datetime,
    ready: datetime,
    ended: datetime,
    failure: tuple[str, str, str] | None,
) -> list[Event]:
    """An ended cluster's events: created, then failed at its step, or ready and terminated."""
    events = [Event(cluster=cluster, at=created, reason=Reason.CREATED, message="Created.")]
    if failure:
        step, reason, message = failure
        events.append(Event(cluster=cluster, at=ready, step=step, reason=reason, message=message))
        return events
    events.append(Event(cluster=cluster, at=ready, reason=Reason.READY, message="Ready."))
    events.append(
        Event(
            cluster=cluster,
            at=ended,
            reason=Reason.TERMINATE_REQUESTED,
            message="Terminate requested.",
        )
    )
    events.append(Event(cluster=cluster, at=ended, reason=Reason.TERMINATED, message="Ended."))
    return events
