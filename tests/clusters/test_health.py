"""Unhealthy machines of ready clusters (issue 18, D8): the health reports agents add to their
heartbeats, how the service checks and keeps them, and what the judgement makes of them
(clusters/telemetry/health.py): one node_unhealthy event per problem, the cluster degraded and
its owner emailed, a node_healthy event and the cluster ready again when it is gone."""

from datetime import timedelta

import pytest
from django.core import mail
from django.utils import timezone

from billing.models import UsageRecord
from clusters import lifecycle
from clusters.models import Cluster, Event, Node
from clusters.notifications import send_pending_cluster_emails
from clusters.telemetry import health
from clusters.telemetry.agent_service import AgentRefused, agent_check_in, clean_health
from tests.clusters.lifecycle_kit import Sim, at, create, inventory, node

BOOT = 180
Reason = Event.Reason


def ready(project, clock, *, nodes=3, hosts=None):
    machine_type = inventory(hosts=hosts or nodes + 1, boot_seconds=BOOT)
    sim = Sim()
    with sim:
        cluster = create(project, machine_type, nodes=nodes)
        sim.run_until(clock, at(BOOT * 2))
    cluster.refresh_from_db()
    assert cluster.status == Cluster.Status.READY
    send_pending_cluster_emails()  # the ready email: only this test's emails are looked at
    mail.outbox.clear()
    return cluster, machine_type, sim


def report(cluster, index, *, unreached=(), down=(), shared=None):
    """node-`index`'s health report: every other joined machine reached but `unreached`, sshd
    running unless in `down`."""
    peers = {
        n.name: n.name not in unreached
        for n in cluster.nodes.filter(status=Node.Status.JOINED).exclude(index=index)
    }
    services = {"sshd": "sshd" not in down} | {name: False for name in down if name != "sshd"}
    return {"peers": peers, "services": services, "shared": shared}


def beat(cluster, index, body):
    n = node(cluster, index)
    with Sim():
        return agent_check_in(node=n.pk, token=lifecycle.agent_token(n), gpus=[], health=body)


def events(cluster, *reasons):
    reasons = reasons or (Reason.NODE_UNHEALTHY, Reason.NODE_HEALTHY)
    return list(cluster.events.filter(reason__in=reasons).order_by("at", "pk"))


def post(client, n, body):
    return client.post(
        f"/api/v1/agent/nodes/{n.pk}/check-in",
        body,
        content_type="application/json",
        headers={"authorization": f"Bearer {lifecycle.agent_token(n)}"},
    )


# --- what the agent is asked, what the service keeps -------------------------------------------


def test_the_check_in_of_a_ready_clusters_node_asks_for_health_naming_its_joined_peers(
    project, clock, client
):
    cluster, _, _ = ready(project, clock)
    data = post(client, node(cluster, 1), {"gpus": []}).json()["data"]
    assert data["health"] == {
        "peers": {"node-0": "10.77.0.1", "node-2": "10.77.0.3"},
        "services": ["sshd"],
    }


def test_a_starting_node_is_not_asked_for_health_and_its_report_is_not_kept(project, clock, client):
    machine_type = inventory(hosts=2, boot_seconds=BOOT)
    with Sim():
        cluster = create(project, machine_type, nodes=2)
    n = node(cluster, 1)
    data = post(client, n, {"gpus": [], "health": {"peers": {"node-0": False}}}).json()["data"]
    assert data["health"] is None
    n.refresh_from_db()
    assert n.health == {} and n.health_at is None


@pytest.mark.parametrize(
    ("software", "index", "step", "expected"),
    [
        ("none", 0, "done", ["sshd"]),
        ("slurm", 0, "done", ["sshd", "slurmd", "munged", "slurmctld"]),
        ("slurm", 2, "done", ["sshd", "slurmd", "munged"]),
        ("ray", 0, "done", ["sshd", "raylet", "gcs_server"]),
        ("ray", 1, "done", ["sshd", "raylet"]),
        ("kubernetes", 1, "done", ["sshd", "k3s"]),
        # A node whose install did not finish is not asked about daemons it never ran.
        ("slurm", 1, "install", ["sshd"]),
    ],
)
def test_each_software_names_the_daemons_its_nodes_must_run(software, index, step, expected):
    cluster = Cluster(software=software)
    assert health.expected_services(cluster, Node(index=index, step=step)) == expected


def test_a_healthy_report_is_kept_and_costs_no_query_beyond_the_heartbeat(
    project, clock, django_assert_num_queries
):
    cluster, _, _ = ready(project, clock)
    n = node(cluster, 1)
    token = lifecycle.agent_token(n)
    clock.shift(timedelta(seconds=30))
    # The node's cluster, the lock, the node row, its save (and the savepoint pair the test's
    # own transaction makes of the atomic block).
    with Sim(), django_assert_num_queries(6):
        agent_check_in(node=n.pk, token=token, gpus=[])
    clock.shift(timedelta(seconds=30))
    body = report(cluster, 1)
    with Sim(), django_assert_num_queries(6):
        agent_check_in(node=n.pk, token=token, gpus=[], health=body)
    n.refresh_from_db()
    assert n.health == {
        "peers": {"node-0": True, "node-2": True},
        "services": {"sshd": True},
        "shared": None,
    }
    assert n.health_at == n.heartbeat_at
    cluster.refresh_from_db()
    assert cluster.status == Cluster.Status.READY and events(cluster) == []


@pytest.mark.parametrize(
    ("body", "says"),
    [
        ("sick", "health must be an object"),
        ({"peers": ["node-0"]}, "health.peers must map"),
        ({"peers": {"node-0": "yes"}}, "health.peers must map"),
        ({"peers": {"10.77.0.1": True}}, "peer names (node-N)"),
        ({"peers": {f"node-{i}": True for i in range(301)}}, "at most 300"),
        ({"services": {"Bad Name": True}}, "health.services must map"),
        ({"services": {f"s{i}": True for i in range(21)}}, "at most 20"),
        ({"shared": "/shared"}, "health.shared must be an object"),
        ({"shared": {"mounted": "yes"}}, "health.shared.mounted"),
        ({"shared": {"mounted": True, "answers": 1}}, "health.shared.answers"),
        ({"shared": {"mounted": True, "path": "shared"}}, "absolute path"),
        ({"shared": {"mounted": True, "error": 7}}, "health.shared.error"),
    ],
)
def test_it_refuses_a_health_report_of_another_shape_saying_what(
    project, clock, client, body, says
):
    cluster, _, _ = ready(project, clock, nodes=2)
    n = node(cluster, 1)
    before = n.heartbeat_at
    clock.shift(timedelta(seconds=30))
    response = post(client, n, {"gpus": [], "health": body})
    assert response.status_code == 422
    error = response.json()["error"]
    assert error["code"] == "invalid_report" and says in error["message"]
    n.refresh_from_db()
    assert n.health == {} and n.heartbeat_at == before  # nothing of it was recorded


def test_clean_health_keeps_only_what_it_knows():
    assert clean_health(
        {
            "peers": {"node-2": True, "node-0": False},
            "services": {"sshd": True},
            "shared": {"path": "/shared", "mounted": True, "answers": False, "error": "x" * 900},
            "extra": "dropped",
        }
    ) == {
        "peers": {"node-0": False, "node-2": True},
        "services": {"sshd": True},
        "shared": {"path": "/shared", "mounted": True, "answers": False, "error": "x" * 300},
    }
    assert clean_health(None) is None
    with pytest.raises(AgentRefused):
        clean_health([])


# --- the judgement -----------------------------------------------------------------------------


def test_a_node_cut_off_from_the_others_degrades_the_cluster_once_naming_it(
    project, clock, django_assert_num_queries
):
    cluster, _, _ = ready(project, clock)
    records = set(UsageRecord.objects.filter(cluster=cluster).values_list("pk", "ended_at"))
    clock.shift(timedelta(seconds=60))
    # The others' reports come first: they cannot reach node-1 (its own report is not in yet).
    beat(cluster, 0, report(cluster, 0, unreached={"node-1"}))
    cluster.refresh_from_db()
    assert cluster.status == Cluster.Status.DEGRADED
    assert (cluster.failure_reason, cluster.failure_node) == (Reason.NODE_UNHEALTHY, "node-1")
    assert cluster.failure_message == "node-1 cannot reach node-0 over the private network."

    beat(cluster, 2, report(cluster, 2, unreached={"node-1"}))
    n, body = node(cluster, 1), report(cluster, 1, unreached={"node-0", "node-2"})
    with Sim(), django_assert_num_queries(7):  # a problem already known: nothing is written
        agent_check_in(node=n.pk, token=lifecycle.agent_token(n), gpus=[], health=body)
    clock.shift(timedelta(seconds=120))
    for index in range(3):
        beat(cluster, index, report(cluster, index, unreached={"node-1"} if index != 1 else {}))
    beat(cluster, 1, report(cluster, 1, unreached={"node-0", "node-2"}))

    cluster.refresh_from_db()
    # The picture sharpened; the failure says so, and still one event and one email.
    assert cluster.failure_message == (
        "node-1 cannot reach node-0, node-2 over the private network."
    )
    [event] = events(cluster)
    assert event.reason == Reason.NODE_UNHEALTHY and event.node.name == "node-1"
    assert event.message.startswith("node-1 cannot reach node-0 over the private network.")
    assert "keep running and billed" in event.message
    assert send_pending_cluster_emails() == 1
    [email] = mail.outbox
    assert email.subject == f"Cluster {cluster.name} is degraded: node-1 is unhealthy"
    assert "node-1 cannot reach node-0" in email.body and "billed at" in email.body
    assert send_pending_cluster_emails() == 0
    # Nothing was ended or billed differently: every machine runs on, billed.
    assert set(UsageRecord.objects.filter(cluster=cluster).values_list("pk", "ended_at")) == (
        records
    )
    assert set(cluster.nodes.values_list("status", flat=True)) == {Node.Status.JOINED}


def test_when_every_report_is_healthy_again_it_says_so_and_the_cluster_is_ready(project, clock):
    cluster, _, _ = ready(project, clock)
    clock.shift(timedelta(seconds=60))
    beat(cluster, 1, report(cluster, 1, unreached={"node-0", "node-2"}))
    beat(cluster, 0, report(cluster, 0, unreached={"node-1"}))
    clock.shift(timedelta(seconds=60))
    beat(cluster, 0, report(cluster, 0))
    cluster.refresh_from_db()
    assert cluster.status == Cluster.Status.DEGRADED  # node-1's own report still says so
    beat(cluster, 1, report(cluster, 1))
    beat(cluster, 1, report(cluster, 1))

    cluster.refresh_from_db()
    assert cluster.status == Cluster.Status.READY
    assert (cluster.failure_reason, cluster.failure_message, cluster.health_problems) == (
        "",
        "",
        {},
    )
    unhealthy, healthy = events(cluster)
    assert healthy.reason == Reason.NODE_HEALTHY and healthy.node.name == "node-1"
    assert healthy.message == (
        "node-1 reaches every other machine again over the private network. Every machine is "
        "healthy again: the cluster is ready."
    )
    assert healthy.notification is None
    # A new problem later is a new event (and email).
    clock.shift(timedelta(seconds=60))
    beat(cluster, 2, report(cluster, 2, down={"sshd"}))
    cluster.refresh_from_db()
    assert cluster.status == Cluster.Status.DEGRADED
    assert cluster.failure_message == "sshd is not running on node-2."
    assert [e.reason for e in events(cluster)] == [
        Reason.NODE_UNHEALTHY,
        Reason.NODE_HEALTHY,
        Reason.NODE_UNHEALTHY,
    ]
    assert send_pending_cluster_emails() == 2


def test_a_service_gone_or_shared_hung_names_the_node_and_what(project, clock):
    cluster, _, _ = ready(project, clock)
    clock.shift(timedelta(seconds=60))
    hung = {"path": "/shared", "mounted": True, "answers": False, "error": "took more than 5 s"}
    # A daemon this software does not run is not asked about; a report of it changes nothing.
    beat(cluster, 1, report(cluster, 1, down={"slurmd"}))
    cluster.refresh_from_db()
    assert cluster.status == Cluster.Status.READY
    beat(cluster, 2, report(cluster, 2, down={"sshd"}, shared=hung))
    cluster.refresh_from_db()
    assert cluster.status == Cluster.Status.DEGRADED and cluster.failure_node == "node-2"
    [event] = events(cluster)
    assert event.message.startswith(
        "sshd is not running on node-2. /shared does not answer on node-2 (took more than 5 s)."
    )
    # sshd comes back; /shared still hangs: one event for what healed, still degraded.
    beat(cluster, 2, report(cluster, 2, shared=hung))
    cluster.refresh_from_db()
    assert cluster.status == Cluster.Status.DEGRADED
    assert cluster.failure_message == "/shared does not answer on node-2 (took more than 5 s)."
    assert events(cluster)[-1].message == "sshd runs again on node-2."


def test_a_shared_no_longer_mounted_counts_only_where_it_was_mounted_at_join(project, clock):
    cluster, _, _ = ready(project, clock)
    gone = {"path": "/shared", "mounted": False}
    Node.objects.filter(cluster=cluster, index=1).update(acceptance={"shared": None})
    beat(cluster, 1, report(cluster, 1, shared=gone))
    cluster.refresh_from_db()
    assert cluster.status == Cluster.Status.READY
    Node.objects.filter(cluster=cluster, index=1).update(acceptance={"shared": "sshfs"})
    beat(cluster, 1, report(cluster, 1, shared=gone))
    cluster.refresh_from_db()
    assert cluster.failure_message == "/shared is no longer mounted on node-1."


def test_an_old_report_says_nothing_about_now(project, clock, settings):
    cluster, _, _ = ready(project, clock)
    beat(cluster, 2, report(cluster, 2, down={"sshd"}))
    beat(cluster, 2, report(cluster, 2))  # healthy again: ready
    beat(cluster, 0, report(cluster, 0, unreached={"node-2"}))
    cluster.refresh_from_db()
    assert cluster.status == Cluster.Status.DEGRADED
    # node-0's report goes stale (its agent stopped reporting health); node-2's next one is
    # healthy: nothing fresh says anything is wrong.
    clock.shift(timedelta(seconds=3 * settings.RUNCRATE_HEALTH_SECONDS + 1))
    beat(cluster, 2, report(cluster, 2))
    cluster.refresh_from_db()
    assert cluster.status == Cluster.Status.READY


def test_a_cluster_degraded_for_another_reason_keeps_it(project, clock):
    cluster, _, _ = ready(project, clock)
    with Sim():
        lifecycle.mark_lost(node_id=node(cluster, 2).pk, last_heard=timezone.now(), why="silent")
    cluster.refresh_from_db()
    assert cluster.failure_reason == Reason.MACHINE_LOST
    lost_message = cluster.failure_message

    beat(cluster, 1, report(cluster, 1, unreached={"node-0"}))
    cluster.refresh_from_db()
    [event] = events(cluster)  # announced (and emailed) all the same
    assert event.message.startswith("node-0 cannot reach node-1 over the private network.")
    assert (cluster.failure_reason, cluster.failure_message) == (Reason.MACHINE_LOST, lost_message)
    beat(cluster, 1, report(cluster, 1))
    cluster.refresh_from_db()
    # Healed, but the lost machine still explains the cluster: it stays degraded.
    assert cluster.status == Cluster.Status.DEGRADED
    assert cluster.failure_reason == Reason.MACHINE_LOST
    assert [e.reason for e in events(cluster)] == [Reason.NODE_UNHEALTHY, Reason.NODE_HEALTHY]


def test_a_problem_of_a_machine_that_is_lost_goes_without_a_healed_event(project, clock):
    cluster, _, _ = ready(project, clock)
    beat(cluster, 1, report(cluster, 1, down={"sshd"}))
    with Sim():
        lifecycle.mark_lost(node_id=node(cluster, 1).pk, last_heard=timezone.now(), why="silent")
    beat(cluster, 0, report(cluster, 0))
    cluster.refresh_from_db()
    assert cluster.health_problems == {}
    assert [e.reason for e in events(cluster)] == [Reason.NODE_UNHEALTHY]
    assert cluster.status == Cluster.Status.DEGRADED  # lost: it stays so


def test_nothing_is_judged_while_a_worker_joins(project, clock):
    cluster, _, _ = ready(project, clock, nodes=2, hosts=3)
    with Sim():
        lifecycle.add_workers(cluster=cluster, count=1)
    beat(cluster, 0, report(cluster, 0, unreached={"node-1"}))
    cluster.refresh_from_db()
    assert cluster.status == Cluster.Status.READY and events(cluster) == []


@pytest.mark.parametrize("size", [3, 8])
def test_a_problem_report_costs_the_same_queries_whatever_the_size(
    project, clock, django_assert_num_queries, size
):
    cluster, _, _ = ready(project, clock, nodes=size)
    n = node(cluster, 1)
    body = report(cluster, 1, down={"sshd"})
    token = lifecycle.agent_token(n)
    # The heartbeat's 6, then the nodes read once, the event and the cluster written.
    with Sim(), django_assert_num_queries(9):
        agent_check_in(node=n.pk, token=token, gpus=[], health=body)
    with Sim(), django_assert_num_queries(7):  # known: the nodes are read, nothing is written
        agent_check_in(node=n.pk, token=token, gpus=[], health=body)


def test_a_machine_cut_off_in_a_pair_is_named_from_its_own_report_alone(project, clock):
    """rc0 cut on node-1 of a two-machine cluster: node-1's report comes first, saying it cannot
    reach node-0 and that its /shared (node-0's, over the private network) does not answer.
    Two machines that cannot reach each other look the same from either end; node-1's own
    problem names it, and the email's subject names node-1, not node-0."""
    cluster, _, _ = ready(project, clock, nodes=2)
    clock.shift(timedelta(seconds=60))
    hung = {"path": "/shared", "mounted": True, "answers": False, "error": "timed out"}

    beat(cluster, 1, report(cluster, 1, unreached={"node-0"}, shared=hung))

    cluster.refresh_from_db()
    assert cluster.status == Cluster.Status.DEGRADED
    assert cluster.failure_node == "node-1"
    [event] = events(cluster)
    assert event.node.name == "node-1"
    assert event.message.startswith("node-1 cannot reach node-0 over the private network.")
    assert send_pending_cluster_emails() == 1
    [email] = mail.outbox
    assert email.subject == f"Cluster {cluster.name} is degraded: node-1 is unhealthy"


def test_a_pair_names_the_machine_whose_interface_is_down(project, clock):
    """The same with nothing mounted: node-1's agent says its private interface is down (rc0
    down), and that names it, with the interface as a problem of its own."""
    cluster, _, _ = ready(project, clock, nodes=2)
    clock.shift(timedelta(seconds=60))
    body = report(cluster, 1, unreached={"node-0"}) | {"interface_up": False}

    beat(cluster, 1, body)

    cluster.refresh_from_db()
    assert cluster.failure_node == "node-1"
    assert cluster.failure_message == (
        "node-1 cannot reach node-0 over the private network. node-1's private network "
        "interface is down."
    )
    [event] = events(cluster)
    assert event.node.name == "node-1"
    assert send_pending_cluster_emails() == 1
    assert mail.outbox[0].subject == f"Cluster {cluster.name} is degraded: node-1 is unhealthy"


def test_network_naming_among_equals():
    """Two machines that cannot reach each other: the one the other could not reach is named;
    when each says so of the other, the later one; two cut-off machines are both named."""
    nodes = [Node(index=i, status=Node.Status.JOINED) for i in range(5)]
    index = {n.name: n.index for n in nodes}
    names = set(index)

    def says(i, *unreached):
        nodes[i].health = {"peers": {n: n not in unreached for n in names - {f"node-{i}"}}}
        return nodes[i]

    one = health._network_problem([says(0, "node-1")], names, index, set())
    assert (one.node, one.message) == (
        "node-1",
        "node-1 cannot reach node-0 over the private network",
    )
    both = health._network_problem([says(0, "node-1"), says(1, "node-0")], names, index, set())
    assert both.node == "node-1"
    two = health._network_problem(
        [
            says(0, "node-1", "node-3"),
            says(2, "node-1", "node-3"),
            says(4, "node-1", "node-3"),
            says(1, "node-0", "node-2", "node-3", "node-4"),
        ],
        names,
        index,
        set(),
    )
    # Both are in four failing pairs; node-3 is the one more others could not reach.
    assert two.message == (
        "node-3 cannot reach node-0, node-1, node-2, node-4 over the private network; "
        "node-1 cannot reach node-0, node-2, node-4 over the private network"
    )
    assert (
        two.healed == "node-3 and node-1 reach every other machine again over the private network"
    )
