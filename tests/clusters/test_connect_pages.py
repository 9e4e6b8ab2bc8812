"""The connect panel on the cluster page, its downloads, `GET /api/v1/clusters/{id}/connect`,
and the ready email: what a user needs to get on a cluster and run, for the cluster as it is."""

import html as html_module
import io
import re
from urllib.parse import parse_qs

import paramiko
import pytest
import yaml
from django.core import mail
from django.utils import timezone

from clusters.models import Cluster, Event, Node
from clusters.notifications import send_pending_cluster_emails
from offers.models import MachineType
from tests.factories import ClusterFactory, EventFactory, LocationFactory, MachineTypeFactory

HTMX = {"HX-Request": "true"}
GATEWAY = "gw.us-east-2.runcrate.net:22"


def text_of(response) -> str:
    return " ".join(re.sub(r"<[^>]+>", " ", response.content.decode()).split())


def polled_connect(html: str, cluster: Cluster) -> str:
    """The connect panel version the page's poll sends (its `connect`)."""
    url = re.search(r'<section id="cluster-status"[^>]* hx-get="([^"]*)"', html).group(1)
    path, query = html_module.unescape(url).split("?")
    assert path == f"/clusters/{cluster.pk}/connect/"
    return parse_qs(query, keep_blank_values=True)["connect"][0]


def running_cluster(
    person,
    *,
    status: str = Cluster.Status.READY,
    gateway: str = "",
    kind: str = MachineType.Kind.BARE_METAL,
    software: str = "none",
    size: int = 2,
    gpus: int = 8,
    community: bool = False,
    name: str = "train",
) -> Cluster:
    """A cluster whose machines are up, each at 203.0.113.(10+i) unless behind a gateway."""
    now = timezone.now()
    machine_type = MachineTypeFactory(
        location=LocationFactory(code="us-east-2", name="Columbus, Ohio", ssh_gateway=gateway),
        machine_kind=kind,
        gpus_per_machine=gpus,
        community=community,
    )
    cluster = ClusterFactory(
        project=person.project,
        name=name,
        machine_type=machine_type,
        size=size,
        software=software,
        status=status,
        joined_at=now,
        ready_at=now if status == Cluster.Status.READY else None,
        machines=True,
        machines__status=Node.Status.JOINED,
        machines__step=Node.Step.DONE,
    )
    if not gateway:
        for node in cluster.nodes.all():
            node.public_address = f"203.0.113.{10 + node.index}"
            node.save(update_fields=["public_address"])
    return cluster


# --- the panel ----------------------------------------------------------------------------


@pytest.mark.parametrize(
    "status", [Cluster.Status.INSTALLING, Cluster.Status.READY, Cluster.Status.DEGRADED]
)
def test_it_shows_the_connect_panel_while_the_machines_are_up(owner, status):
    cluster = running_cluster(owner, status=status)

    response = owner.browser_client().get(f"/clusters/{cluster.pk}/connect/")
    html, page = response.content.decode(), text_of(response)

    assert "Connect and run" in page
    assert '<code id="ssh-node-0">ssh root@203.0.113.10</code>' in html
    assert '<code id="ssh-node-1">ssh root@203.0.113.11</code>' in html
    assert 'data-copy="ssh-node-1"' in html
    assert f'href="/clusters/{cluster.pk}/ssh-config"' in html
    assert f'href="/clusters/{cluster.pk}/hostfile"' in html
    assert '<pre id="connect-hostfile">node-0 slots=8\nnode-1 slots=8\n</pre>' in html
    for key in ("torchrun", "mpirun", "deepspeed", "nccl_test"):
        assert f'data-copy="cmd-{key}"' in html
    assert "torchrun --nnodes=2 --nproc-per-node=8" in html
    assert "all_reduce_perf" in html
    assert "about 1-2 Gbit/s between machines" in page
    assert "/offers/quote/?gpu=h100-sxm&amp;nodes=2&amp;interconnect=infiniband" in html
    for variable in ("MASTER_ADDR", "MASTER_PORT", "NODE_RANK", "NNODES", "GPUS_PER_NODE"):
        assert variable in page
    assert "WORLD_SIZE 16" in page
    assert "Every node mounts /shared, exported from node-0" in page


@pytest.mark.parametrize(
    "status",
    [
        Cluster.Status.PROVISIONING,
        Cluster.Status.FAILED,
        Cluster.Status.TERMINATING,
        Cluster.Status.TERMINATED,
        Cluster.Status.STOPPED,
    ],
)
def test_it_shows_no_connect_panel_when_no_machine_is_up_for_use(owner, status):
    cluster = running_cluster(owner, status=status)

    html = owner.browser_client().get(f"/clusters/{cluster.pk}/connect/").content.decode()

    assert "Connect and run" not in html
    assert "ssh-config" not in html


def test_it_jumps_through_the_gateway_behind_one(owner):
    cluster = running_cluster(owner, gateway=GATEWAY)

    html = owner.browser_client().get(f"/clusters/{cluster.pk}/connect/").content.decode()

    assert f"ssh -J c{cluster.pk}@{GATEWAY} root@node-1" in html
    assert "gw.us-east-2.runcrate.net:22</code>, as this cluster's own jump user" in html
    assert "ssh -J None" not in html


def test_it_says_containers_keep_their_own_disk_and_where_the_hostfile_is(owner):
    cluster = running_cluster(owner, kind=MachineType.Kind.CONTAINER)

    page = text_of(owner.browser_client().get(f"/clusters/{cluster.pk}/connect/"))

    assert "Containers share no folder: each node keeps its own disk" in page
    assert "Hostfile /etc/runcrate/hostfile on each node" in page
    assert "--hostfile /etc/runcrate/hostfile" in page


def test_it_shows_the_examples_of_the_clusters_software(owner):
    slurm = running_cluster(owner, software="slurm", name="s")
    kubernetes = running_cluster(owner, software="kubernetes", name="k")
    ray = running_cluster(owner, software="ray", name="r")
    client = owner.browser_client()

    slurm_page = text_of(client.get(f"/clusters/{slurm.pk}/connect/"))
    kube_html = client.get(f"/clusters/{kubernetes.pk}/connect/").content.decode()
    ray_page = text_of(client.get(f"/clusters/{ray.pk}/connect/"))

    assert "partition gpu" in slurm_page
    assert "sbatch --partition=gpu --nodes=2 --ntasks-per-node=8" in slurm_page
    assert "squeue --long" in slurm_page
    assert f'href="/clusters/{kubernetes.pk}/kubeconfig"' in kube_html
    # The API is reached through a tunnel to node-0's private address (its firewall).
    port = 20000 + kubernetes.pk % 10000
    assert f"https://127.0.0.1:{port}" in kube_html
    assert f"ssh -N -L {port}:10.77.0.1:6443 root@203.0.113.10" in kube_html
    assert "nvidia.com/gpu: &quot;8&quot;" in kube_html
    assert "node-0:6379" in ray_page
    assert "ray job submit --address http://node-0:8265" in ray_page
    assert "kubeconfig" not in client.get(f"/clusters/{slurm.pk}/connect/").content.decode()


def test_it_sends_the_panel_to_a_poll_only_when_what_it_shows_changed(owner):
    cluster = running_cluster(owner)
    client = owner.browser_client()
    html = client.get(f"/clusters/{cluster.pk}/connect/").content.decode()
    version = re.search(r'<div id="connect-panel" data-version="([0-9a-f]{12})">', html).group(1)
    assert polled_connect(html, cluster) == version
    # The panel is not inside the polled section.
    section = html.split('<section id="cluster-status"')[1].split("</section>\n\n")[0]
    assert "connect-panel" not in section

    same = client.get(f"/clusters/{cluster.pk}/connect/?connect={version}", headers=HTMX)
    polled = same.content.decode()
    assert polled.lstrip().startswith('<section id="cluster-status"')
    assert 'id="cluster-tab"' not in polled  # on the Connect tab the panel is the tab
    assert "connect-panel" not in polled and 'data-copy="ssh-node-0"' not in polled

    Node.objects.filter(cluster=cluster, index=1).update(public_address="203.0.113.99")
    changed = client.get(f"/clusters/{cluster.pk}/connect/?connect={version}", headers=HTMX)
    body = changed.content.decode()
    fresh = re.search(r'<div id="connect-panel" data-version="(\w+)" hx-swap-oob="true">', body)
    assert fresh and fresh.group(1) != version
    assert "ssh root@203.0.113.99" in body
    assert polled_connect(body, cluster) == fresh.group(1)


def test_it_brings_the_panel_in_when_the_machines_come_up_and_takes_it_away_after(owner):
    cluster = running_cluster(owner, status=Cluster.Status.PROVISIONING)
    client = owner.browser_client()
    page = client.get(f"/clusters/{cluster.pk}/connect/").content.decode()
    assert '<div id="connect-panel" data-version="">' in page
    assert polled_connect(page, cluster) == ""
    assert (
        "connect-panel"
        not in client.get(
            f"/clusters/{cluster.pk}/connect/?connect=", headers=HTMX
        ).content.decode()
    )

    Cluster.objects.filter(pk=cluster.pk).update(status=Cluster.Status.READY)
    up = client.get(f"/clusters/{cluster.pk}/connect/?connect=", headers=HTMX).content.decode()
    assert 'hx-swap-oob="true">' in up and "Connect and run" in up
    version = re.search(r'id="connect-panel" data-version="(\w+)"', up).group(1)

    Cluster.objects.filter(pk=cluster.pk).update(status=Cluster.Status.TERMINATING)
    down = client.get(f"/clusters/{cluster.pk}/connect/?connect={version}", headers=HTMX)
    # The whole tab, out of band: the empty panel and what it says instead.
    assert re.search(r'<section id="cluster-tab"[^>]* hx-swap-oob="true">', down.content.decode())
    assert '<div id="connect-panel" data-version="">' in down.content.decode()
    assert "Connect and run" not in down.content.decode()


def test_it_warns_about_community_hosts_on_the_cluster_page(owner):
    community = running_cluster(owner, community=True, name="shared-gpus")
    datacenter = running_cluster(owner, name="private")
    client = owner.browser_client()

    assert "Machines run by independent operators: keep secrets you would not give them" in (
        text_of(client.get(f"/clusters/{community.pk}/"))
    )
    assert "independent operators" not in text_of(client.get(f"/clusters/{datacenter.pk}/"))


# --- downloads ----------------------------------------------------------------------------


def test_it_downloads_an_ssh_config_that_paramiko_reads(owner):
    cluster = running_cluster(owner, gateway=GATEWAY)

    response = owner.browser_client().get(f"/clusters/{cluster.pk}/ssh-config")

    assert response.status_code == 200
    assert response["Content-Type"] == "text/plain; charset=utf-8"
    assert response["Content-Disposition"] == 'attachment; filename="train.ssh-config"'
    config = paramiko.SSHConfig()
    config.parse(io.StringIO(response.content.decode()))
    entry = config.lookup("train-node-1")
    assert (entry["hostname"], entry["user"]) == ("node-1", "root")
    assert entry["proxyjump"] == f"c{cluster.pk}@{GATEWAY}"


def test_it_downloads_known_hosts_with_the_machines_pinned_keys(owner):
    cluster = running_cluster(owner, gateway=GATEWAY)
    cluster.nodes.filter(index=0).update(host_key="ssh-ed25519 AAAAzero")
    cluster.machine_type.location.__class__.objects.filter(
        pk=cluster.machine_type.location_id
    ).update(ssh_gateway_host_key="ssh-ed25519 AAAAgate")

    response = owner.browser_client().get(f"/clusters/{cluster.pk}/known-hosts")

    assert response["Content-Disposition"] == 'attachment; filename="train.known_hosts"'
    host, port = GATEWAY.rsplit(":", 1)
    assert response.content.decode() == (
        f"runcrate-c{cluster.pk}-node-0 ssh-ed25519 AAAAzero\n"
        + (
            f"{host} ssh-ed25519 AAAAgate\n"
            if port == "22"
            else f"[{host}]:{port} ssh-ed25519 AAAAgate\n"
        )
    )
    page = owner.browser_client().get(f"/clusters/{cluster.pk}/connect/").content.decode()
    assert f'href="/clusters/{cluster.pk}/known-hosts"' in page


def test_it_downloads_the_hostfile(owner):
    cluster = running_cluster(owner, size=3, gpus=4)

    response = owner.browser_client().get(f"/clusters/{cluster.pk}/hostfile")

    assert response["Content-Disposition"] == 'attachment; filename="hostfile"'
    assert response.content.decode() == "node-0 slots=4\nnode-1 slots=4\nnode-2 slots=4\n"


def test_it_downloads_the_kubeconfig_of_a_kubernetes_cluster_only(owner):
    kubernetes = running_cluster(owner, software="kubernetes", name="k")
    slurm = running_cluster(owner, software="slurm", name="s")
    client = owner.browser_client()

    response = client.get(f"/clusters/{kubernetes.pk}/kubeconfig")

    assert response["Content-Disposition"] == 'attachment; filename="k-kubeconfig.yaml"'
    assert response["Content-Type"] == "application/yaml; charset=utf-8"
    # YAML as kubectl writes it, block style: not JSON (which YAML would read too).
    assert response.content.decode().startswith('apiVersion: "v1"\nkind: "Config"\nclusters:\n')
    config = yaml.safe_load(response.content)
    port = 20000 + kubernetes.pk % 10000  # the local end of the tunnel to node-0's API
    assert config["clusters"][0]["cluster"]["server"] == f"https://127.0.0.1:{port}"
    assert client.get(f"/clusters/{slurm.pk}/kubeconfig").status_code == 404


@pytest.mark.parametrize("download", ["ssh-config", "known-hosts", "hostfile", "kubeconfig"])
def test_it_answers_404_to_a_stranger_downloading(owner, stranger, download):
    cluster = running_cluster(owner, software="kubernetes")

    response = stranger.browser_client().get(f"/clusters/{cluster.pk}/{download}")

    assert response.status_code == 404
    assert b"node-0" not in response.content
    assert owner.browser_client().get(f"/clusters/{cluster.pk}/{download}").status_code == 200


@pytest.mark.parametrize("download", ["ssh-config", "known-hosts", "hostfile", "kubeconfig"])
def test_it_has_nothing_to_download_before_the_machines_are_up(owner, download):
    cluster = running_cluster(owner, software="kubernetes", status=Cluster.Status.PROVISIONING)

    assert owner.browser_client().get(f"/clusters/{cluster.pk}/{download}").status_code == 404


@pytest.mark.parametrize(
    ("download", "what"),
    [
        ("ssh-config", "SSH config"),
        ("known-hosts", "known_hosts"),
        ("hostfile", "hostfile"),
        ("kubeconfig", "kubeconfig"),
    ],
)
def test_it_sends_the_owner_of_an_ended_cluster_to_its_page_saying_why(
    owner, stranger, download, what
):
    # The ready email's links outlive the cluster: one clicked after the end is no 404.
    cluster = running_cluster(owner, software="kubernetes", status=Cluster.Status.TERMINATED)
    client = owner.browser_client()

    response = client.get(f"/clusters/{cluster.pk}/{download}")

    assert response.status_code == 302
    assert response["Location"] == f"/clusters/{cluster.pk}/"
    page = text_of(client.get(response["Location"]))
    assert f"This cluster has ended; its {what} is gone with it." in page
    assert stranger.browser_client().get(f"/clusters/{cluster.pk}/{download}").status_code == 404


def test_it_says_a_terminating_cluster_is_ending(owner):
    cluster = running_cluster(owner, status=Cluster.Status.TERMINATING)
    client = owner.browser_client()

    response = client.get(f"/clusters/{cluster.pk}/ssh-config", follow=True)

    assert response.redirect_chain == [(f"/clusters/{cluster.pk}/", 302)]
    assert "This cluster is terminating; its SSH config is gone with it." in text_of(response)


def test_the_panel_names_the_machines_by_their_cluster_scoped_names(owner):
    cluster = running_cluster(owner, size=3)

    page = text_of(owner.browser_client().get(f"/clusters/{cluster.pk}/connect/"))

    assert (
        "then ssh train reaches node-0, the head, and ssh train-node-1 … ssh train-node-2 the "
        "other nodes."
    ) in page
    assert "ssh node-0 works" not in page


def test_it_asks_an_anonymous_visitor_to_log_in_before_downloading(owner, client):
    cluster = running_cluster(owner)

    response = client.get(f"/clusters/{cluster.pk}/ssh-config")

    assert response.status_code == 302
    assert response["Location"].startswith("/accounts/login/")


# --- the API ------------------------------------------------------------------------------


def test_it_gives_everything_in_the_connect_api(owner):
    cluster = running_cluster(owner, software="kubernetes", kind=MachineType.Kind.VM)

    response = owner.api().get(f"/api/v1/clusters/{cluster.pk}/connect")

    assert response.status_code == 200
    data = response.json()["data"]
    assert data["cluster_id"] == cluster.pk and data["status"] == "ready"
    assert data["ssh"] == [
        {
            "node": "node-0",
            "hosts": ["train", "train-node-0"],
            "role": "head",
            "private_ip": "10.77.0.1",
            "address": "203.0.113.10",
            "command": "ssh root@203.0.113.10",
        },
        {
            "node": "node-1",
            "hosts": ["train-node-1"],
            "role": "worker",
            "private_ip": "10.77.0.2",
            "address": "203.0.113.11",
            "command": "ssh root@203.0.113.11",
        },
    ]
    assert "Host train train-node-0\n    HostName 203.0.113.10\n" in data["ssh_config"]
    assert data["hostfile"] == {
        "path": "/shared/hostfile",
        "content": "node-0 slots=8\nnode-1 slots=8\n",
    }
    assert set(data["commands"]) == {"torchrun", "mpirun", "deepspeed", "nccl_test"}
    assert data["environment"][1] == {
        "node": "node-1",
        "variables": {
            "MASTER_ADDR": "node-0",
            "MASTER_PORT": "29500",
            "NODE_RANK": "1",
            "NNODES": "2",
            "GPUS_PER_NODE": "8",
            "WORLD_SIZE": "16",
        },
    }
    assert data["storage"]["shared"] == "/shared"
    assert data["software"]["name"] == "kubernetes"
    assert yaml.safe_load(data["software"]["kubeconfig"])["current-context"] == "train"


def test_it_answers_404_to_a_stranger_asking_for_connect_details(owner, stranger):
    cluster = running_cluster(owner)

    response = stranger.api().get(f"/api/v1/clusters/{cluster.pk}/connect")

    assert response.status_code == 404
    assert response.json()["error"]["code"] == "not_found"


def test_it_answers_409_for_connect_details_before_the_machines_are_up(owner):
    cluster = running_cluster(owner, status=Cluster.Status.PROVISIONING)

    response = owner.api().get(f"/api/v1/clusters/{cluster.pk}/connect")

    assert response.status_code == 409
    assert response.json()["error"]["code"] == "invalid_state"
    assert "provisioning" in response.json()["error"]["message"]


def test_it_reads_the_connect_details_in_a_fixed_number_of_queries(
    owner, django_assert_num_queries
):
    small = running_cluster(owner, size=2, name="small")
    large = running_cluster(owner, size=16, name="large")
    api = owner.api()
    api.get(f"/api/v1/clusters/{small.pk}/connect")  # the key stamped, then found in the cache

    with django_assert_num_queries(3):  # the cluster, its nodes, its volumes
        assert api.get(f"/api/v1/clusters/{small.pk}/connect").status_code == 200
    with django_assert_num_queries(3):
        assert api.get(f"/api/v1/clusters/{large.pk}/connect").status_code == 200


# --- the ready email ------------------------------------------------------------------------


def test_it_puts_the_connect_panel_in_the_ready_email(owner, settings):
    settings.SITE_URL = "https://runcrate.example"
    cluster = running_cluster(owner, software="slurm", size=3)
    EventFactory(cluster=cluster, reason=Event.Reason.READY, message="Ready.")

    assert send_pending_cluster_emails() == 1

    body = mail.outbox[0].body
    assert "node-2  ssh root@203.0.113.12" in body
    assert f"https://runcrate.example/clusters/{cluster.pk}/ssh-config" in body
    assert "torchrun --nnodes=3 --nproc-per-node=8" in body
    assert "sbatch --partition=gpu --nodes=3" in body
    assert "Every node mounts /shared" in body
    # From the user's computer the machines have cluster-scoped names only (issue 21).
    names = (
        "Then ssh train (or ssh train-node-0) reaches node-0, the head, and ssh train-node-1 "
        "… ssh train-node-2 the other nodes."
    )
    assert names in body and '"ssh node-0"' not in body
    html = mail.outbox[0].alternatives[0][0]
    assert "mpirun --allow-run-as-root -np 24 --hostfile /shared/hostfile" in html
    assert html_module.escape(names, quote=False) in html and "ssh node-0" not in html
    assert "word-break:break-all" not in html  # commands wrap at spaces ("pytho / n")


def test_the_ray_panel_copies_the_head_address_and_tunnels_the_dashboard(owner):
    cluster = running_cluster(owner, software="ray")
    html = owner.browser_client().get(f"/clusters/{cluster.pk}/connect/").content.decode()
    assert '<code id="ray-head">node-0:6379</code>' in html
    assert 'data-copy="ray-head"' in html
    tunnel = re.search(r'<pre id="ray-tunnel">([^<]+)</pre>', html).group(1)
    assert tunnel == "ssh -N -L 8265:10.77.0.1:8265 root@203.0.113.10"
    assert 'data-copy="ray-tunnel"' in html and "http://127.0.0.1:8265" in html
    # The token: where it comes from, and ray on the user's computer through the tunnel.
    assert "`ray get-auth-token` on node-0 prints it" in html
    local = re.search(r'<pre id="ray-local">([^<]+)</pre>', html).group(1)
    assert local == (
        "export RAY_AUTH_MODE=token RAY_AUTH_TOKEN=$(ssh root@203.0.113.10 ray get-auth-token)\n"
        "ray job submit --address http://127.0.0.1:8265 --working-dir . -- python script.py"
    )
