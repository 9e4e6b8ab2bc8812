"""The beat turns the clusters' events into deliveries: once per (endpoint, event), only the
event types an endpoint chose, only its own project's, only what happened since it was made."""

import json
from datetime import UTC, datetime, timedelta
from decimal import Decimal

import time_machine

from accounts.models import Environment
from billing.limits import claim_notice
from billing.models import Notice
from clusters.models import Event
from notifications import outbox
from notifications.endpoints import create_endpoint
from notifications.models import Delivery
from notifications.tasks import run_notifications
from tests.factories import ClusterFactory, EventFactory
from tests.notifications.conftest import ready_event

START = datetime(2030, 5, 6, 7, 0, tzinfo=UTC)


def test_the_beat_run_twice_delivers_once(owner, receiver, local_webhooks):
    with time_machine.travel(START, tick=False):
        create_endpoint(
            project=owner.project, user=owner.user, url=receiver.url, events=["cluster.ready"]
        )
        ready_event(owner.project)
        first = run_notifications()
        second = run_notifications()

    assert first["planned"] == 1
    assert second == {"planned": 0, "delivered": 0, "switched_off": 0}
    assert len(receiver.received) == 1
    assert Delivery.objects.count() == 1


def test_it_plans_only_the_chosen_types_of_the_endpoints_project_since_it_was_made(
    owner, stranger, local_webhooks
):
    with time_machine.travel(START, tick=False) as clock:
        ready_event(owner.project, name="before")
        clock.shift(timedelta(minutes=1))
        endpoint = create_endpoint(
            project=owner.project,
            user=owner.user,
            url="https://127.0.0.1/hook",
            events=["cluster.failed", "cluster.stopped"],
        )
        clock.shift(timedelta(minutes=1))
        cluster = ClusterFactory(project=owner.project, name="mine")
        ready = EventFactory(cluster=cluster, reason=Event.Reason.READY)
        failed = EventFactory(cluster=cluster, reason=Event.Reason.BOOT_TIMEOUT)
        stopped = EventFactory(cluster=cluster, reason=Event.Reason.STOPPED_BUDGET)
        EventFactory(cluster=cluster, reason=Event.Reason.JOINED)
        theirs = ClusterFactory(project=stranger.project, name="theirs")
        EventFactory(cluster=theirs, reason=Event.Reason.BOOT_TIMEOUT)

        planned = outbox.plan_deliveries(now=START + timedelta(minutes=3))

    assert planned.deliveries == 2
    rows = Delivery.objects.filter(endpoint=endpoint).order_by("event_id")
    assert [(row.event_id, row.event_type) for row in rows] == [
        (failed.pk, "cluster.failed"),
        (stopped.pk, "cluster.stopped"),
    ]
    assert ready.pk not in {row.event_id for row in rows}


def test_every_event_type_is_read_from_its_event(owner, local_webhooks):
    reasons = {
        "cluster.ready": Event.Reason.READY,
        "cluster.failed": Event.Reason.AGENT_TIMEOUT,
        "cluster.degraded": Event.Reason.INSTALL_FAILED,
        "cluster.machine_lost": Event.Reason.MACHINE_LOST,
        "cluster.stopped": Event.Reason.STOPPED_BALANCE,
        "node.unhealthy": Event.Reason.NODE_UNHEALTHY,
        "cluster.idle": Event.Reason.GPUS_IDLE,
    }
    with time_machine.travel(START, tick=False):
        endpoint = create_endpoint(
            project=owner.project,
            user=owner.user,
            url="https://127.0.0.1/hook",
            events=list(reasons),
        )
        cluster = ClusterFactory(project=owner.project)
        for reason in reasons.values():
            EventFactory(cluster=cluster, reason=reason)
        outbox.plan_deliveries(now=START)

    planned = dict(
        Delivery.objects.filter(endpoint=endpoint).values_list("event__reason", "event_type")
    )
    assert planned == {reason: kind for kind, reason in reasons.items()}


def test_its_queries_do_not_grow_with_endpoints_or_events(
    owner, stranger, local_webhooks, django_assert_num_queries
):
    def setup(person, endpoints: int, events: int) -> None:
        for n in range(endpoints):
            create_endpoint(
                project=person.project,
                user=person.user,
                url=f"https://127.0.0.1/hook/{n}",
                events=["cluster.ready"],
            )
        for n in range(events):
            ready_event(person.project, name=f"c-{person.user.pk}-{n}")

    with time_machine.travel(START, tick=False):
        setup(owner, endpoints=1, events=1)
        with django_assert_num_queries(4):
            assert outbox.plan_deliveries(now=START).deliveries == 1
        setup(stranger, endpoints=3, events=5)
        with django_assert_num_queries(4):
            assert outbox.plan_deliveries(now=START).deliveries == 15


def test_the_beat_runs_it_every_few_seconds(settings):
    from config.celery import app

    entry = settings.CELERY_BEAT_SCHEDULE["notifications"]
    assert entry["task"] == "notifications.tasks.send_notifications"
    assert entry["schedule"] <= 10
    app.loader.import_default_modules()
    assert entry["task"] in app.tasks


def test_billing_notices_are_sent_to_the_channels_that_chose_them(
    owner, stranger, receiver, local_webhooks
):
    environment = Environment.objects.get(project=owner.project, name="default")
    environment.monthly_budget = Decimal("500.00")
    environment.save()
    with time_machine.travel(START, tick=False):
        endpoint = create_endpoint(
            project=owner.project,
            user=owner.user,
            url=receiver.url,
            events=["billing.low_balance", "billing.budget_warning"],
        )
        create_endpoint(
            project=owner.project,
            user=owner.user,
            url=receiver.url,
            events=["cluster.ready"],
        )
        for person in [owner, stranger]:
            claim_notice(
                project_id=person.project.pk, kind=Notice.Kind.LOW_BALANCE, key="a", now=START
            )
        claim_notice(
            project_id=owner.project.pk,
            environment_id=environment.pk,
            kind=Notice.Kind.BUDGET_WARNING,
            key="b",
            now=START,
        )
        first = run_notifications()
        second = run_notifications()

    assert (first["planned"], first["delivered"], second["planned"]) == (2, 2, 0)
    kinds = sorted(json.loads(got.body)["type"] for got in receiver.received)
    assert kinds == ["billing.budget_warning", "billing.low_balance"]
    budget = next(
        json.loads(got.body)
        for got in receiver.received
        if json.loads(got.body)["type"] == "billing.budget_warning"
    )
    assert budget["data"]["environment"] == "default"
    assert "80% of its monthly budget of $500.00" in budget["data"]["message"]
    assert Delivery.objects.filter(endpoint=endpoint).count() == 2
