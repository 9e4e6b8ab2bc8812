"""The agent's endpoints and the stdlib agent that calls them (clusters/telemetry/agent_api.py
and agent_service.py; the program is clusters/machines/runcrate_agent.py)."""

import socket

import pytest
import time_machine

from clusters.lifecycle import agent_token
from clusters.machines import runcrate_agent
from clusters.models import Cluster, Node
from tests.clusters.lifecycle_kit import Sim, create, inventory, new_project, node

NVIDIA_SMI = "NVIDIA H100 80GB HBM3, 81559, GPU-1, 550.54.15\n" * 8


@pytest.fixture
def cluster(db) -> Cluster:
    _, project = new_project()
    with Sim():
        return create(project, inventory(hosts=3, boot_seconds=180), nodes=3)


def post(client, path, body, token):
    return client.post(
        path, body, content_type="application/json", headers={"authorization": f"Bearer {token}"}
    )


def test_it_takes_an_agents_check_in_and_names_its_peers(cluster, client):
    n = node(cluster, 1)
    with Sim() as sim:
        response = post(
            client,
            f"/api/v1/agent/nodes/{n.pk}/check-in",
            {"nvidia_smi": NVIDIA_SMI},
            agent_token(n),
        )
    assert response.status_code == 200
    data = response.json()["data"]
    assert data["node"] == "node-1"
    assert data["peers"] == {"node-0": "10.77.0.1", "node-2": "10.77.0.3"}
    # Its peers have not checked in (nor sent WireGuard keys) yet, and they are all starting.
    assert data["peers_ready"] is False and data["peer_starting"] is True
    assert data["wireguard"] == {"listen_port": 51820, "peers": []}
    assert data["head"] == {"name": "node-0", "private_ip": "10.77.0.1"}
    # Until it has measured, it checks in again within a second (not 5 s): its step moves on
    # at the next pass, then its peers and its round come (docs/lifecycle.md, "The agent").
    assert data["check_in_seconds"] == 1.0
    n.refresh_from_db()
    assert n.agent_at is not None and len(n.gpus) == 8
    assert sim.dispatcher.advances == [cluster.pk]  # the reconciler is asked at once


def test_a_starting_nodes_bare_heartbeat_asks_the_reconciler_nothing(cluster, client):
    n = node(cluster, 1)
    with Sim():
        post(client, f"/api/v1/agent/nodes/{n.pk}/check-in", {"nvidia_smi": NVIDIA_SMI},
             agent_token(n))  # fmt: skip
    with Sim() as sim:
        response = post(
            client, f"/api/v1/agent/nodes/{n.pk}/check-in", {"nvidia_smi": NVIDIA_SMI},
            agent_token(n),
        )  # fmt: skip
    assert response.status_code == 200
    # Nothing but its heartbeat moved (the reconciler reads none of a starting node's): no
    # pass over the cluster for each of the check-ins agents make every second while waiting.
    assert sim.dispatcher.advances == []


def test_it_takes_a_network_report(cluster, client):
    n = node(cluster, 0)
    with Sim():
        response = post(
            client,
            f"/api/v1/agent/nodes/{n.pk}/network",
            {"reachability": {"node-1": True, "node-2": False}},
            agent_token(n),
        )
    assert response.status_code == 200
    n.refresh_from_db()
    assert n.reachability == {"node-1": True, "node-2": False}


def test_it_refuses_an_agent_without_its_nodes_token(cluster, client):
    n = node(cluster, 0)
    wrong = post(client, f"/api/v1/agent/nodes/{n.pk}/check-in", {"gpus": []}, "guess")
    assert wrong.status_code == 403
    assert wrong.json()["error"]["code"] == "bad_token"
    other_nodes = post(
        client, f"/api/v1/agent/nodes/{n.pk}/check-in", {"gpus": []}, agent_token(node(cluster, 1))
    )
    assert other_nodes.status_code == 403
    missing = client.post(
        f"/api/v1/agent/nodes/{n.pk}/check-in", {"gpus": []}, content_type="application/json"
    )
    assert missing.status_code == 403
    n.refresh_from_db()
    assert n.agent_at is None


def test_it_tells_the_agent_of_a_released_node_to_stop(cluster, client):
    n = node(cluster, 0)
    Node.objects.filter(pk=n.pk).update(status=Node.Status.ENDED)
    response = post(client, f"/api/v1/agent/nodes/{n.pk}/check-in", {"gpus": []}, agent_token(n))
    assert response.status_code == 410
    assert response.json()["error"]["code"] == "node_released"


def test_it_refuses_a_report_it_cannot_read(cluster, client):
    n = node(cluster, 0)
    response = post(
        client,
        f"/api/v1/agent/nodes/{n.pk}/check-in",
        {"nvidia_smi": "NVIDIA H100, 81559\n"},
        agent_token(n),
    )
    assert response.status_code == 422
    assert "has 2 fields, not 4" in response.json()["error"]["message"]


# --- the stdlib agent -----------------------------------------------------------------------


def test_it_probes_peers_over_tcp():
    with socket.socket() as listener:
        listener.bind(("127.0.0.1", 0))
        listener.listen()
        port = listener.getsockname()[1]
        assert runcrate_agent.probe("127.0.0.1", port, timeout=1)
    assert not runcrate_agent.probe("127.0.0.1", port, timeout=1)


def test_it_needs_its_configuration(monkeypatch, tmp_path):
    monkeypatch.setattr(runcrate_agent, "CONFIG_FILE", tmp_path / "agent.json")
    with pytest.raises(SystemExit, match="RUNCRATE_NODE_TOKEN is not set"):
        runcrate_agent.load_config({"RUNCRATE_URL": "https://x", "RUNCRATE_NODE_ID": "1"})
    with pytest.raises(SystemExit, match="http"):
        runcrate_agent.Agent("file:///etc/passwd", "1", "t")


@pytest.mark.django_db(transaction=True)
def test_it_checks_in_and_reports_the_network_against_the_real_server(live_server, monkeypatch):
    _, project = new_project()
    monkeypatch.setattr(runcrate_agent, "read_gpus", lambda: NVIDIA_SMI)
    monkeypatch.setattr(runcrate_agent, "probe", lambda address, port: address == "10.77.0.2")
    with Sim() as sim:
        cluster = create(project, inventory(hosts=2, boot_seconds=180))
        agents = [
            runcrate_agent.Agent(live_server.url, str(n.pk), agent_token(n))
            for n in cluster.nodes.order_by("index")
        ]
        first = [agent.run_once() for agent in agents]  # both check in; machines not seen up
        sim.tick()  # the reconciler: a checked-in agent proves its machine runs
        second = agents[0].run_once()  # now in `network`: it tests its peer and reports

    assert [s["step"] for s in first] == ["running", "running"]
    assert second["step"] == "network"
    n = node(cluster, 0)
    assert n.agent_at is not None and n.gpus[0]["name"] == "NVIDIA H100 80GB HBM3"
    assert n.reachability == {"node-1": True}


def test_it_keeps_the_wireguard_key_and_the_measurement_an_agent_reports(cluster, client):
    n = node(cluster, 1)
    key = "x" * 42 + "A="  # 32 bytes in base64, as `wg pubkey` prints
    with Sim():
        checked = post(
            client,
            f"/api/v1/agent/nodes/{n.pk}/check-in",
            {"nvidia_smi": "", "wireguard_public_key": key},
            agent_token(n),
        )
        reported = post(
            client,
            f"/api/v1/agent/nodes/{n.pk}/network",
            {
                "reachability": {"node-0": True},
                "acceptance": {"latency_ms": 0.3, "bandwidth_mbit": 940.25, "method": "iperf3"},
            },
            agent_token(n),
        )
    assert checked.status_code == 200 and reported.status_code == 200
    n.refresh_from_db()
    assert n.wireguard_key == key and n.heartbeat_at is not None
    assert n.acceptance == {
        "latency_ms": 0.3,
        "bandwidth_mbit": 940.25,
        "method": "iperf3",
        "error": None,
    }


def test_it_keeps_how_a_worker_mounted_shared_or_why_it_could_not(cluster, client):
    n = node(cluster, 1)
    acceptance = {"bandwidth_mbit": 900, "shared": None, "shared_error": "x" * 400}
    with Sim():
        post(client, f"/api/v1/agent/nodes/{n.pk}/check-in", {"nvidia_smi": ""}, agent_token(n))
        reported = post(
            client,
            f"/api/v1/agent/nodes/{n.pk}/network",
            {"reachability": {"node-0": True}, "acceptance": acceptance},
            agent_token(n),
        )
    assert reported.status_code == 200
    n.refresh_from_db()
    assert n.acceptance["shared"] is None and n.acceptance["shared_error"] == "x" * 300


@pytest.mark.parametrize(
    ("path", "body", "says"),
    [
        ("check-in", {"wireguard_public_key": "not-a-key"}, "wireguard_public_key must be"),
        (
            "check-in",
            {"wireguard_public_key": "xTIBA5rboUvnH4htodjb6e697QjLERt1NAB4mZqp8Dg=\n"},
            "wireguard_public_key must be",
        ),
        ("check-in", {"nvidia_smi": "H100, 1e999, GPU-1, 550"}, "memory '1e999' is not a number"),
        (
            "network",
            {"reachability": {}, "acceptance": {"bandwidth_mbit": "fast"}},
            "acceptance.bandwidth_mbit must be a number",
        ),
        (
            "network",
            {"reachability": {}, "acceptance": {"latency_ms": -1}},
            "acceptance.latency_ms must be a number",
        ),
        (
            "network",
            {"reachability": {}, "acceptance": {"method": "guess"}},
            "acceptance.method must be one of",
        ),
        (
            "network",
            {"reachability": {}, "acceptance": {"shared": "smb"}},
            "acceptance.shared must be one of nfs, simulated, sshfs or null",
        ),
        (
            "network",
            {"reachability": {}, "acceptance": {"shared": None, "shared_error": 7}},
            "acceptance.shared_error must be a string or null",
        ),
    ],
)
def test_it_refuses_a_bad_key_or_measurement_and_records_nothing(cluster, client, path, body, says):
    n = node(cluster, 1)
    with Sim():
        response = post(client, f"/api/v1/agent/nodes/{n.pk}/{path}", body, agent_token(n))
    assert response.status_code == 422
    assert response.json()["error"]["code"] == "invalid_report"
    assert says in response.json()["error"]["message"]
    n.refresh_from_db()
    assert (n.wireguard_key, n.acceptance, n.heartbeat_at) == ("", {}, None)


def test_a_node_tests_the_network_only_once_every_peer_checked_in_after_it_brought_its_key(
    cluster, client
):
    """A peer's answer lists a node's WireGuard key only once that node has checked in with
    it; until the peer checks in again it has not made the node its WireGuard peer, and a
    test would find it unreachable (a worker added to a running cluster was released so)."""
    keys = {i: chr(ord("A") + i) * 42 + "A=" for i in range(3)}

    def check_in(i: int) -> bool:
        n = node(cluster, i)
        answer = post(
            client,
            f"/api/v1/agent/nodes/{n.pk}/check-in",
            {"nvidia_smi": NVIDIA_SMI, "wireguard_public_key": keys[i]},
            agent_token(n),
        )
        assert answer.status_code == 200, answer.content
        return answer.json()["data"]["peers_ready"]

    with Sim(), time_machine.travel("2026-12-05 12:00:00Z", tick=False) as clock:
        assert check_in(0) is False  # nobody else has checked in
        clock.shift(5)
        assert check_in(1) is False  # node-2 has not
        clock.shift(5)
        # node-0 and node-1 last checked in before node-2 brought its key: they do not know it.
        assert check_in(2) is False
        clock.shift(5)
        assert check_in(1) is False  # node-0 has not checked in since node-1's key came
        clock.shift(5)
        assert check_in(0) is True  # both checked in after node-0's key
        assert check_in(1) is True
        assert check_in(2) is True  # node-0 and node-1 have now been told of node-2
