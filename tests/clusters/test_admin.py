"""Staff's Clusters section in admin: clusters with their nodes and events, nodes, volumes; the
actions act through the lifecycle, and nothing the lifecycle owns is edited by hand."""

import pytest
from django.urls import reverse

from accounts.models import User
from billing.models import UsageRecord
from clusters.models import Cluster, Event, Node, Volume
from offers.models import Host
from tests.clusters.lifecycle_kit import at, create, inventory, new_project
from tests.factories import (
    ClusterFactory,
    EventFactory,
    HostFactory,
    LocationFactory,
    MachineTypeFactory,
    ProjectFactory,
)

BOOT = 180
JOINED = BOOT * 1.5


@pytest.fixture
def staff_client(client, db):
    client.force_login(User.objects.create_superuser("staff@example.com", password=None))
    return client


def _fill(count: int) -> None:
    """`count` clusters, each of its own project and location, with nodes, events, a volume."""
    for _ in range(count):
        cluster = ClusterFactory(
            project=ProjectFactory(),
            machine_type=MachineTypeFactory(location=LocationFactory()),
            status=Cluster.Status.READY,
            machines=True,
        )
        EventFactory(cluster=cluster)
        Volume.objects.create(
            project=cluster.project,
            name=f"data-{cluster.pk}",
            location=cluster.machine_type.location,
            size_gb=10,
            price_per_gb_month="0.10",
            cluster=cluster,
        )


@pytest.mark.parametrize("name", ["cluster", "node", "volume"])
def test_it_lists_in_the_same_number_of_queries_for_2_and_20_clusters(
    staff_client, django_assert_max_num_queries, django_assert_num_queries, name
):
    url = reverse(f"admin:clusters_{name}_changelist")
    _fill(2)
    with django_assert_max_num_queries(12) as few:
        assert staff_client.get(url).status_code == 200
    _fill(18)
    with django_assert_num_queries(len(few.captured_queries)):
        response = staff_client.get(url)
    assert len(response.context["cl"].result_list) == (20 if name != "node" else 40)


def test_it_searches_by_project_and_name_and_filters_by_status_and_location(staff_client, db):
    alpha = ClusterFactory(project=ProjectFactory(name="Alpha Labs"), name="train-a")
    beta = ClusterFactory(
        project=ProjectFactory(name="Beta Corp"), name="infer-b", status=Cluster.Status.READY
    )
    url = reverse("admin:clusters_cluster_changelist")

    def listed(query: str) -> set[int]:
        return {c.pk for c in staff_client.get(f"{url}?{query}").context["cl"].result_list}

    assert listed("q=alpha") == {alpha.pk}
    assert listed("q=infer") == {beta.pk}
    assert listed("status__exact=ready") == {beta.pk}
    location = alpha.machine_type.location_id
    assert listed(f"machine_type__location__id__exact={location}") == {alpha.pk}


def test_it_terminates_through_the_lifecycle(staff_client, sim, clock):
    _, project = new_project()
    machine_type = inventory(hosts=4, boot_seconds=BOOT)
    ready = create(project, machine_type, nodes=2)
    sim.run_until(clock, at(JOINED))
    done = ClusterFactory(status=Cluster.Status.TERMINATED)

    response = staff_client.post(
        reverse("admin:clusters_cluster_changelist"),
        {"action": "terminate", "_selected_action": [ready.pk, done.pk]},
        follow=True,
    )

    ready.refresh_from_db()
    assert ready.status == Cluster.Status.TERMINATING
    event = ready.events.get(reason=Event.Reason.TERMINATE_REQUESTED)
    assert "staff@example.com" in event.message
    assert not UsageRecord.objects.filter(cluster=ready, ended_at__isnull=True).exists()
    sim.run_until(clock, at(JOINED + 120))
    ready.refresh_from_db()
    assert ready.status == Cluster.Status.TERMINATED
    assert Host.objects.filter(machine_type=machine_type, state=Host.State.FREE).count() == 4
    page = response.content.decode()
    assert f"Terminating 1 cluster: {ready.name}." in page
    assert f"{done.name}: This cluster is terminated" in page
    done.refresh_from_db()
    assert done.status == Cluster.Status.TERMINATED


def test_it_takes_a_released_host_offline_and_leaves_a_held_one(staff_client, db):
    ended = ClusterFactory(status=Cluster.Status.FAILED, size=1, machines=True)
    live = ClusterFactory(status=Cluster.Status.READY, size=1, machines=True)
    released, held = ended.nodes.get(), live.nodes.get()
    assert (released.host.state, held.host.state) == (Host.State.FREE, Host.State.IN_USE)

    response = staff_client.post(
        reverse("admin:clusters_node_changelist"),
        {"action": "take_host_offline", "_selected_action": [released.pk, held.pk]},
        follow=True,
    )

    released.host.refresh_from_db()
    held.host.refresh_from_db()
    assert released.host.state == Host.State.OFFLINE
    assert held.host.state == Host.State.IN_USE
    page = response.content.decode()
    assert "1 host taken offline." in page
    assert f"still held by a cluster: {held.host.name}" in page


def test_it_shows_nodes_and_events_read_only(staff_client, db):
    cluster = ClusterFactory(status=Cluster.Status.READY, size=2, machines=True)
    EventFactory(cluster=cluster, message="Created: 2 machines reserved.")
    url = reverse("admin:clusters_cluster_change", args=[cluster.pk])

    page = staff_client.get(url).content.decode()

    assert "Created: 2 machines reserved." in page
    assert cluster.nodes.first().host.name in page
    assert 'name="nodes-0-step"' not in page and 'name="nodes-0-status"' not in page
    assert 'name="status"' not in page
    response = staff_client.post(url, {"status": "failed", "nodes-0-step": "done"})
    assert response.status_code == 403
    assert set(Node.objects.values_list("step", flat=True)) == {Node.Step.RUNNING}
    cluster.refresh_from_db()
    assert cluster.status == Cluster.Status.READY


def test_a_clusters_page_runs_the_same_queries_for_2_and_20_nodes(
    staff_client, django_assert_max_num_queries, django_assert_num_queries
):
    small = ClusterFactory(status=Cluster.Status.READY, size=2, machines=True)
    large = ClusterFactory(status=Cluster.Status.READY, size=20, machines=True)
    for cluster in (small, large):
        for node in cluster.nodes.all():
            EventFactory(cluster=cluster, node=node, message=f"{node.name} joined.")

    staff_client.get(reverse("admin:clusters_cluster_change", args=[small.pk]))  # content types
    with django_assert_max_num_queries(25) as few:
        staff_client.get(reverse("admin:clusters_cluster_change", args=[small.pk]))
    with django_assert_num_queries(len(few.captured_queries)):
        page = staff_client.get(reverse("admin:clusters_cluster_change", args=[large.pk]))
    assert all(f"node-{i} joined." in page.content.decode() for i in range(20))


def test_mark_free_frees_a_simulated_host_and_never_an_ssh_host_it_cannot_verify(staff_client):
    """S3: an offline ssh host is one that could not be wiped; without a baseline there is
    nothing to verify it against, so it goes dirty with that reason, never free."""
    simulated = HostFactory(state=Host.State.OFFLINE)
    ssh = HostFactory(
        driver="ssh", address="203.0.113.7", host_key="ssh-ed25519 AAAA", state="offline"
    )

    response = staff_client.post(
        reverse("admin:offers_host_changelist"),
        {"action": "mark_free", "_selected_action": [simulated.pk, ssh.pk]},
        follow=True,
    )

    simulated.refresh_from_db()
    ssh.refresh_from_db()
    assert simulated.state == Host.State.FREE
    assert ssh.state == Host.State.DIRTY
    assert "no baseline was recorded" in ssh.pristine_report
    page = response.content.decode()
    assert "1 host marked free." in page
    assert f"Left {ssh.name} as it was: it is not pristine: no baseline was recorded" in page


def test_reimage_refuses_a_host_without_a_reimage_command_and_changes_nothing(staff_client):
    ssh = HostFactory(
        driver="ssh", address="203.0.113.8", host_key="ssh-ed25519 AAAA", state="dirty"
    )

    response = staff_client.post(
        reverse("admin:offers_host_changelist"),
        {"action": "reimage", "_selected_action": [ssh.pk]},
        follow=True,
    )

    ssh.refresh_from_db()
    assert ssh.state == Host.State.DIRTY
    assert "neither it nor its location has a reimage command" in response.content.decode()
