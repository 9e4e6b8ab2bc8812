"""What one entry says: the actor and channel of each way in (dashboard, an API key, the CLI,
MCP, admin, the system), a budget's before and after, and that a failed write fails nothing."""

import threading
from datetime import UTC, datetime, timedelta
from decimal import Decimal

import httpx
import pytest
import time_machine
from django.db import connections
from django.test import Client
from mcp import Client as McpClient

from accounts.models import ApiKey, Environment, User
from audit import log
from audit.models import Entry
from billing.meter import charge_accrued
from clusters import lifecycle
from clusters.lifecycle.stops import enforce_limits
from clusters.models import Cluster
from runcrate_cli import client as cli_client
from runcrate_cli import mcp_server
from tests.billing.conftest import add_credit, bill_cluster
from tests.factories import ClusterFactory
from tests.mcp.aio import run_async

NOW = datetime(2026, 3, 20, 12, 0, tzinfo=UTC)


@pytest.fixture(autouse=True)
def _work_in_memory():
    with lifecycle.dispatching_to(lifecycle.CollectingDispatcher()) as dispatcher:
        yield dispatcher


class DjangoTransport(httpx.BaseTransport):
    """httpx's requests answered by Django's test client, in this test's transaction."""

    def handle_request(self, request: httpx.Request) -> httpx.Response:
        headers = {k: v for k, v in request.headers.items() if k.lower() != "content-length"}
        answer = Client().generic(
            request.method,
            request.url.raw_path.decode(),
            request.read(),
            content_type=headers.pop("content-type", "application/json"),
            headers=headers,
        )
        if threading.current_thread() is not threading.main_thread():
            connections.close_all()  # the MCP SDK's worker thread: leave no connection open
        return httpx.Response(
            answer.status_code, headers=dict(answer.items()), content=answer.content
        )


def _wsgi_client(key: str, **kwargs) -> cli_client.ApiClient:
    """The CLI's own client, its requests answered by this process's Django."""
    return cli_client.ApiClient(
        api_url="http://testserver", api_key=key, transport=DjangoTransport(), **kwargs
    )


def test_it_records_a_dashboard_terminate_with_the_user_and_the_cluster(owner):
    cluster = ClusterFactory(project=owner.project, status=Cluster.Status.READY)

    owner.browser_client().post(f"/clusters/{cluster.pk}/terminate/", REMOTE_ADDR="10.1.2.3")

    entry = Entry.objects.get()
    assert (entry.actor, entry.channel, entry.user, entry.project) == (
        "user",
        "dashboard",
        owner.user,
        owner.project,
    )
    assert (entry.action, entry.object_type, entry.object_id) == (
        "clusters:terminate",
        "cluster",
        str(cluster.pk),
    )
    assert entry.ip == "10.1.2.3"


def test_it_records_an_api_key_by_name_and_owner_even_once_the_key_is_gone(owner):
    cluster = ClusterFactory(project=owner.project, status=Cluster.Status.READY)

    response = owner.api().post(f"/api/v1/clusters/{cluster.pk}/terminate")
    ApiKey.objects.filter(user=owner.user).delete()

    entry = Entry.objects.get()
    assert response.status_code == 202
    assert (entry.actor, entry.channel, entry.api_key) == ("api_key", "api", None)
    assert entry.api_key_name == "test" and entry.api_key_ref
    assert entry.who == "API key 'test' (owner@example.com)"
    assert (entry.action, entry.object_type, entry.object_id) == (
        "clusters_api_terminate_cluster",
        "cluster",
        str(cluster.pk),
    )


def test_the_cli_is_recorded_as_the_cli(owner):
    cluster = ClusterFactory(project=owner.project, status=Cluster.Status.READY)

    with _wsgi_client(owner.key) as client:
        client.terminate(cluster.pk)

    entry = Entry.objects.get()
    assert (entry.actor, entry.channel, entry.action) == (
        "api_key",
        "cli",
        "clusters_api_terminate_cluster",
    )


# The MCP SDK runs a tool on a worker thread: its requests read what this test committed.
@pytest.mark.django_db(transaction=True)
def test_mcp_is_recorded_as_mcp(owner, monkeypatch):
    cluster = ClusterFactory(project=owner.project, status=Cluster.Status.READY)
    made = []

    def wsgi_api_client(*, api_url, api_key, **kwargs):
        made.append(kwargs)
        return _wsgi_client(api_key, **kwargs)

    monkeypatch.setattr(mcp_server, "ApiClient", wsgi_api_client)
    server = mcp_server.build_server(api_url="http://testserver", api_key=owner.key)

    async def terminate():
        async with McpClient(server) as session:
            return await session.call_tool("terminate_cluster", {"cluster": str(cluster.pk)})

    result = run_async(terminate)  # on a thread of its own (tests/mcp/aio.py says why)

    assert not result.is_error, result.content
    assert made and made[0]["user_agent"].startswith("runcrate-mcp/")
    entry = Entry.objects.get()
    assert (entry.actor, entry.channel, entry.action) == (
        "api_key",
        "mcp",
        "clusters_api_terminate_cluster",
    )


def test_staff_in_admin_are_recorded_on_the_project_of_what_they_changed(owner):
    staff = User.objects.create_superuser(email="staff@example.com", password="x-long-password")
    cluster = ClusterFactory(project=owner.project, status=Cluster.Status.READY)
    client = Client()
    client.force_login(staff)

    client.post(f"/admin/clusters/cluster/{cluster.pk}/change/", {})

    entry = Entry.objects.get()
    assert (entry.actor, entry.channel, entry.user, entry.project) == (
        "staff",
        "admin",
        staff,
        owner.project,
    )
    assert (entry.action, entry.object_type, entry.object_id, entry.object_name) == (
        "admin:clusters_cluster_change",
        "cluster",
        str(cluster.pk),
        cluster.name,
    )
    assert entry.summary == "changed cluster in admin"


def test_a_budget_change_records_its_before_and_after_from_the_dashboard_and_the_api(owner):
    environment = Environment.objects.get(project=owner.project)
    Environment.objects.filter(pk=environment.pk).update(monthly_budget=Decimal("500.00"))

    owner.browser_client().post(
        "/billing/environments/default/budget/", {f"env-{environment.pk}-monthly_budget": "50"}
    )
    owner.api().put(
        "/api/v1/environments/default/budget", {"amount": None}, content_type="application/json"
    )

    dashboard, api = Entry.objects.order_by("pk")
    assert dashboard.changes == {"monthly_budget": {"before": "500.00", "after": "50.00"}}
    assert (dashboard.action, dashboard.object_type, dashboard.object_id) == (
        "billing:set_budget",
        "environment",
        "default",
    )
    assert api.changes == {"monthly_budget": {"before": "50.00", "after": None}}
    assert api.action == "billing_api_put_budget"


def test_the_system_records_the_balance_stop(owner):
    with time_machine.travel(NOW, tick=False):
        add_credit(owner.project, "1.00", at=NOW - timedelta(days=1))
        cluster = bill_cluster(owner.project, size=2, price="10.00", at=NOW - timedelta(hours=1))
        charge_accrued(now=NOW)  # 1 − 2 machines × 10 USD/h × 1 h: below zero

        enforce_limits(now=NOW)

    entry = Entry.objects.get()
    assert (entry.actor, entry.channel, entry.user, entry.project) == (
        "system",
        "system",
        None,
        owner.project,
    )
    assert (entry.action, entry.object_type, entry.object_id) == (
        "clusters:stop_balance",
        "cluster",
        str(cluster.pk),
    )
    assert entry.changes == {"status": {"before": "ready", "after": "terminating"}}
    assert entry.who == "the system"


def test_reads_logged_out_calls_and_405s_write_nothing(owner, client):
    cluster = ClusterFactory(project=owner.project, status=Cluster.Status.READY)

    owner.browser_client().get(f"/clusters/{cluster.pk}/")
    owner.api().get("/api/v1/clusters")
    client.post(f"/clusters/{cluster.pk}/terminate/")
    owner.api().put(f"/api/v1/clusters/{cluster.pk}/terminate")
    client.post("/api/v1/clusters", "{}", content_type="application/json")

    assert not Entry.objects.exists()


def test_a_change_whose_entry_cannot_be_written_does_not_happen(owner, monkeypatch):
    """The entry is written in the change's own transaction: no change without its entry."""
    cluster = ClusterFactory(project=owner.project, status=Cluster.Status.READY)

    def broken(**fields):
        raise RuntimeError("the disk is full")

    monkeypatch.setattr(Entry.objects, "create", broken)
    response = owner.api().post(f"/api/v1/clusters/{cluster.pk}/terminate")

    assert response.status_code == 500
    cluster.refresh_from_db()
    assert cluster.status == Cluster.Status.READY
    assert not cluster.events.exists()


def test_a_refusals_failed_write_is_logged_and_the_request_still_answers(
    owner, monkeypatch, caplog
):
    """A refusal changed nothing: its entry is the middleware's, after the view, and one it
    cannot write fails nothing."""
    cluster = ClusterFactory(project=owner.project, status=Cluster.Status.TERMINATED)

    def broken(**fields):
        raise RuntimeError("the disk is full")

    monkeypatch.setattr(Entry.objects, "create", broken)
    response = owner.api().post(f"/api/v1/clusters/{cluster.pk}/terminate")

    assert response.status_code == 409
    assert "could not write the audit entry for clusters_api_terminate_cluster" in caplog.text


def test_a_view_records_changes_on_the_request_it_handles():
    class Request:
        pass

    request = Request()
    log.record(request, changes={"a": {"before": 1, "after": 2}})  # type: ignore[arg-type]
    log.record(request, changes={"b": {"before": None, "after": "x"}})  # type: ignore[arg-type]

    assert getattr(request, log.CHANGES_ATTRIBUTE) == {
        "a": {"before": 1, "after": 2},
        "b": {"before": None, "after": "x"},
    }


def test_a_failure_reading_the_request_is_logged_and_the_request_still_answers(
    owner, monkeypatch, caplog
):
    cluster = ClusterFactory(project=owner.project, status=Cluster.Status.TERMINATED)

    def broken(*args, **kwargs):
        raise RuntimeError("a bug in the log")

    monkeypatch.setattr(log, "object_of", broken)
    response = owner.browser_client().post(f"/clusters/{cluster.pk}/terminate/")

    assert response.status_code in (302, 409)
    assert "could not write the audit entry for /clusters/" in caplog.text
    assert not Entry.objects.exists()


def test_an_invitation_links_token_stays_out_of_the_log(owner, stranger):
    stranger.browser_client().post("/accounts/invitations/Zq3-secret_T0ken/")

    entry = Entry.objects.get(path__startswith="/accounts/invitations/")
    assert entry.path == "/accounts/invitations/[redacted]/"
    assert not Entry.objects.filter(path__contains="Zq3-secret_T0ken").exists()
