"""Celery tasks: thin wrappers that load by primary key and call `clusters.lifecycle` or
`clusters.telemetry`. The ones that carry handed-off work register with the lifecycle's
dispatcher (`register_task`), which never imports this module; the app's `ready` loads it.

Each is safe to run twice or concurrently: `advance` locks the cluster row and is
level-triggered; `node_work` does nothing unless its lease token still holds the node.
"""

from celery import shared_task
from django.core.cache import cache

from clusters import idempotency, lifecycle, track_record
from clusters.telemetry import idle, logs, metrics, simulated_metrics
from runcrate.beats import period as beat_period
from runcrate.models import Beat


@shared_task(name="clusters.tasks.tick", ignore_result=True)
def tick() -> int:
    """Enqueue `advance` for every cluster with something to do. Recorded first: a tick that
    comes late records the outage before any advance it queues judges a deadline."""
    Beat.record("tick", every=beat_period("tick"))
    cluster_ids = lifecycle.clusters_needing_work()
    for cluster_id in cluster_ids:
        lifecycle.enqueue_advance(cluster_id)
    return len(cluster_ids)


@shared_task(name="clusters.tasks.machines_heartbeat", ignore_result=True)
def machines_heartbeat() -> None:
    """The `machines` queue's heartbeat: the beat sends it to that queue as often as the tick
    (CELERY_BEAT_SCHEDULE), so it runs only while the beat, the broker and a worker of the queue
    all do, and behind the per-node work queued before it. `/readyz` fails when it is overdue;
    its late runs are outages no machine's step deadline counts (docs/lifecycle.md)."""
    Beat.record("machines", every=beat_period("machines"))


@shared_task(name="clusters.tasks.releases_heartbeat", ignore_result=True)
def releases_heartbeat() -> None:
    """The `releases` queue's heartbeat, sent like the `machines` one: `/readyz` fails naming
    the releases worker while it is overdue, for with none the hosts of ended clusters are never
    wiped and never rentable again. No outage is recorded: a release has no step deadline to
    spare (a dead worker's leases are handed out again by the tick)."""
    Beat.record("releases")


@shared_task(name="clusters.tasks.sweep_hosts", ignore_result=True)
def sweep_hosts() -> int:
    """Report hosts marked taken that no node holds. A scan of the whole inventory: it runs
    on its own, slower schedule, not in every tick."""
    return len(lifecycle.sweep_orphan_hosts())


@shared_task(name="clusters.tasks.forget_idempotency_keys", ignore_result=True)
def forget_idempotency_keys() -> int:
    """Delete the `Idempotency-Key` records older than 24 hours."""
    return idempotency.forget_expired()


@shared_task(name="clusters.tasks.watch_heartbeats", ignore_result=True)
def watch_heartbeats() -> int:
    """Mark lost the machines of ready clusters whose agents fell silent."""
    return len(lifecycle.watch_heartbeats())


@shared_task(name="clusters.tasks.auto_repair", ignore_result=True)
def auto_repair() -> int:
    """Replace the lost and lastingly unhealthy workers of clusters whose repair policy is
    `auto` (clusters/lifecycle/repair.py)."""
    return len(lifecycle.auto_repair())


@shared_task(name="clusters.tasks.advance", ignore_result=True)
def advance(cluster_id: int) -> list[str]:
    # Cleared before reading anything, so a change committed from here on queues a new one.
    cache.delete(lifecycle.advance_pending_key(cluster_id))
    return lifecycle.advance(cluster_id=cluster_id)


lifecycle.register_task("advance", advance)


@shared_task(name="clusters.tasks.node_work", ignore_result=True)
def node_work(node_id: int, action: str, token: str, also: list | None = None) -> int:
    """`action` on the node, and on the other nodes of its cluster in `also` ([node, token]
    pairs: a driver that batches hands a cluster's nodes over together)."""
    leases = [(node_id, token), *((n, t) for n, t in also or [])]
    return lifecycle.do_work(action=action, leases=leases)


lifecycle.register_task("node_work", node_work)


@shared_task(name="clusters.tasks.release_work", ignore_result=True)
def release_work(node_id: int, action: str, token: str, also: list | None = None) -> int:
    """`node_work` for a host's release (the stop: wipe, reimage, verify), on the `releases`
    queue: its own worker's RUNCRATE_RELEASE_CONCURRENCY processes release the hosts of ended
    clusters side by side, and never hold the `machines` threads live clusters' steps run on."""
    leases = [(node_id, token), *((n, t) for n, t in also or [])]
    return lifecycle.do_work(action=action, leases=leases)


lifecycle.register_task("release", release_work)


@shared_task(name="clusters.tasks.network_test", ignore_result=True)
def network_test(cluster_id: int, token: str) -> bool:
    """Measure a cluster's private network; does nothing unless `token` is still its running
    test's, so a second delivery writes nothing."""
    return lifecycle.do_network_test(cluster_id=cluster_id, token=token)


lifecycle.register_task("network_test", network_test)


@shared_task(name="clusters.tasks.refresh_track_records", ignore_result=True)
def refresh_track_records() -> int:
    """Recompute every machine type's track record from the last 30 days of events."""
    return track_record.refresh_track_records()


@shared_task(name="clusters.tasks.roll_up_metrics_minutes", ignore_result=True)
def roll_up_metrics_minutes() -> int:
    """Every minute: the finished minutes' rollups of the metrics, then the raw samples older
    than an hour deleted. Safe twice: the rollup writes the same rows again."""
    return metrics.roll_up_minutes()


@shared_task(name="clusters.tasks.roll_up_metrics_hours", ignore_result=True)
def roll_up_metrics_hours() -> int:
    """Every hour: the finished hours' rollups from the minutes, then the minutes older than 14
    days and the hours older than 90 deleted."""
    return metrics.roll_up_hours()


@shared_task(name="clusters.tasks.notice_idle_gpus", ignore_result=True)
def notice_idle_gpus() -> int:
    """Every minute: ready clusters whose GPUs all stayed idle long enough are told (one event
    and one email per idle period), and those working again marked so. Nothing is stopped."""
    return idle.notice_idle()


@shared_task(name="clusters.tasks.simulate_metrics", ignore_result=True)
def simulate_metrics() -> int:
    """Every RUNCRATE_METRICS_SECONDS: the simulated data center's machines report figures, as a
    real machine's agent does (the demo's charts move). Nothing for real machines."""
    return simulated_metrics.report()


@shared_task(name="clusters.tasks.fetch_logs", ignore_result=True)
def fetch_logs(fetch_id: int) -> bool:
    """On the `logs` queue: read a node's logs or the head's jobs over its driver and keep
    them (clusters/telemetry/logs.py). Safe twice: a second run replaces the texts with newer
    ones."""
    return logs.run_fetch(fetch_id=fetch_id)


lifecycle.register_task("fetch_logs", fetch_logs)
