"""Cluster emails, sent from the event outbox: ready, failed and degraded, and the notices
(a GPU unhealthy is the "unhealthy" email of any health problem; the GPUs idle, "idle").

The lifecycle writes an event for every transition; the events that ask for an email
(`Event.notification`) are this module's outbox, and `Event.emailed_at` marks the ones done.
Each event is claimed with a conditional update before its email goes out, so two workers
running `send_pending_cluster_emails` at once never send the same email twice. A send that
fails gives its claim back, and the next run tries again.

The beat scheduler runs `send_cluster_emails_task` every few seconds; the lifecycle may also
enqueue it right after it writes such an event.
"""

import logging

from celery import shared_task
from django.conf import settings
from django.db.models import Prefetch
from django.urls import reverse
from django.utils import timezone

from accounts import recipients
from clusters import connect
from clusters.models import STEP_NAMES, Cluster, Event, Node
from runcrate.durations import in_words
from runcrate.emails import project_url, send_templated
from runcrate.money import usd

log = logging.getLogger(__name__)

BATCH = 100


def notifying_reasons() -> list[str]:
    """The event reasons that ask for an email, as the model decides it."""
    return [reason for reason in Event.Reason.values if Event(reason=reason).notification]


def recipients_for(cluster: Cluster) -> list[str]:
    """The cluster's creator while a member of its project, else the project's owners
    (accounts/recipients.py, the one rule), read as the email goes out."""
    return recipients.told_about(cluster.project_id, maker_id=cluster.created_by_id)


# The ready email lists every node's SSH command up to this many; the page has them all.
EMAIL_SSH_NODES = 8


def _connect_context(cluster: Cluster) -> dict:
    """The connect panel in short (clusters/connect.py prints the same text as the page)."""
    shape = connect.shape_for(cluster)
    if not shape.nodes:
        return {}
    info = connect.details(shape)

    def link(path: str) -> str:
        return project_url(cluster.project_id, path)

    return {
        # Without an address of its own or a gateway there is nothing to print yet.
        "ssh_command": info["ssh"][0]["command"] or "",
        "ssh_nodes": info["ssh"][:EMAIL_SSH_NODES],
        "ssh_more": max(0, len(info["ssh"]) - EMAIL_SSH_NODES),
        "hostfile_path": shape.hostfile_path,
        "peers": _peers([node.name for node in shape.nodes[1:]]),
        "connect": info,
        "ssh_config_url": link(reverse("clusters:ssh_config", args=[cluster.pk])),
        "hostfile_url": link(reverse("clusters:hostfile", args=[cluster.pk])),
        "kubeconfig_url": link(reverse("clusters:kubeconfig", args=[cluster.pk])),
        "quote_url": link(reverse("offers:quote") + "?interconnect=infiniband"),
    }


def _peers(names: list[str]) -> str:
    if len(names) <= 2:
        return " and ".join(names)
    return f"{names[0]} … {names[-1]}"


# The emails that say what replacing the machine costs, and link to where it is offered.
REPAIR_EMAILS = {"lost", "unhealthy", "replaced", "replacement_failed"}


def _repair_context(event: Event, link) -> dict:
    """What a repair email adds: whether the machine can be replaced (node-0 cannot), what a
    new one costs, the Machines tab where it is offered, and the cluster's repair policy."""
    cluster = event.cluster
    node_name = event.node.name if event.node else cluster.failure_node
    return {
        "replaceable": bool(node_name) and node_name != "node-0",
        "replace_price": usd(cluster.price_per_machine_hour),
        "machines_url": link(reverse("clusters:tab", args=[cluster.pk, "machines"])),
        "auto_repair": cluster.repair_policy == Cluster.RepairPolicy.AUTO,
        "grace": in_words(settings.RUNCRATE_REPAIR_GRACE_SECONDS),
        # A replacement's email says what happened to the machine it replaced.
        "replaced_why": (
            event.node.replaces.quarantine.splitlines()[0]
            if event.node and event.node.replaces and event.node.replaces.quarantine
            else ""
        ),
    }


def email_context(event: Event) -> dict:
    cluster = event.cluster
    machine_type = cluster.machine_type

    def link(path: str) -> str:
        # Opened by a member of several projects, it acts in the cluster's (runcrate/emails.py).
        return project_url(cluster.project_id, path)

    context = {
        "cluster": cluster,
        "event": event,
        "machine_type": machine_type,
        "size_line": (
            f"{cluster.size} × {machine_type.gpus_per_machine}× {machine_type.gpu.name} "
            f"in {machine_type.location.name}"
        ),
        "price_per_hour": usd(cluster.price_per_machine_hour * cluster.size),
        "node_name": event.node.name if event.node else cluster.failure_node,
        "step_name": STEP_NAMES.get(event.step, event.step).lower(),
        "cluster_url": link(reverse("clusters:detail", args=[cluster.pk])),
        "terminate_url": link(reverse("clusters:terminate", args=[cluster.pk])),
        "offers_url": link(reverse("offers:picker") + f"?gpu={machine_type.gpu.slug}"),
    }
    if event.notification in REPAIR_EMAILS:
        context.update(_repair_context(event, link))
    if event.notification == "ready":
        context.update(_connect_context(cluster))
    if event.notification == "idle":
        # The rule's figures; the event's message says how many GPUs, how long and the price.
        context["idle_percent"] = f"{settings.RUNCRATE_IDLE_GPU_PERCENT:g}"
        context["idle_minutes"] = f"{settings.RUNCRATE_IDLE_GPU_MINUTES:g}"
    return context


def send_event_email(*, event: Event) -> int:
    """Send the email `event` asks for, unless another worker already has; returns 0 or 1."""
    kind = event.notification
    if kind is None:
        return 0
    claimed_at = timezone.now()
    claimed = Event.objects.filter(pk=event.pk, emailed_at__isnull=True).update(
        emailed_at=claimed_at
    )
    if not claimed:
        return 0
    try:
        sent = send_templated(
            template=f"cluster-{kind}",
            to=recipients_for(event.cluster),
            context=email_context(event),
            project_id=event.cluster.project_id,
        )
    except Exception:
        # Give the claim back so the next run sends it; only this claim, not a newer one.
        Event.objects.filter(pk=event.pk, emailed_at=claimed_at).update(emailed_at=None)
        raise
    return 1 if sent else 0


def send_pending_cluster_emails(*, limit: int = BATCH) -> int:
    """Send the outbox's pending emails, oldest first; returns how many were sent."""
    pending = (
        Event.objects.filter(emailed_at__isnull=True, reason__in=notifying_reasons())
        .select_related(
            "node",
            "cluster__created_by",
            "cluster__environment",
            "cluster__machine_type__location",
            "cluster__machine_type__gpu",
        )
        .prefetch_related(
            Prefetch(
                "cluster__nodes",
                queryset=Node.objects.select_related("host").order_by("index", "pk"),
            ),
            "cluster__volumes",
        )
        .order_by("at", "pk")[:limit]
    )
    sent = 0
    for event in pending:
        try:
            sent += send_event_email(event=event)
        except Exception:
            log.exception("could not send the %s email of event %s", event.notification, event.pk)
    return sent


@shared_task(name="clusters.notifications.send_cluster_emails_task", ignore_result=True)
def send_cluster_emails_task() -> int:
    return send_pending_cluster_emails()
