"""The endpoints a node's agent calls (`runcrate_agent.py`), under `/api/v1/agent/`.

The agent authenticates with its node's token (`Authorization: Bearer <token>`), not an API
key; the service functions in `clusters/agent/service.py` check it and record what it reports.
"""

from typing import Any

from django.http import HttpRequest, HttpResponse
from ninja import Router, Schema

from clusters.agent.service import AgentRefused, agent_check_in, agent_report_network
from clusters.models import Node
from runcrate.api import error_response

router = Router(tags=["agent"], auth=None)


class CheckInIn(Schema):
    gpus: list[dict[str, Any]] | None = None
    nvidia_smi: str | None = None  # the raw CSV, as an alternative to `gpus`


class NetworkIn(Schema):
    reachability: dict[str, bool]


def _token(request: HttpRequest) -> str:
    header = request.headers.get("Authorization", "")
    scheme, _, token = header.partition(" ")
    return token.strip() if scheme.lower() == "bearer" else ""


def _peers(node: Node) -> dict[str, str]:
    """Every other node the agent must reach: name -> private address."""
    others = Node.objects.filter(
        cluster_id=node.cluster_id, status__in=[Node.Status.STARTING, Node.Status.JOINED]
    ).exclude(pk=node.pk)
    return {o.name: o.private_ip for o in others.order_by("index")}


def _answer(request: HttpRequest, call) -> HttpResponse | dict:
    try:
        node = call()
    except AgentRefused as refused:
        return error_response(request, refused.status, refused.code, refused.message)
    return {
        "data": {
            "node": node.name,
            "private_ip": node.private_ip,
            "step": node.step,
            "status": node.status,
            "peers": _peers(node),
        }
    }


@router.post("/agent/nodes/{node_id}/check-in", summary="An agent checks in (and heartbeats)")
def check_in(request: HttpRequest, node_id: int, payload: CheckInIn):
    gpus = payload.nvidia_smi if payload.nvidia_smi is not None else payload.gpus
    return _answer(
        request, lambda: agent_check_in(node=node_id, token=_token(request), gpus=gpus or [])
    )


@router.post("/agent/nodes/{node_id}/network", summary="An agent reports which peers it reached")
def network(request: HttpRequest, node_id: int, payload: NetworkIn):
    return _answer(
        request,
        lambda: agent_report_network(
            node=node_id, token=_token(request), reachability=payload.reachability
        ),
    )
