"""The clusters API: create, list, read, terminate, retry the install, add workers, run the
network test, the connection details; and volumes (list, create, delete).

Every endpoint calls the same `clusters.lifecycle` functions as the pages; a refusal
(`ClusterRefused`) propagates to the API's one handler, which answers with its stable code and
status. Another project's cluster is a 404 `not_found`, exactly like one that does not exist.
Each operation declares the scope its key needs; the key is passed on so that its limits hold.
"""

from dataclasses import asdict
from datetime import datetime
from typing import Annotated, Literal

from django.db.models import Prefetch, QuerySet
from django.http import HttpResponse
from django.utils import timezone
from ninja import Field, Header, Query, Router, Schema, Status
from pydantic import WithJsonSchema
from pydantic.config import JsonDict

import audit
from accounts.api_auth import Scope, needs, needs_as
from accounts.models import Environment
from accounts.projects import DEFAULT_ENVIRONMENT
from accounts.requests import ApiRequest
from billing.usage import ZERO, ClusterCost, cluster_costs
from clusters import connect, idempotency, lifecycle, volumes
from clusters.models import NAME_RE, Cluster, Node, Volume
from clusters.telemetry import idle, metrics
from clusters.web import plans
from offers.api import MachineSpecsOut, track_record_json
from offers.models import MAX_NODES, MIN_NODES
from runcrate import durations, outages
from runcrate.api import (
    ApiError,
    ErrorOut,
    ListMeta,
    Offset,
    RowOut,
    exact_money_str,
    money_str,
    paginated,
    render,
)

router = Router(tags=["clusters"])

# --- schemas --------------------------------------------------------------------------------


class FailureOut(Schema):
    reason: str = Field(description="boot_timeout, agent_timeout, install_failed, …")
    node: str | None = Field(description="The machine that failed (node-i), or null.")
    step: str | None = Field(description="running, agent, network or install, or null.")
    message: str


class HealthOut(RowOut):
    status: str = Field(description="healthy, or unhealthy while `problems` lists any.")
    problems: list[str] = Field(
        description="What its open health problems say (a GPU's uncorrectable ECC errors, a "
        "throttle, a GPU missing, …), each naming the GPU; empty when healthy."
    )


class MachineOut(RowOut):
    id: int = Field(
        description="The machine's own id: a replacement has the name of the one it "
        "replaces, never its id."
    )
    name: str = Field(description="node-0 … node-N-1; node-0 is the head.")
    private_ip: str
    step: str = Field(description="running, agent, network, install or done.")
    status: str = Field(description="starting, joined, failed, ended or lost.")
    health: HealthOut
    drained: str | None = Field(
        description="Why the product took it out of its software's scheduling (Slurm drain, "
        "Kubernetes cordon, Ray raylet stopped); null while it takes jobs."
    )
    replaces: int | None = Field(description="The id of the lost or unhealthy machine it replaces.")
    replaced_by: int | None = Field(description="The id of the machine that replaced it.")
    joining: bool = Field(
        description="Still joining a running cluster: starting, or installing its software as "
        "an added worker or a replacement (the cluster is settled once none is)."
    )
    ended_at: datetime | None = Field(description="When it stopped serving the cluster.")
    cost: str = Field(
        description="What this machine cost so far, USD (its final cost once it ended); the "
        "machines' costs add up to the cluster's `cost_so_far` (docs/billing.md, 'One cost')."
    )


class EventOut(RowOut):
    at: datetime
    node: str | None
    step: str | None
    reason: str
    message: str


class AttachedVolumeOut(Schema):
    id: int
    name: str


class ClusterSummaryOut(Schema):
    id: int
    name: str
    status: str = Field(
        description="provisioning, installing, ready, degraded, failed, terminating, "
        "terminated or stopped."
    )
    running: bool = Field(
        description="Ready or degraded: the machines that joined are up and the software is "
        "settled (clusters/policy.py). Display it; do not decide it from `status`."
    )
    can_terminate: bool = Field(
        description="Whether the cluster may be terminated now: the dashboard's Terminate "
        "button follows the same rule."
    )
    environment: str
    offer_id: str = Field(description="The offer it was created from (the machine type's id).")
    gpu: str
    gpus_per_machine: int
    location: str
    nodes: int = Field(
        description="Machines up now (a worker added counts at once); once its machines are "
        "gone, those billed to its end; the size asked for if it was never billed."
    )
    software: str
    price_per_hour: str = Field(description="The whole cluster, USD per hour.")
    machine_price_per_hour: str = Field(
        description="One machine, USD per hour: a quoted cluster's agreed price."
    )
    quoted: bool = Field(
        description="Created by our team from a won quote request, billed at the agreed price."
    )
    created_at: datetime
    joined_at: datetime | None = Field(description="Every machine joined; billing starts here.")
    billing_started_at: datetime | None = Field(description="The same instant as joined_at.")
    ready_at: datetime | None
    ended_at: datetime | None
    failure: FailureOut | None
    stop_reason: str | None = Field(description="balance or budget for a stopped cluster.")
    volume: AttachedVolumeOut | None = Field(
        description="The volume attached (at /shared/volume on node-0); null once it ended."
    )
    repair_policy: str = Field(
        description="ask: a lost or unhealthy worker is replaced when you say so; auto: "
        "automatically (docs/lifecycle.md, 'Repair')."
    )
    machines: list[MachineOut]
    cost_so_far: str = Field(
        description="What the cluster cost so far, USD, at the instant of the answer: the sum of "
        "its machines' `cost`, the figure the dashboard, the CLI and the MCP server show "
        "(docs/billing.md, 'One cost')."
    )
    final_cost: str | None = Field(
        description="Its final cost, USD, once its machines are gone (terminating or ended); "
        "null while it may still be billed."
    )
    billed_seconds: int = Field(description="How long it has been billed (its uptime).")
    billed_for: str = Field(description="The same in words: '2 h 13 min'.")
    idle_since: datetime | None = Field(
        description="Since when every GPU has stayed below the idle threshold, once that "
        "lasted long enough to be told (a notice: nothing is stopped); null while they work."
    )


class AcceptanceGpuOut(RowOut):
    name: str
    memory_total_mib: int | None
    driver_version: str | None = Field(None, description="The NVIDIA driver nvidia-smi reported.")


class AcceptanceNodeOut(RowOut):
    name: str
    gpus: list[AcceptanceGpuOut] = Field(description="The GPUs its agent saw (nvidia-smi).")
    reachability: dict[str, bool] = Field(description="Peer name -> reached over 10.77.0.0/24.")
    latency_ms: float | None = Field(
        description="Median TCP round trip to its peer (`peer`); null where it measured nothing."
    )
    bandwidth_mbit: float | None = Field(
        description="Mbit/s it moved to its peer (`peer`), no other measurement sharing either "
        "link; null where it measured nothing (node-0 alone)."
    )
    round: int | None = Field(
        None,
        description="The round of acceptance it was measured in (1-3: the nodes measure in "
        "rounds of pairs that never share a link); null on reports from before the rounds.",
    )
    peer: str | None = Field(
        None,
        description="The node it measured to in its round (node-0 on reports from before the "
        "rounds, null where it measured nothing).",
    )
    method: str | None = Field(description="iperf3, tcp-stream (the agent's own) or simulated.")
    vcpus: int | None = Field(None, description="The vCPUs its agent counted.")
    memory_mib: int | None = Field(
        None, description="Its memory as the kernel reads it (MemTotal)."
    )


class AcceptanceExpectedOut(Schema):
    gpu: str
    gpus_per_machine: int
    memory_gib: int
    link_mbit: int | None = Field(None, description="Each machine's expected link, Mbit/s.")
    min_bandwidth_mbit: float | None = Field(
        None, description="The least a node had to move to its peer, measured alone."
    )
    specs: MachineSpecsOut | None = Field(
        None, description="Each machine's specs as sold: what every node was held to."
    )


class AcceptanceOut(Schema):
    measured_at: datetime = Field(description="When every machine joined, before billing.")
    expected: AcceptanceExpectedOut = Field(description="What the offer sells per machine.")
    nodes: list[AcceptanceNodeOut]


class NetworkTestSizeOut(Schema):
    bytes: int = Field(description="The message size all_reduce_perf reduced.")
    size: str = Field(description="The same, for people: 8 B, 1 KiB, 128 MiB.")
    count: int
    type: str
    redop: str
    time_us: float = Field(description="Out of place, microseconds.")
    algbw_gbs: float = Field(description="Algorithm bandwidth, GB/s, out of place.")
    busbw_gbs: float = Field(description="Bus bandwidth, GB/s, out of place.")
    in_place_busbw_gbs: float
    wrong: int | None = Field(description="Wrong values, out and in place; null unchecked.")


class NetworkTestPairOut(Schema):
    node: str = Field(description="The node that measured (node-1 …).")
    to: str = Field(description="node-0, the head.")
    gbit_s: float | None = Field(description="Bandwidth to the head; null with `error`.")
    latency_ms: float | None
    tool: str | None = Field(description="iperf3 or tcp-stream (the agent's own).")
    error: str | None


class NetworkTestOut(Schema):
    state: str = Field(description="running, done or failed.")
    method: str | None = Field(
        description="nccl (all_reduce_perf across the machines) or agent (each machine to "
        "node-0); null while running or when it failed before measuring."
    )
    verdict: str | None = Field(
        description="'passed' or 'below what Ethernet should give' once done (verdict_rule); "
        "null while it runs, or when it failed before measuring."
    )
    verdict_rule: str = Field(description="The rule the verdict follows, for a person.")
    simulated: bool = Field(description="Stand-in figures of the simulated data center.")
    started_at: datetime
    finished_at: datetime | None
    requested_by: str | None
    machines: list[str] = Field(description="The machines measured.")
    error: str | None = Field(description="Why it failed, for a person.")
    sizes: list[NetworkTestSizeOut] | None = Field(description="nccl: per message size.")
    avg_busbw_gbs: float | None = Field(description="nccl: all_reduce_perf's average.")
    peak_busbw_gbs: float | None = Field(description="nccl: the highest bus bandwidth.")
    pairs: list[NetworkTestPairOut] | None = Field(description="agent: per machine.")
    command: str | None = Field(description="nccl: the command that ran on node-0.")
    expected: str = Field(description="What the Ethernet private network is expected to give.")


class NetworkTestEnvelope(Schema):
    data: NetworkTestOut


class KeyHolderOut(Schema):
    name: str
    fingerprint: str
    owner: str = Field(description="The email of the member who added it; empty: a shared key.")


class ClusterOut(ClusterSummaryOut):
    ssh_keys: list[KeyHolderOut] = Field(
        description="The SSH keys installed on every machine, as they were at creation "
        '(docs/accounts.md, "SSH keys on clusters"); empty for a cluster made before this '
        "was recorded."
    )
    events: list[EventOut] = Field(description="Every transition and failure, oldest first.")
    acceptance: AcceptanceOut | None = Field(
        description="The acceptance report measured inside `network`, before billing started; "
        "null until every machine joined."
    )
    network_test: NetworkTestOut | None = Field(
        description="The last network test asked for (POST …/network-test); null before any."
    )


class ClusterEnvelope(Schema):
    data: ClusterOut


class ClusterList(Schema):
    data: list[ClusterSummaryOut]
    meta: ListMeta


# What the OpenAPI document says of a name and a size. Only said, not enforced by the schema:
# the lifecycle refuses them with their own codes (invalid_name, invalid_nodes, …).
NAME_SCHEMA: JsonDict = {
    "pattern": "^" + NAME_RE.pattern.removesuffix(r"\Z") + "$",
    "maxLength": 63,
}


class ClusterIn(Schema):
    name: str = Field(
        description="A DNS label, unique among the environment's live clusters.",
        json_schema_extra=NAME_SCHEMA,
    )
    offer_id: str = Field(description="An offer's id, from GET /api/v1/offers.")
    nodes: int = Field(
        description=f"{MIN_NODES} to {MAX_NODES}, at most the offer's max_nodes.",
        json_schema_extra={"minimum": MIN_NODES, "maximum": MAX_NODES},
    )
    software: str = Field("none", description="none, slurm, kubernetes or ray.")
    ssh_key_ids: list[int] | None = Field(
        None,
        description="SSH keys of the project to install, by id. With neither this nor "
        "member_ids: the creator's own keys and the project's shared keys (docs/accounts.md).",
    )
    member_ids: list[int] | None = Field(
        None,
        description="Members (ids from GET /api/v1/members) whose every SSH key is installed, "
        "beside ssh_key_ids. 422 `unknown_member` for an id not in the project.",
    )
    environment: str = Field(DEFAULT_ENVIRONMENT, description="An environment's name.")
    volume_id: int | None = Field(
        None,
        description="A volume of the project to attach (same location, not on community "
        "offers, not attached elsewhere); it appears at /shared/volume on node-0.",
    )
    repair_policy: Literal["ask", "auto"] = Field(
        "ask",
        description="Who decides to replace a lost or unhealthy worker: ask (you, from the "
        "dashboard, the API, the CLI or the MCP server) or auto (the product, at once for a "
        "lost one, after RUNCRATE_REPAIR_GRACE_SECONDS for an unhealthy one).",
    )
    plan_token: str | None = Field(
        None,
        description="The plan_token of POST /api/v1/clusters/plan for exactly this body: the "
        "create is then refused `plan_mismatch` if the body differs from the one planned (or "
        "the plan was another project's or key's) and `plan_expired` 10 minutes after the "
        "plan. Ignored by the plan itself.",
    )

    def create_body(self) -> dict:
        """The create's fields, defaults filled in, without `plan_token`: what a plan binds."""
        return self.dict(exclude={"plan_token"})


class NetworkTermsOut(Schema):
    interconnect: str
    expected: str = Field(description="What the network gives between machines.")
    suits: str | None = Field(None, description="What Ethernet suits (Ethernet only).")
    not_for: str | None = Field(None, description="What it is not built for (Ethernet only).")


class PlanOut(Schema):
    name: str
    environment: str
    offer_id: str
    nodes: int
    software: str
    repair_policy: str
    ssh_key_ids: list[int] = Field(description="The SSH keys the create would install.")
    volume_id: int | None
    gpu: str = Field(description="The GPU model's name.")
    gpus_per_machine: int
    gpus_total: int = Field(description="Every GPU of the cluster: nodes × gpus_per_machine.")
    location: str
    community: bool = Field(description="On an independent operator's hosts: no secrets.")
    specs: MachineSpecsOut = Field(description="What each machine is sold with.")
    machine_price_per_hour: str
    price_per_hour: str = Field(description="The whole cluster, USD per hour.")
    price_per_gpu_hour: str = Field(description="One GPU for an hour, USD, exact.")
    balance: str | None = Field(
        description="The project's balance; null for a key or member that does not see "
        "billing (the billing scope and an owner's or manager's key)."
    )
    running_price_per_hour: str | None = Field(
        description="USD per hour the project already runs and stores (billed now); null as "
        "`balance`."
    )
    hours_covered: str | None = Field(
        description="Hours the balance pays for this cluster beside what already runs; null "
        "as `balance`."
    )
    balance_needed: str = Field(
        description="What the create needs in the balance: one hour of this cluster, never "
        "less than the minimum balance (what already runs is not counted: see hours_covered)."
    )
    ready_estimate_seconds: int = Field(
        description="The estimated time from create to ready (docs/clusters.md, 'Time to "
        "ready'); the offer's track record says how its clusters really started."
    )
    ready_estimate: str = Field(
        description="ready_estimate_seconds in words, to the minute half up: 'about 4 min', "
        "'under 1 min'."
    )
    hours_covered_text: str | None = Field(
        description="hours_covered as the dashboard words the span: '5 h 20 min', rounded "
        "down; null as `balance`."
    )
    track_record: dict | None = Field(
        description="The offer's track record, as GET /api/v1/offers gives it; null below "
        "the minimum of clusters."
    )
    network: NetworkTermsOut
    plan_token: str = Field(
        description="Give it to POST /api/v1/clusters with exactly this body, within 10 "
        "minutes; any server process honours it."
    )
    plan_expires_at: datetime


class PlanEnvelope(Schema):
    data: PlanOut


class ReplaceIn(Schema):
    plan_token: str | None = Field(
        None,
        description="The plan_token of POST /api/v1/clusters/{id}/nodes/{name}/replace/plan for "
        "this machine: the replacement is then refused `plan_mismatch` for another machine, "
        "cluster, project or key, and `plan_expired` 10 minutes after the plan.",
    )


class ReplacePlanOut(Schema):
    cluster_id: int
    node: str = Field(description="The machine replaced; the new one takes its name.")
    private_ip: str = Field(description="Its private address, which the new machine keeps.")
    why: str = Field(description="Why it may be replaced: lost, or its open health problems.")
    price_per_hour: str = Field(description="The new machine, USD per hour, billed once up.")
    cluster_price_per_hour: str = Field(description="The whole cluster once it is up.")
    billing: str = Field(description="What the replacement does to the bill, in words.")
    plan_token: str
    plan_expires_at: datetime


class ReplacePlanEnvelope(Schema):
    data: ReplacePlanOut


class ClusterChangeIn(Schema):
    repair_policy: Literal["ask", "auto"] = Field(
        description="ask or auto (docs/lifecycle.md, 'Repair')."
    )


class WorkersIn(Schema):
    count: int = Field(
        description=f"How many machines to add; the cluster stays at most {MAX_NODES}.",
        json_schema_extra={"minimum": 1, "maximum": MAX_NODES - MIN_NODES},
    )
    plan_token: str | None = Field(
        None,
        description="The plan_token of POST /api/v1/clusters/{id}/workers/plan for this cluster "
        "and count: the workers are then refused `plan_mismatch` for another count, cluster, "
        "project or key, and `plan_expired` 10 minutes after the plan. Ignored by the plan "
        "itself.",
    )


class WorkersPlanOut(Schema):
    cluster_id: int
    name: str
    count: int = Field(description="The machines added.")
    machine_price_per_hour: str = Field(description="One machine of the cluster, USD per hour.")
    added_price_per_hour: str = Field(description="What they add: count × the machine price.")
    machines_now: int = Field(description="The cluster's live machines now.")
    price_per_hour: str = Field(description="The whole cluster now, USD per hour.")
    machines_after: int
    new_price_per_hour: str = Field(description="The whole cluster once they are up.")
    balance_needed: str = Field(
        description="What the balance must hold: one hour of the grown cluster, never less "
        "than the minimum balance (the create's rule)."
    )
    billing: str = Field(description="What adding them does to the bill, in words.")
    plan_token: str
    plan_expires_at: datetime


class WorkersPlanEnvelope(Schema):
    data: WorkersPlanOut


# --- reading ----------------------------------------------------------------------------------


# What a cluster's `machines` read of its nodes: a node's row also holds what its agent
# reported (its GPUs, its reachability of every peer, its health), several kilobytes that grow
# with the cluster, which an answer neither shows nor should pay to decode for every node.
MACHINE_COLUMNS = ("cluster_id", "index", "status", "step", "drained", "replaces_id", "ended_at")


def _clusters(request: ApiRequest) -> QuerySet[Cluster]:
    """The project's clusters with what their objects show, in a fixed number of queries."""
    nodes = Node.objects.only(*MACHINE_COLUMNS).order_by("index", "pk")
    return (
        Cluster.objects.filter(project=request.project)
        .select_related("environment", "machine_type__location", "machine_type__gpu")
        .prefetch_related(Prefetch("nodes", queryset=nodes), "volumes")
    )


def _get_cluster(request: ApiRequest, cluster_id: int) -> Cluster:
    cluster = _clusters(request).filter(pk=cluster_id).first()
    if cluster is None:
        raise ApiError(404, "not_found", f"There is no cluster {cluster_id} in your project.")
    return cluster


def _costs(clusters: list[Cluster]) -> dict[int, ClusterCost]:
    """The one cost of each cluster (billing.usage.cluster_costs, one query for a page)."""
    return cluster_costs([cluster.pk for cluster in clusters], now=timezone.now())


def _cost_fields(cluster: Cluster, cost: ClusterCost) -> dict:
    gone = cluster.is_final or cluster.status == Cluster.Status.TERMINATING
    return {
        "cost_so_far": money_str(cost.cost),
        "final_cost": money_str(cost.cost) if gone and not cost.running else None,
        "billed_seconds": cost.uptime_seconds,
        "billed_for": durations.span(cost.uptime_seconds),
    }


def _summary(cluster: Cluster, cost: ClusterCost | None = None) -> dict:
    machine_type = cluster.machine_type
    nodes = list(cluster.nodes.all())
    cost = cost or _costs([cluster])[cluster.pk]
    size = cluster.machines_priced(Cluster.machines_up_in(nodes), billed=cost.machines_now)
    failure = None
    if cluster.failure_reason:
        failure = {
            "reason": cluster.failure_reason,
            "node": cluster.failure_node or None,
            "step": cluster.failure_step or None,
            "message": cluster.failure_message,
        }
    return {
        "id": cluster.pk,
        "name": cluster.name,
        "status": cluster.status,
        "running": cluster.is_running,
        "can_terminate": cluster.can_terminate,
        "environment": cluster.environment.name,
        "offer_id": machine_type.slug,
        "gpu": machine_type.gpu.slug,
        "gpus_per_machine": machine_type.gpus_per_machine,
        "location": machine_type.location.code,
        "nodes": size,
        "software": cluster.software,
        "price_per_hour": money_str(cluster.price_per_hour(size)),
        "machine_price_per_hour": money_str(cluster.price_per_machine_hour),
        "quoted": cluster.is_quoted,
        "created_at": cluster.created_at,
        "joined_at": cluster.joined_at,
        "billing_started_at": cluster.joined_at,
        "ready_at": cluster.ready_at,
        "ended_at": cluster.ended_at,
        "failure": failure,
        "stop_reason": cluster.stop_reason or None,
        "volume": next(
            ({"id": v.pk, "name": v.name} for v in cluster.volumes.all() if v.deleted_at is None),
            None,
        ),
        "repair_policy": cluster.repair_policy,
        "machines": _machines(cluster, nodes, cost),
        **_cost_fields(cluster, cost),
        "idle_since": cluster.idle_since,
    }


def _machines(cluster: Cluster, nodes: list[Node], cost: ClusterCost) -> list[dict]:
    replaced_by = {n.replaces_id: n.pk for n in nodes if n.replaces_id is not None}
    return [
        {
            "id": node.pk,
            "name": node.name,
            "private_ip": node.private_ip,
            "step": node.step,
            "status": node.status,
            # A machine that left has no health of its own any more: its name's problems are
            # the live machine's.
            "health": health(cluster, node.name)
            if node.status in Node.LIVE
            else {"status": "healthy", "problems": []},
            "drained": node.drained or None,
            "replaces": node.replaces_id,
            "replaced_by": replaced_by.get(node.pk),
            "joining": lifecycle.joining(cluster, node),
            "ended_at": node.ended_at,
            "cost": money_str(cost.node_costs.get(node.pk, ZERO)),
        }
        for node in nodes
    ]


def health(cluster: Cluster, node_name: str) -> dict:
    """A machine's `health`, the same in the cluster's machines and in its metrics: its open
    health problems (`Cluster.problems_of`), unhealthy while there is one."""
    problems = cluster.problems_of(node_name)
    return {"status": "unhealthy" if problems else "healthy", "problems": problems}


def _detail(cluster: Cluster) -> dict:
    return {
        **_summary(cluster),
        "ssh_keys": cluster.key_holders,
        "events": _events(cluster),
        "acceptance": cluster.acceptance or None,
        "network_test": lifecycle.network_test_report(cluster),
    }


def _events(cluster: Cluster) -> list[dict]:
    """Its events, oldest first, in one query: read as values, not as model instances (a
    64-machine cluster has some 200), each named by its node among the cluster's nodes read."""
    names = {node.pk: node.name for node in cluster.nodes.all()}
    rows = cluster.events.order_by("at", "pk").values_list(
        "at", "node_id", "step", "reason", "message"
    )
    return [
        {
            "at": at,
            "node": names.get(node_id) if node_id else None,
            "step": step or None,
            "reason": reason,
            "message": message,
        }
        for at, node_id, step, reason, message in rows
    ]


REFUSAL_CODES = (
    "Refusals: 422 `invalid_nodes`, 404 `unknown_offer`, 402 `insufficient_balance`, "
    "409 `not_enough_machines`, 422 `software_not_offered`, 422 `invalid_name`, "
    "409 `name_taken`, 422 `no_ssh_keys`, 422 `unknown_member`, 404 `unknown_environment`, 422 "
    "`volume_not_allowed` (not the project's, another location, a community offer), 409 "
    "`volume_in_use`, 403 `key_limit_exceeded` (the key's machines per cluster or USD per "
    "hour), 402 `budget_reached`, 403 `scope_missing`; with a `plan_token`, 422 "
    "`plan_mismatch` (not a plan of this body, project and key) and 422 `plan_expired` (older "
    "than 10 minutes). Nothing is reserved or attached when a request is refused."
)


# --- endpoints ------------------------------------------------------------------------------


@router.get(
    "/clusters",
    auth=needs(Scope.READ),
    response={200: ClusterList, 401: ErrorOut, 403: ErrorOut},
    summary="List clusters",
)
def list_clusters(
    request: ApiRequest,
    limit: Annotated[int, Query(ge=1, le=200)] = 50,
    offset: Offset = 0,
) -> dict:
    """The project's clusters, newest first. Each object is a cluster without its events."""
    queryset = _clusters(request).order_by("-created_at", "-pk")
    page = paginated(queryset, limit=limit, offset=offset)
    costs = _costs(page["data"])  # one query for the page
    page["data"] = [_summary(cluster, costs[cluster.pk]) for cluster in page["data"]]
    return page


IDEMPOTENCY = (
    " With an `Idempotency-Key` header (1-255 printable ASCII characters, such as a UUID), a "
    "retry with the same key and body answers what the first create did (the same status and "
    "body, the same cluster) for 24 hours and never reserves twice; the same key with another "
    "body is 422 `idempotency_key_reused`. A refused create is not kept: its retry is decided "
    "afresh."
)


def _environment(request: ApiRequest, name: str) -> Environment:
    environment = Environment.objects.filter(project=request.project, name=name).first()
    if environment is None:
        raise ApiError(
            404, "unknown_environment", f"Your project has no environment named {name!r}."
        )
    return environment


def _create(request: ApiRequest, payload: ClusterIn) -> idempotency.Answer:
    project = request.project
    if payload.plan_token is not None:
        plans.check_token(
            payload.plan_token, project=project, api_key=request.auth, body=payload.create_body()
        )
    environment = _environment(request, payload.environment)
    # A COMMIT that went through as the connection dropped is a create that happened (without
    # an Idempotency-Key; with one, its record's transaction is the one that commits).
    cluster = outages.commit(
        lambda: lifecycle.create_cluster(
            project=project,
            user=request.user,
            environment=environment,
            offer_slug=payload.offer_id,
            nodes=payload.nodes,
            name=payload.name,
            software=payload.software,
            ssh_key_ids=payload.ssh_key_ids,
            member_ids=payload.member_ids,
            volume_id=payload.volume_id,
            api_key=request.auth,
            repair_policy=payload.repair_policy,
        )
    )
    # Committed (outside Idempotency-Key's transaction): a connection lost now still answers 201.
    body = outages.after_commit(lambda: {"data": _detail(_get_cluster(request, cluster.pk))})
    response = render(request, ClusterEnvelope, body, status=201)
    return idempotency.Answer(response.status_code, response.content, cluster.pk)


@router.post(
    "/clusters",
    auth=needs(Scope.CREATE),
    response={
        201: ClusterEnvelope,
        401: ErrorOut,
        402: ErrorOut,
        403: ErrorOut,
        404: ErrorOut,
        409: ErrorOut,
        422: ErrorOut,
    },
    summary="Create a cluster",
    description="Reserves every machine at once, or none. " + REFUSAL_CODES + IDEMPOTENCY,
)
def create_cluster(
    request: ApiRequest,
    payload: ClusterIn,
    idempotency_key: Annotated[str | None, Header(alias=idempotency.HEADER)] = None,
) -> HttpResponse:
    if idempotency_key is None:
        answer = _create(request, payload)
    else:
        answer = idempotency.once(
            project=request.project,
            api_key=request.auth,
            key=idempotency_key,
            body=payload.create_body(),  # a retry carries a new plan_token, or none
            run=lambda: _create(request, payload),
        )
    return HttpResponse(answer.content, status=answer.status, content_type="application/json")


def _plan(planned: plans.Plan) -> dict:
    offer, body = planned.offer, planned.body
    machine_type = planned.checked.machine_type
    return {
        **body,
        "ssh_key_ids": [key.pk for key in planned.checked.keys],
        "gpu": machine_type.gpu.name,
        "gpus_per_machine": machine_type.gpus_per_machine,
        "gpus_total": offer.gpus_total,
        "location": machine_type.location.code,
        "community": machine_type.community,
        "specs": machine_type.specs.as_dict(),
        "machine_price_per_hour": money_str(planned.checked.price_per_machine_hour),
        "price_per_hour": money_str(planned.price_per_hour),
        "price_per_gpu_hour": exact_money_str(offer.price_per_gpu_hour),
        "balance": money_str(planned.balance),
        "running_price_per_hour": money_str(planned.running_per_hour),
        "hours_covered": money_str(planned.hours_covered),
        "balance_needed": money_str(planned.balance_needed),
        "ready_estimate_seconds": int(planned.ready_estimate.total_seconds()),
        "ready_estimate": durations.about_minutes(planned.ready_estimate),
        "hours_covered_text": None
        if planned.hours_covered is None
        else durations.span(planned.hours_covered * 3600),
        "track_record": track_record_json(offer.track_record),
        "network": plans.network_terms(machine_type.interconnect),
        "plan_token": planned.token,
        "plan_expires_at": planned.expires_at,
    }


@router.post(
    "/clusters/plan",
    # Refused exactly as the create would be, naming the create's call.
    auth=needs_as(Scope.CREATE, "POST /api/v1/clusters"),
    response={
        200: PlanEnvelope,
        401: ErrorOut,
        402: ErrorOut,
        403: ErrorOut,
        404: ErrorOut,
        409: ErrorOut,
        422: ErrorOut,
    },
    summary="Plan a create",
    description="Takes exactly the body of POST /api/v1/clusters and runs every check the "
    "create runs, in its order (the balance beside what already runs, the key's scope and "
    "limits, the name, the environment, the budget, capacity, software, SSH keys, the volume), "
    "reserving nothing. Answers the create's own refusal (the same status, code and message) "
    "or the plan: prices, GPUs, the hours the balance covers, the estimated time to ready, the "
    "offer's track record, the network, and a `plan_token` for the create, valid 10 minutes. "
    + REFUSAL_CODES,
)
def plan_cluster(request: ApiRequest, payload: ClusterIn) -> dict:
    planned = plans.plan(
        project=request.project,
        user=request.user,
        environment=_environment(request, payload.environment),
        api_key=request.auth,
        body=payload.create_body(),
    )
    return {"data": _plan(planned)}


@router.get(
    "/clusters/{cluster_id}",
    auth=needs(Scope.READ),
    response={200: ClusterEnvelope, 401: ErrorOut, 403: ErrorOut, 404: ErrorOut},
    summary="Read a cluster",
)
def get_cluster(request: ApiRequest, cluster_id: int) -> dict:
    """Its status, failure, machines and events, in a fixed number of queries."""
    return {"data": _detail(_get_cluster(request, cluster_id))}


ACTION_RESPONSES = {
    202: ClusterEnvelope,
    401: ErrorOut,
    403: ErrorOut,
    404: ErrorOut,
    409: ErrorOut,
    422: ErrorOut,
}


@router.post(
    "/clusters/{cluster_id}/terminate",
    auth=needs(Scope.TERMINATE),
    response=ACTION_RESPONSES,
    summary="Terminate a cluster",
    description="Stops every machine together and ends billing for all of them now; "
    "409 `invalid_state` when the cluster has already ended.",
)
@outages.committing
def terminate_cluster(request: ApiRequest, cluster_id: int) -> Status:
    cluster = _get_cluster(request, cluster_id)
    lifecycle.terminate(cluster=cluster, user=request.user)
    return Status(202, {"data": _detail(_get_cluster(request, cluster_id))})


@router.post(
    "/clusters/{cluster_id}/retry-install",
    auth=needs(Scope.CREATE),
    response=ACTION_RESPONSES,
    summary="Retry the software install",
    description="Only for a degraded cluster; otherwise 409 `invalid_state`.",
)
@outages.committing
def retry_install(request: ApiRequest, cluster_id: int) -> Status:
    cluster = _get_cluster(request, cluster_id)
    lifecycle.retry_install(cluster=cluster)
    return Status(202, {"data": _detail(_get_cluster(request, cluster_id))})


WORKERS_REFUSALS = (
    "Refused, changing nothing: 409 `invalid_state` for a cluster that is not ready (or is "
    f"quoted), 422 `invalid_count` (at least 1, at most {MAX_NODES} machines in all), and the "
    "create's money refusals for one hour of the grown cluster (402 `insufficient_balance`, "
    "402 `budget_reached`, 403 `key_limit_exceeded`), 409 `not_enough_machines`."
)


@router.post(
    "/clusters/{cluster_id}/workers/plan",
    auth=needs_as(Scope.CREATE, "POST /api/v1/clusters/{id}/workers"),
    response={200: WorkersPlanEnvelope, **ACTION_RESPONSES, 402: ErrorOut},
    summary="Plan adding workers",
    description="Takes the body of POST /api/v1/clusters/{id}/workers and runs every check it "
    "runs, reserving nothing: what the machines add per hour, the cluster's new price per hour "
    "and a `plan_token` valid 10 minutes. " + WORKERS_REFUSALS,
)
def plan_add_workers(request: ApiRequest, cluster_id: int, payload: WorkersIn) -> dict:
    cluster = _get_cluster(request, cluster_id)
    planned = lifecycle.plan_add_workers(cluster=cluster, count=payload.count, api_key=request.auth)
    token = plans.issue_token(
        project=request.project,
        api_key=request.auth,
        body=plans.workers_body(cluster, payload.count, machines_now=planned.machines_now),
    )
    return {
        "data": {
            **planned.as_dict(),
            "plan_token": token,
            "plan_expires_at": timezone.now() + plans.PLAN_TTL,
        }
    }


@router.post(
    "/clusters/{cluster_id}/workers",
    auth=needs(Scope.CREATE),
    response={**ACTION_RESPONSES, 402: ErrorOut},
    summary="Add workers",
    description="Adds `count` machines of the cluster's type; each is billed from the moment "
    "it is up. With a `plan_token` (POST /api/v1/clusters/{id}/workers/plan), 422 "
    "`plan_mismatch` for another count, cluster, project or key and 422 `plan_expired` after "
    "10 minutes. " + WORKERS_REFUSALS,
)
@outages.committing
def add_workers(request: ApiRequest, cluster_id: int, payload: WorkersIn) -> Status:
    cluster = _get_cluster(request, cluster_id)
    if payload.plan_token is not None:
        plans.check_token(
            payload.plan_token,
            project=request.project,
            api_key=request.auth,
            body=plans.workers_body(cluster, payload.count),
            plan_path=f"POST /api/v1/clusters/{cluster.pk}/workers/plan",
        )
    lifecycle.add_workers(cluster=cluster, count=payload.count, api_key=request.auth)
    return Status(202, {"data": _detail(_get_cluster(request, cluster_id))})


@router.post(
    "/clusters/{cluster_id}/network-test",
    auth=needs(Scope.CREATE),
    response={202: NetworkTestEnvelope, 401: ErrorOut, 403: ErrorOut, 404: ErrorOut, 409: ErrorOut},
    summary="Run the network test",
    description="Measures the private network between the machines of a ready or degraded "
    "cluster: all_reduce_perf across them where nccl-tests is installed, otherwise the agent's "
    "own bandwidth test from every machine to node-0. Answers at once with the running test; "
    "the result is in `network_test` of GET /api/v1/clusters/{id}. 409 `invalid_state` for "
    "another status (or without node-0 and another machine up), 409 `network_test_running` "
    "while one runs.",
)
@outages.committing
def run_network_test(request: ApiRequest, cluster_id: int) -> Status:
    cluster = _get_cluster(request, cluster_id)
    started = lifecycle.run_network_test(cluster=cluster, user=request.user)
    return Status(202, {"data": lifecycle.network_test_report(started)})


REPLACE_REFUSALS = (
    "Refused, changing nothing: 404 `unknown_node` for a name the cluster never had, 409 "
    "`head_not_replaceable` for node-0 (the head holds /shared, the scheduler and the Ray head), "
    "409 `node_not_replaceable` for a healthy machine, 409 `replacement_in_progress`, 409 "
    "`invalid_state` for a cluster that is not ready or degraded, and the create's money "
    "refusals for one hour of the added machine (402 `insufficient_balance`, 402 "
    "`budget_reached`, 403 `key_limit_exceeded`), 409 `not_enough_machines`."
)


def _replace_body(cluster: Cluster, name: str) -> dict:
    """What a replacement's plan_token binds: the cluster and the machine."""
    return {"replace": cluster.pk, "node": name}


@router.post(
    "/clusters/{cluster_id}/nodes/{name}/replace/plan",
    auth=needs_as(Scope.CREATE, "POST /api/v1/clusters/{id}/nodes/{name}/replace"),
    response={200: ReplacePlanEnvelope, **ACTION_RESPONSES, 402: ErrorOut},
    summary="Plan replacing a machine",
    description="Runs every check of the replacement, reserving nothing, and answers what it "
    "would do and cost, with a `plan_token` valid 10 minutes. " + REPLACE_REFUSALS,
)
def plan_replace(request: ApiRequest, cluster_id: int, name: str) -> dict:
    cluster = _get_cluster(request, cluster_id)
    planned = lifecycle.plan_replace(cluster=cluster, node_name=name, api_key=request.auth)
    token = plans.issue_token(
        project=request.project, api_key=request.auth, body=_replace_body(cluster, name)
    )
    return {
        "data": {
            "cluster_id": cluster.pk,
            **planned.as_dict(),
            "plan_token": token,
            "plan_expires_at": timezone.now() + plans.PLAN_TTL,
        }
    }


@router.post(
    "/clusters/{cluster_id}/nodes/{name}/replace",
    auth=needs(Scope.CREATE),
    response={**ACTION_RESPONSES, 402: ErrorOut},
    summary="Replace a lost or unhealthy machine",
    description="A new machine of the same type takes the name and private address of a lost "
    "or unhealthy worker, passes the same steps and joins the software; the old one is "
    "released at once (an unhealthy one's billing ends now) and the new one is billed from the "
    "moment it is up. " + REPLACE_REFUSALS,
)
@outages.committing
def replace_node(
    request: ApiRequest, cluster_id: int, name: str, payload: ReplaceIn | None = None
) -> Status:
    cluster = _get_cluster(request, cluster_id)
    if payload is not None and payload.plan_token is not None:
        plans.check_token(
            payload.plan_token,
            project=request.project,
            api_key=request.auth,
            body=_replace_body(cluster, name),
            plan_path=f"POST /api/v1/clusters/{cluster.pk}/nodes/{name}/replace/plan",
        )
    new = lifecycle.replace_node(
        cluster=cluster, node_name=name, api_key=request.auth, user=request.user
    )
    audit.record(request, changes={"replaced": {"before": new.replaces_id, "after": new.pk}})
    return Status(202, {"data": _detail(_get_cluster(request, cluster_id))})


@router.patch(
    "/clusters/{cluster_id}",
    auth=needs(Scope.CREATE),
    response={
        200: ClusterEnvelope,
        401: ErrorOut,
        403: ErrorOut,
        404: ErrorOut,
        409: ErrorOut,
        422: ErrorOut,
    },
    summary="Change a cluster's repair policy",
    description="`repair_policy`: ask or auto; 409 `invalid_state` for a cluster that ended.",
)
@outages.committing
def change_cluster(request: ApiRequest, cluster_id: int, payload: ClusterChangeIn) -> dict:
    cluster = _get_cluster(request, cluster_id)
    before = cluster.repair_policy
    lifecycle.set_repair_policy(cluster=cluster, policy=payload.repair_policy, user=request.user)
    audit.record(
        request, changes={"repair_policy": {"before": before, "after": payload.repair_policy}}
    )
    return {"data": _detail(_get_cluster(request, cluster_id))}


@router.delete(
    "/clusters/{cluster_id}/machines/{name}",
    auth=needs(Scope.TERMINATE),
    response={401: ErrorOut, 403: ErrorOut, 404: ErrorOut, 405: ErrorOut},
    summary="Terminate one machine (not possible)",
    description="A cluster starts, runs and stops whole: this answers 405 `terminate_cluster`.",
)
def delete_machine(request: ApiRequest, cluster_id: int, name: str) -> None:
    cluster = _get_cluster(request, cluster_id)
    raise ApiError(
        405,
        "terminate_cluster",
        f"One machine cannot be terminated on its own: a cluster runs and stops whole. "
        f"Terminate the cluster instead: POST /api/v1/clusters/{cluster.pk}/terminate.",
    )


# --- metrics --------------------------------------------------------------------------------


class SpanOut(Schema):
    min: float | None
    mean: float | None
    max: float | None


class GpuNowOut(Schema):
    index: int
    utilization_percent: float | None
    memory_used_mib: int | None
    memory_total_mib: int | None
    temperature_c: float | None
    power_w: float | None
    power_limit_w: float | None
    sm_clock_mhz: int | None
    throttle: list[str] | None = Field(
        description="The active throttle reasons by nvidia-smi's names (gpu_idle, sw_power_cap, "
        "hw_slowdown, sw_thermal_slowdown, hw_thermal_slowdown, …); null: not read."
    )
    ecc_corrected: int | None = Field(description="Volatile corrected ECC errors.")
    ecc_uncorrected: int | None = Field(description="Volatile uncorrectable ECC errors.")
    retired_pages_pending: bool | None
    remapped_rows_pending: bool | None


class HostNowOut(Schema):
    cpu_percent: float | None
    memory_used_mib: int | None
    memory_total_mib: int | None
    disk_root_used_gib: float | None
    disk_root_total_gib: float | None
    disk_shared_used_gib: float | None
    disk_shared_total_gib: float | None
    network_rx_bytes: int | None = Field(description="Cumulative, on the private network.")
    network_tx_bytes: int | None


class GpuPointOut(Schema):
    at: datetime = Field(description="The sample's time, or its bucket's start.")
    index: int
    samples: int = Field(description="The reports the point sums up (1 for a raw sample).")
    utilization_percent: SpanOut
    memory_used_mib: SpanOut
    temperature_c: SpanOut
    power_w: SpanOut


class HostPointOut(Schema):
    at: datetime
    samples: int
    cpu_percent: SpanOut
    memory_used_mib: SpanOut
    network_rx_bytes: int | None = Field(description="The cumulative counter at the point.")
    network_tx_bytes: int | None


class NodeMetricsOut(Schema):
    name: str
    health: HealthOut
    reported_at: datetime | None = Field(
        description="Its latest report (within the last hour); null: none."
    )
    gpus: list[GpuNowOut] = Field(description="Each GPU's figures in its latest report.")
    host: HostNowOut | None = Field(description="The machine's own figures in it.")
    series: list[GpuPointOut] = Field(description="The window's points, by time, then GPU.")
    host_series: list[HostPointOut]


class MetricsOut(Schema):
    window: str = Field(description="15m, 1h, 24h or 7d.")
    start: datetime
    end: datetime
    resolution_seconds: int = Field(
        description="A point's span: a report's interval for 15m, 60 for 1h and 24h, 3600 for 7d."
    )
    idle_since: datetime | None = Field(description="As the cluster's `idle_since`.")
    idle_notice: str | None = Field(
        description="While idle, the notice the cluster page shows ('16 GPUs idle for 45 min, "
        "costing $40.00 per hour'); null otherwise. Nothing is stopped."
    )
    nodes: list[NodeMetricsOut] = Field(description="Its live machines, by index.")


class MetricsEnvelope(Schema):
    data: MetricsOut


def metrics_report(cluster: Cluster, read: metrics.Window) -> dict:
    """The metrics answer of `read`, one of `cluster`'s windows (`metrics.window`)."""
    return {
        "window": read.name,
        "start": read.start,
        "end": read.end,
        "resolution_seconds": read.resolution_seconds,
        "idle_since": cluster.idle_since,
        # The window's nodes are the live ones: the machines up that the notice prices.
        "idle_notice": idle.notice_text(cluster, nodes=[n.node for n in read.nodes]) or None,
        "nodes": [
            {
                "name": node.node.name,
                "health": health(cluster, node.node.name),
                "reported_at": node.reported_at,
                "gpus": [asdict(gpu) for gpu in node.gpus],
                "host": asdict(node.host) if node.host else None,
                "series": [asdict(point) for point in node.series],
                "host_series": [asdict(point) for point in node.host_series],
            }
            for node in read.nodes
        ],
    }


@router.get(
    "/clusters/{cluster_id}/metrics",
    auth=needs(Scope.READ),
    response={200: MetricsEnvelope, 401: ErrorOut, 403: ErrorOut, 404: ErrorOut, 422: ErrorOut},
    summary="Read a cluster's metrics",
    description="Per live machine: its health, each GPU's figures in its latest report "
    "(utilisation, memory, temperature, power, clocks, throttle reasons, ECC errors, pages "
    "pending) and its own (CPU, memory, disks, network), and the window's series (min, mean "
    "and max per point): raw reports for 15m, minutes for 1h and 24h, hours for 7d "
    "(docs/metrics.md). 422 `invalid_window` for another window.",
)
def cluster_metrics(
    request: ApiRequest,
    cluster_id: int,
    window: Annotated[
        str,
        # Said in the document, checked below: another value is `invalid_window`, naming them.
        Query(),
        WithJsonSchema(
            {
                "type": "string",
                "enum": list(metrics.WINDOWS),
                "default": "15m",
                "description": "How far back the series reach.",
            }
        ),
    ] = "15m",
) -> dict:
    if window not in metrics.WINDOWS:
        raise ApiError(
            422,
            "invalid_window",
            f"window must be one of {', '.join(metrics.WINDOWS)}, not {window[:32]!r}.",
        )
    cluster = (
        Cluster.objects.filter(project=request.project, pk=cluster_id)
        .select_related("machine_type")  # the idle notice's GPUs a machine
        .first()
    )
    if cluster is None:
        raise ApiError(404, "not_found", f"There is no cluster {cluster_id} in your project.")
    return {"data": metrics_report(cluster, metrics.window(cluster, window))}


# --- connecting -----------------------------------------------------------------------------


class SshOut(Schema):
    node: str = Field(description="Its name inside the cluster (hostfile, /etc/hosts): node-i.")
    hosts: list[str] = Field(
        description="Its names in ssh_config, on your computer: NAME-node-i, and NAME first "
        "for the head; never a bare node-i, so two clusters' configs never collide."
    )
    role: str = Field(description="head (node-0) or worker.")
    private_ip: str
    address: str | None = Field(description="Its public address; null behind a gateway.")
    command: str | None = Field(description="null while the node has no address yet.")


class HostfileOut(Schema):
    path: str = Field(description="/shared/hostfile, or /etc/runcrate/hostfile on containers.")
    content: str


class NodeEnvironmentOut(Schema):
    node: str
    variables: dict[str, str]


class VolumeMountOut(Schema):
    name: str
    path: str
    node: str


class StorageOut(Schema):
    shared: str | None = Field(description="/shared on VMs and bare metal; null on containers.")
    hostfile_path: str
    volume: VolumeMountOut | None
    summary: str


class ConnectOut(Schema):
    cluster_id: int
    status: str
    simulated: bool = Field(
        description="True for the simulated data center's machines (the demo): nothing answers "
        "on their addresses, so they cannot be logged into; the CLI's `ssh` refuses them."
    )
    ssh_user: str
    gateway: str | None = Field(description="host:port of the location's SSH gateway, or null.")
    ssh: list[SshOut]
    ssh_config: str = Field(
        description="An OpenSSH config with a Host entry per node, named as `ssh[].hosts`."
    )
    ssh_names: str = Field(description="How the config names the machines, in a sentence.")
    known_hosts: str = Field(
        description="known_hosts lines for the machines' pinned host keys (under each node's "
        "HostKeyAlias) and the gateway's; empty where none is pinned."
    )
    hostfile: HostfileOut
    commands: dict[str, str] = Field(description="torchrun, mpirun, deepspeed, nccl_test.")
    bandwidth: str
    environment: list[NodeEnvironmentOut]
    storage: StorageOut
    software: dict[str, str | None] | None = Field(
        description="Slurm examples, Kubernetes (api_server, kubeconfig, gpu_pod) or Ray "
        "(head_address, job_submit…), by software; null with none."
    )


class ConnectEnvelope(Schema):
    data: ConnectOut


def _get_connectable(request: ApiRequest, cluster_id: int) -> Cluster:
    """The project's cluster with what its connection details read, while its machines are up
    (installing, ready or degraded); 404 or 409 otherwise."""
    cluster = (
        Cluster.objects.filter(project=request.project, pk=cluster_id)
        .select_related("machine_type__location")
        # the hosts ride on the nodes' query: whether the machines are simulated
        .prefetch_related(Prefetch("nodes", Node.objects.select_related("host")), "volumes")
        .first()
    )
    if cluster is None:
        raise ApiError(404, "not_found", f"There is no cluster {cluster_id} in your project.")
    if cluster.status not in Cluster.BILLED:
        raise ApiError(
            409,
            "invalid_state",
            f"This cluster is {cluster.status}: connection details exist while its machines are "
            "up (installing, ready or degraded).",
        )
    return cluster


@router.get(
    "/clusters/{cluster_id}/connect",
    auth=needs(Scope.READ),
    response={200: ConnectEnvelope, 401: ErrorOut, 403: ErrorOut, 404: ErrorOut, 409: ErrorOut},
    summary="How to connect and run",
    description="SSH per machine, the SSH config, the hostfile, the launch commands, each "
    "machine's environment, shared storage and the software's examples (the kubeconfig for "
    "Kubernetes), as on the cluster page. 409 `invalid_state` while the machines are not up.",
)
def cluster_connect(request: ApiRequest, cluster_id: int) -> dict:
    cluster = _get_connectable(request, cluster_id)
    shape = connect.shape_for(cluster)
    return {
        "data": {
            "cluster_id": cluster.pk,
            "status": cluster.status,
            "simulated": cluster.runs_simulated(),
            **connect.details(shape),
        }
    }


# --- volumes ---------------------------------------------------------------------------------


class AttachedOut(Schema):
    id: int
    name: str


class VolumeOut(Schema):
    id: int
    name: str
    location: str = Field(description="The location's code.")
    size_gb: int
    price_per_gb_month: str
    price_per_month: str = Field(description="USD per 30-day month, for the whole volume.")
    created_at: datetime
    attached_to: AttachedOut | None = Field(description="The cluster it is attached to.")


class VolumeEnvelope(Schema):
    data: VolumeOut


class VolumeList(Schema):
    data: list[VolumeOut]
    meta: ListMeta


class VolumeIn(Schema):
    name: str = Field(
        description="A DNS label, unique among the project's volumes.",
        json_schema_extra=NAME_SCHEMA,
    )
    location: str = Field(description="A location's code, e.g. us-east-2.")
    size_gb: int = Field(
        description=f"{Volume.MIN_GB} to {Volume.MAX_GB} GB.",
        json_schema_extra={"minimum": Volume.MIN_GB, "maximum": Volume.MAX_GB},
    )


def _volume(volume: Volume) -> dict:
    return {
        "id": volume.pk,
        "name": volume.name,
        "location": volume.location.code,
        "size_gb": volume.size_gb,
        "price_per_gb_month": volumes.rate(volume.price_per_gb_month),
        "price_per_month": money_str(volume.price_per_month),
        "created_at": volume.created_at,
        "attached_to": (
            {"id": volume.cluster.pk, "name": volume.cluster.name} if volume.cluster else None
        ),
    }


@router.get(
    "/volumes",
    auth=needs(Scope.READ),
    response={200: VolumeList, 401: ErrorOut, 403: ErrorOut},
    summary="List volumes",
)
def list_volumes(
    request: ApiRequest,
    limit: Annotated[int, Query(ge=1, le=200)] = 50,
    offset: Offset = 0,
) -> dict:
    """The project's volumes (deleted ones are gone), by name."""
    queryset = volumes.live_volumes(request.project)
    return paginated(queryset, limit=limit, offset=offset, render=_volume)


@router.post(
    "/volumes",
    auth=needs(Scope.CREATE),
    response={201: VolumeEnvelope, 401: ErrorOut, 403: ErrorOut, 409: ErrorOut, 422: ErrorOut},
    summary="Create a volume",
    description="Billed per GB-month from now, attached or not. Refusals: 422 `invalid_name`, "
    "409 `name_taken`, 422 `unknown_location`, 422 `location_cannot_attach` (no offer there can "
    "attach a volume), 422 `invalid_size`.",
)
@outages.committing
def create_volume(request: ApiRequest, payload: VolumeIn) -> Status:
    volume = volumes.create_volume(
        project=request.project,
        name=payload.name,
        location=payload.location,
        size_gb=payload.size_gb,
    )
    return Status(201, {"data": _volume(volume)})


@router.delete(
    "/volumes/{volume_id}",
    auth=needs(Scope.TERMINATE),
    response={204: None, 401: ErrorOut, 403: ErrorOut, 404: ErrorOut, 409: ErrorOut},
    summary="Delete a volume",
    description="Deletes it and its files, and ends its billing; 409 `volume_in_use` while it "
    "is attached to a cluster.",
)
@outages.committing
def delete_volume(request: ApiRequest, volume_id: int) -> Status:
    volume = volumes.live_volumes(request.project).filter(pk=volume_id).first()
    if volume is None:
        raise ApiError(404, "not_found", f"There is no volume {volume_id} in your project.")
    volumes.delete_volume(volume=volume)
    return Status(204, None)
