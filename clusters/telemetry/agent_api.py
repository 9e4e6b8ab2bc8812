"""The endpoints a node's agent calls (`runcrate_agent.py`), under `/api/v1/agent/`.

The agent authenticates with its node's token (`Authorization: Bearer <token>`), not an API
key; the service functions in `clusters/telemetry/agent_service.py` check it and record what it
reports.
"""

from typing import Any

from django.http import HttpRequest, HttpResponse
from ninja import Router, Schema

from clusters.machines.ssh import WIREGUARD_PORT
from clusters.models import Node, private_ip
from clusters.telemetry import metrics
from clusters.telemetry.agent_service import (
    AgentRefused,
    agent_check_in,
    agent_report_network,
    check_in_seconds,
    measure_peer,
    measure_turn,
)
from clusters.telemetry.health import health_request
from runcrate.api import ErrorOut, error_response

router = Router(tags=["agent"], auth=None)

# What an agent's call answers besides 200: each refusal AgentRefused makes (an unknown node,
# a wrong token, a released node, a report it cannot read); a metrics report also its 429.
REFUSALS = {status: ErrorOut for status in {*AgentRefused.STATUS.values(), 400} - {429}}


class CheckInIn(Schema):
    gpus: list[dict[str, Any]] | None = None
    nvidia_smi: str | None = None  # the raw CSV, as an alternative to `gpus`
    wireguard_public_key: str | None = None
    hostname: str | None = None
    # A ready cluster's node adds its health report (clusters/telemetry/health.py); checked by
    # the service, which says what is wrong with one it cannot take.
    health: Any = None


class MetricsIn(Schema):
    # Checked by clusters.telemetry.metrics.clean_report, which says what is wrong with a report it
    # cannot take (422) and keeps only the figures it knows.
    gpus: Any = None
    node: Any = None


class NetworkIn(Schema):
    reachability: dict[str, bool]
    acceptance: dict[str, Any] | None = None


def _token(request: HttpRequest) -> str:
    header = request.headers.get("Authorization", "")
    scheme, _, token = header.partition(" ")
    return token.strip() if scheme.lower() == "bearer" else ""


def _answer(request: HttpRequest, call) -> HttpResponse | dict:
    try:
        node = call()
    except AgentRefused as refused:
        return error_response(request, refused.status, refused.code, refused.message)
    peers = list(
        Node.objects.filter(cluster_id=node.cluster_id, status__in=Node.LIVE)
        .exclude(pk=node.pk)
        .select_related("host")
        .only("index", "status", "agent_at", "heartbeat_at", "wireguard_key", "host__address")
        .order_by("index", "pk")
    )
    return {
        "data": {
            "node": node.name,
            "private_ip": node.private_ip,
            "step": node.step,
            "status": node.status,
            "peers": {p.name: p.private_ip for p in peers},
            # Every peer can answer this node over the private network: the network test may
            # start (peers_ready, below).
            "peers_ready": peers_ready(node, peers),
            "wireguard": {
                "listen_port": WIREGUARD_PORT,
                "peers": [
                    {
                        "name": p.name,
                        "public_key": p.wireguard_key,
                        "endpoint": f"{p.host.address}:{WIREGUARD_PORT}",
                        "allowed_ip": f"{p.private_ip}/32",
                    }
                    for p in peers
                    if p.wireguard_key and p.host and p.host.address
                ],
            },
            "head": {"name": "node-0", "private_ip": private_ip(0)},
            # Whether this node tests the network now, and to which peer: the batch measures
            # in rounds of pairs that never share a link (clusters/lifecycle/rounds.py).
            "measure_turn": measure_turn(node),
            "measure_peer": measure_peer(node),
            # How soon to check in again until it measured (seconds; null: as usual).
            "check_in_seconds": check_in_seconds(node, len(peers) + 1),
            # A peer is joining (a worker being added): check in every 5 s, not every 30 s, so
            # it finds this node's WireGuard peer for it in time.
            "peer_starting": any(p.status == Node.Status.STARTING for p in peers),
            # On a ready or degraded cluster: what the agent checks and reports with its
            # heartbeats every RUNCRATE_HEALTH_SECONDS (null otherwise).
            "health": health_request(node.cluster, node, peers),
            # On a ready or degraded cluster's live node: how often its agent posts a metrics
            # report (RUNCRATE_METRICS_SECONDS; null otherwise, and the agent sends none).
            "metrics_seconds": metrics.metrics_seconds(node.cluster, node),
        }
    }


def peers_ready(node: Node, peers: list[Node]) -> bool:
    """Whether every peer can answer `node` over the private network, so its agent may test
    it: each peer has checked in, and where `node` has a WireGuard key, each has its own and
    has checked in since `node`'s first check-in (which brought its key), so the peer's
    answer listed `node` and its agent made it a WireGuard peer and opened the firewall to it.
    A worker added to a running cluster waits for that instead of testing peers that may not
    know it for a heartbeat more (30 s): it then found them unreachable and was released."""

    def knows_node(peer: Node) -> bool:
        if not node.wireguard_key:
            return True
        seen, joined = peer.heartbeat_at, node.agent_at
        return (
            bool(peer.wireguard_key) and seen is not None and joined is not None and seen >= joined
        )

    return all(p.agent_at is not None and knows_node(p) for p in peers)


@router.post(
    "/agent/nodes/{node_id}/check-in",
    response={200: dict[str, Any], **REFUSALS},
    summary="An agent checks in (and heartbeats)",
)
def check_in(request: HttpRequest, node_id: int, payload: CheckInIn):
    gpus = payload.nvidia_smi if payload.nvidia_smi is not None else payload.gpus
    return _answer(
        request,
        lambda: agent_check_in(
            node=node_id,
            token=_token(request),
            gpus=gpus or [],
            wireguard_key=payload.wireguard_public_key,
            health=payload.health,
        ),
    )


@router.post(
    "/agent/nodes/{node_id}/network",
    response={200: dict[str, Any], **REFUSALS},
    summary="An agent reports which peers it reached",
)
def network(request: HttpRequest, node_id: int, payload: NetworkIn):
    return _answer(
        request,
        lambda: agent_report_network(
            node=node_id,
            token=_token(request),
            reachability=payload.reachability,
            acceptance=payload.acceptance,
        ),
    )


@router.post(
    "/agent/nodes/{node_id}/metrics",
    response={200: dict[str, Any], **REFUSALS, 429: ErrorOut},
    summary="An agent reports its GPUs' and its node's figures",
)
def report_metrics(request: HttpRequest, node_id: int, payload: MetricsIn):
    try:
        seconds = metrics.record(
            node_id=node_id,
            token=_token(request),
            report={"gpus": payload.gpus, "node": payload.node},
        )
    except AgentRefused as refused:
        response = error_response(request, refused.status, refused.code, refused.message)
        if isinstance(refused, metrics.TooManyReports):
            response["Retry-After"] = str(refused.retry_after)
        return response
    return {"data": {"metrics_seconds": seconds}}
