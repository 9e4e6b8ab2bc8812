"""`runcrate mcp`: the MCP server (the official `mcp` SDK's MCPServer, formerly FastMCP), so an
AI agent can plan, create, wait for and terminate clusters through the same API (docs/mcp.md).

Spending needs two calls. `plan_cluster` asks the server (`POST /api/v1/clusters/plan`), which
runs every check the create runs and answers either the create's own refusal or the plan: the
price, the hours the balance covers beside what already runs, the time to ready, what the
network suits, and a `plan_token` signed with the server's secret. `create_cluster` requires
that token and sends it with the create, which the server refuses for any other body
(`plan_mismatch`) or after ten minutes (`plan_expired`). Since the server signs and checks the
token, a token from one `runcrate mcp` process creates through another (a client that starts a
process per call, a restart, a second replica). Replacing a lost or unhealthy worker goes the
same way: `plan_replace_node` answers the server's plan with its token, `replace_node` requires it;
and adding workers: `plan_add_workers`, then `add_workers` with its token.

Every tool answers compact JSON and the same object as `structuredContent`, described by its
output schema. Every API refusal comes back as a tool error (`isError`) whose text is
"code: message" and whose structured content is `{"error": {"code", "message", "status"}}`.

The waiting tools (`wait_for_cluster`, `run_network_test`) are coroutines: each poll runs the
client in a worker thread of their own limiter, abandoned the moment the caller cancels, so a
wait holds no thread between polls, stops polling when cancelled and never delays another
call. The other tools are plain functions, which the SDK runs in worker threads too.
"""

from __future__ import annotations

import hashlib
import importlib.metadata
import json
import os
import sys
from collections.abc import Callable
from dataclasses import dataclass
from typing import Annotated, Any, Literal, TypeVar

import anyio
import anyio.to_thread
from mcp.server import MCPServer
from mcp.server.mcpserver import Context
from mcp.types import CallToolResult, TextContent, ToolAnnotations
from pydantic import BaseModel, ConfigDict, Field

from runcrate_cli import config
from runcrate_cli.client import (
    ApiClient,
    ApiError,
    is_settled,
    poll_seconds,
    utilization_summary,
)

PACKAGE = "runcrate-clusters-cli"
# A self-serve cluster's size; larger ones are quoted (request_quote on the dashboard).
MIN_NODES = 2
MAX_NODES = 64
# One wait answers within this, so no client's request timeout (often 60 s) is reached while a
# cluster boots for 7-15 minutes: the agent calls again.
MAX_WAIT_SECONDS = 50
# How many polls of all open waits may be in flight at once, in threads of their own: never the
# threads the SDK runs the other tools in.
WAIT_POLL_THREADS = 16
# A machine's steps in order (clusters.models.STEP_NAMES on the server).
STEPS = ("running", "agent", "network", "install", "done")
Software = Literal["none", "slurm", "kubernetes", "ray"]
# Who replaces a lost or unhealthy worker (the API's `repair_policy`).
RepairPolicy = Literal["ask", "auto"]
# The metrics' windows (GET /api/v1/clusters/{id}/metrics: the server's
# clusters.telemetry.metrics.WINDOWS).
MetricsWindow = Literal["15m", "1h", "24h", "7d"]

# The network test's verdict. The server says what Ethernet is expected to give (its `expected`
# sentence: about 1-2 Gbit/s between machines, which all_reduce_perf reports as a bus bandwidth
# of roughly 0.1-0.25 GB/s across nodes) but sets no threshold, so the verdict is this one rule:
# the lower end of that range, passed when the test reached it.
INSTRUCTIONS = (
    "Runcrate rents 2 to 64 GPU machines as one cluster, billed per second. To create one: "
    "list_gpus, list_offers(gpu, nodes), list_ssh_keys (add_ssh_key if there is none), "
    "plan_cluster (the server's price and checks, and a plan_token; show the price to the "
    "user), create_cluster with the same arguments and that token, wait_for_cluster (call it "
    "again while it says so), get_connect_info. terminate_cluster ends billing. A lost or "
    "unhealthy worker (get_cluster's machines) is replaced the same way: plan_replace_node "
    "(its price and a plan_token; show it to the user), then replace_node with that token. "
    "Workers are added the same way: plan_add_workers (what they add per hour, the new total "
    "and a plan_token; show them to the user), then add_workers with that token. "
    "Every call that fails returns the API's error code and message."
)

ClusterRef = Annotated[int | str, Field(description="The cluster's id (a number) or its name.")]
Nodes = Annotated[int, Field(description="How many machines: 2 to 64.", ge=MIN_NODES, le=MAX_NODES)]
Name = Annotated[
    str, Field(description="The cluster's name: a DNS label (a-z, 0-9, -).", min_length=1)
]
OfferId = Annotated[str, Field(description="An offer's id, from list_offers.", min_length=1)]
SoftwareArg = Annotated[
    Software, Field(description="What to install on the machines: none, slurm, kubernetes or ray.")
]
SshKeyIds = Annotated[
    list[int] | None,
    Field(
        description="The project's SSH keys to install (ids from list_ssh_keys); none for the "
        "key owner's own keys and the project's shared ones.",
        min_length=1,
    ),
]
VolumeId = Annotated[int | None, Field(description="A volume to attach (list_volumes), or none.")]
Environment = Annotated[str, Field(description="The environment's name.", min_length=1)]
RepairPolicyArg = Annotated[
    RepairPolicy,
    Field(
        description="Who replaces a lost or unhealthy worker: ask (the user, through "
        "replace_node) or auto (the product, by itself)."
    ),
]
NodeName = Annotated[
    str,
    Field(
        description="The worker to replace, as get_cluster's machines name it: node-1 … "
        "node-N-1 (never node-0, the head).",
        min_length=1,
    ),
]
WorkerCount = Annotated[
    int,
    Field(
        description=f"How many machines to add: the cluster stays at most {MAX_NODES}.",
        ge=1,
        le=MAX_NODES - MIN_NODES,
    ),
]
WaitSeconds = Annotated[
    float,
    Field(
        description=f"Answer after at most this many seconds (at most {MAX_WAIT_SECONDS}); call "
        "again to go on waiting.",
        gt=0,
        le=MAX_WAIT_SECONDS,
    ),
]


def hints(*, read_only: bool, destructive: bool = False, idempotent: bool) -> ToolAnnotations:
    """What a tool does, for the client to decide what to confirm. None reaches beyond the
    caller's own Runcrate project (a closed world), whatever it costs."""
    return ToolAnnotations(
        read_only_hint=read_only,
        destructive_hint=destructive,
        idempotent_hint=idempotent,
        open_world_hint=False,
    )


READS = hints(read_only=True, idempotent=True)


# --- what the tools answer (their output schemas) -----------------------------------------------


class ApiObject(BaseModel):
    """An object of the API as it gives it (docs/api.md): the fields named here, and others."""

    model_config = ConfigDict(extra="allow")


class Gpu(ApiObject):
    slug: str
    name: str


class MachineSpecs(ApiObject):
    vcpus: int | None = Field(default=None, description="vCPUs per machine.")
    memory_gib: int | None = Field(default=None, description="Memory (RAM) per machine, GiB.")
    nvme_gib: int | None = Field(default=None, description="Local NVMe per machine, GiB.")
    gpu_link: str | None = Field(
        default=None, description="The GPU link inside the machine: nvlink, nvswitch or pcie."
    )
    os_image: str | None = None
    driver_version: str | None = Field(
        default=None, description="The NVIDIA driver each node has, or a newer one."
    )
    cuda_version: str | None = None
    summary: str = Field(
        default="", description="The figures in words, as the dashboard shows them."
    )


class Offer(ApiObject):
    id: str = Field(description="Pass it as offer_id to plan_cluster.")
    gpu: str
    specs: MachineSpecs | None = Field(
        default=None,
        description="What each machine is sold with (vCPUs, memory, NVMe, GPU link, OS image, "
        "driver, CUDA); a figure the operator does not state is null.",
    )
    price_per_hour: str = Field(description="The whole cluster, USD per hour.")
    machine_price_per_hour: str
    availability: str = Field(description="available, not_in_stock or reserved_ahead.")
    software: list[str]


class Machine(ApiObject):
    name: str
    step: str = Field(description="running, agent, network, install or done.")
    status: str = Field(description="starting, joined, failed, ended or lost.")
    drained: str | None = Field(
        default=None,
        description="Why it was taken out of its software's scheduling; null while it takes jobs.",
    )
    replaces: int | None = Field(
        default=None, description="The id of the machine it replaced (which had its name)."
    )
    replaced_by: int | None = Field(
        default=None, description="The id of the machine that replaced it under its name."
    )
    cost: str | None = Field(
        default=None, description="What this machine cost so far, USD; they add up to cost_so_far."
    )


class NetworkTest(ApiObject):
    state: str = Field(description="running, done or failed.")
    verdict: str | None = Field(
        description="'passed' or 'below what Ethernet should give' once done (the server's "
        "verdict, by verdict_rule); null while it runs or when it failed before measuring."
    )
    verdict_rule: str


class ClusterSummary(ApiObject):
    id: int
    name: str
    status: str = Field(
        description="provisioning, installing, ready, degraded, failed, terminating, "
        "terminated or stopped."
    )
    running: bool = Field(
        default=False, description="Ready or degraded, as the server decides: display it."
    )
    can_terminate: bool = Field(
        default=False, description="Whether it may be terminated now (the dashboard's rule)."
    )
    nodes: int
    price_per_hour: str
    repair_policy: str | None = Field(
        default=None,
        description="ask: a lost or unhealthy worker is replaced when the user says so "
        "(replace_node); auto: automatically.",
    )
    machines: list[Machine]
    cost_so_far: str | None = Field(
        default=None,
        description="What the cluster cost so far, USD, as the dashboard and the CLI show it.",
    )
    final_cost: str | None = Field(
        default=None, description="Its final cost, USD, once its machines are gone; else null."
    )
    billed_for: str | None = Field(default=None, description="How long it was billed: '2 h 3 min'.")


class Cluster(ClusterSummary):
    network_test: NetworkTest | None = None


class ErrorBody(BaseModel):
    code: str
    message: str
    status: int | None


class Plan(ApiObject):
    offer_id: str
    nodes: int
    name: str
    specs: MachineSpecs | None = Field(default=None, description="What each machine has.")
    price_per_hour: str = Field(description="The whole cluster, USD per hour.")
    plan_token: str = Field(description="Give it to create_cluster with the same arguments.")
    plan_expires_at: str


class ReplacePlan(ApiObject):
    cluster_id: int
    node: str = Field(description="The machine replaced; the new one takes its name.")
    private_ip: str = Field(description="Its private address, which the new machine keeps.")
    why: str = Field(description="Why it may be replaced: lost, or its health problems.")
    price_per_hour: str = Field(description="The new machine, USD per hour, billed once up.")
    cluster_price_per_hour: str = Field(description="The whole cluster once it is up.")
    billing: str = Field(description="What the replacement does to the bill, in words.")
    plan_token: str = Field(description="Give it to replace_node for the same machine.")
    plan_expires_at: str


class WorkersPlan(ApiObject):
    cluster_id: int
    name: str
    count: int = Field(description="The machines added.")
    machine_price_per_hour: str = Field(description="One machine of the cluster, USD per hour.")
    added_price_per_hour: str = Field(description="What they add: count × the machine price.")
    machines_now: int
    price_per_hour: str = Field(description="The whole cluster now, USD per hour.")
    machines_after: int
    new_price_per_hour: str = Field(description="The whole cluster once they are up.")
    billing: str = Field(description="What adding them does to the bill, in words.")
    plan_token: str = Field(description="Give it to add_workers with the same count.")
    plan_expires_at: str


class SshKey(ApiObject):
    id: int
    name: str
    fingerprint: str


class GpusAnswer(BaseModel):
    gpus: list[Gpu]


class OffersAnswer(BaseModel):
    offers: list[Offer]


class PlanAnswer(BaseModel):
    can_create: bool = Field(description="Whether create_cluster would succeed now.")
    plan: Plan | None = Field(None, description="The server's plan, when it can create.")
    error: ErrorBody | None = Field(
        None, description="The refusal the create would get (its code and message), when not."
    )


class ReplacePlanAnswer(BaseModel):
    can_replace: bool = Field(description="Whether replace_node would succeed now.")
    plan: ReplacePlan | None = Field(None, description="The server's plan, when it can.")
    error: ErrorBody | None = Field(
        None,
        description="The refusal the replacement would get (its code and message), when not.",
    )


class WorkersPlanAnswer(BaseModel):
    can_add: bool = Field(description="Whether add_workers would succeed now.")
    plan: WorkersPlan | None = Field(None, description="The server's plan, when it can.")
    error: ErrorBody | None = Field(
        None, description="The refusal adding them would get (its code and message), when not."
    )


class ClusterAnswer(BaseModel):
    cluster: Cluster


class ClustersAnswer(BaseModel):
    clusters: list[ClusterSummary]


class WaitAnswer(BaseModel):
    cluster: Cluster | None = Field(description="Its last state; null if the API never answered.")
    status: str | None
    settled: bool = Field(description="Ready, degraded or ended: nothing more happens alone.")
    ready: bool
    message: str = Field(description="Where it stands and, when not settled, to call again.")


class Health(BaseModel):
    status: str = Field(description="healthy, or unhealthy while problems lists any.")
    problems: list[str] = Field(description="Each open problem, naming the GPU and what.")


class GpuFigures(ApiObject):
    """A GPU's figures in its node's latest report, as the API gives them (throttle reasons,
    ECC errors, clocks and pages pending too); null where the driver could not say."""

    index: int
    utilization_percent: float | None
    memory_used_mib: int | None
    memory_total_mib: int | None
    temperature_c: float | None
    power_w: float | None


class UtilizationSummary(BaseModel):
    min: float | None
    mean: float | None = Field(description="Weighted by the samples of each point.")
    max: float | None
    samples: int = Field(description="The GPU samples the window holds for the node.")


class NodeMetrics(BaseModel):
    name: str
    health: Health
    reported_at: str | None = Field(description="Its latest report; null: none in the hour.")
    gpus: list[GpuFigures]
    host: ApiObject | None = Field(description="Its CPU, memory, disks and network counters.")
    utilization: UtilizationSummary = Field(
        description="Its GPUs' utilisation over the window, all GPUs together."
    )


class MetricsAnswer(BaseModel):
    cluster_id: int
    window: str
    start: str
    end: str
    idle_since: str | None = Field(description="Every GPU idle since then (a notice), or null.")
    idle_notice: str | None = Field(description="The idle notice's words, or null.")
    nodes: list[NodeMetrics]
    message: str = Field(description="The nodes' health and utilisation in a sentence.")


class ConnectAnswer(BaseModel):
    connect: ApiObject


class NetworkTestAnswer(BaseModel):
    network_test: NetworkTest
    finished: bool = Field(description="False while it still runs: read get_cluster later.")
    message: str


class VolumesAnswer(BaseModel):
    volumes: list[ApiObject]


class BalanceAnswer(BaseModel):
    balance: ApiObject


class SshKeysAnswer(BaseModel):
    ssh_keys: list[SshKey]


class SshKeyAnswer(BaseModel):
    ssh_key: SshKey


# --- small rules ----------------------------------------------------------------------------------


def package_version() -> str:
    try:
        return importlib.metadata.version(PACKAGE)
    except importlib.metadata.PackageNotFoundError:  # run from a checkout never installed
        return "0+unknown"


def compact(data: Any) -> str:
    return json.dumps(data, separators=(",", ":"), ensure_ascii=False)


def answer(data: dict[str, Any]) -> CallToolResult:
    """A tool's answer: the object as structured content, and as compact JSON for a client
    that reads only text."""
    return CallToolResult(
        content=[TextContent(type="text", text=compact(data))], structured_content=data
    )


def tool_error(code: str, message: str, status: int | None = None) -> CallToolResult:
    return CallToolResult(
        content=[TextContent(type="text", text=f"{code}: {message}")],
        structured_content={"error": {"code": code, "message": message, "status": status}},
        is_error=True,
    )


def shown(cluster: dict[str, Any], *, events: bool = False) -> dict[str, Any]:
    """A cluster as the tools answer it: its events only when asked (they are most of its
    size). Its network test carries the server's verdict."""
    return {k: v for k, v in cluster.items() if events or k != "events"}


def progress(cluster: dict[str, Any]) -> tuple[float, int, str]:
    """How far a cluster's machines are, in machines (each machine's steps done over its
    steps), its size, and a sentence: machines up out of the size and the current step, the
    step of the machine furthest behind."""
    # A machine that was replaced is no longer one of the cluster's: its replacement, under
    # its name, is.
    machines = [m for m in cluster.get("machines") or [] if not m.get("replaced_by")]
    size = len(machines) or int(cluster.get("nodes") or 0)
    steps = [STEPS.index(m["step"]) if m.get("step") in STEPS else 0 for m in machines]
    done = sum(steps) / (len(STEPS) - 1)
    up = sum(1 for m in machines if m.get("status") == "joined")
    sentence = f"{cluster['status']}: {up} of {size} machines up"
    if steps and min(steps) < len(STEPS) - 1:
        sentence += f", step {STEPS[min(steps)]}"
    return done, size, sentence


def metrics_summary(cluster_id: int, data: dict[str, Any]) -> dict[str, Any]:
    """The metrics answer, kept small for a model's context: each node's latest figures and
    health, and its window in three numbers instead of every point."""
    nodes = [
        {
            "name": node["name"],
            "health": node["health"],
            "reported_at": node["reported_at"],
            "gpus": node["gpus"],
            "host": node["host"],
            "utilization": utilization_summary(node["series"]),
        }
        for node in data["nodes"]
    ]
    unhealthy = [n["name"] for n in nodes if n["health"]["status"] != "healthy"]
    silent = [n["name"] for n in nodes if n["reported_at"] is None]
    means = [n["utilization"]["mean"] for n in nodes if n["utilization"]["mean"] is not None]
    parts = [f"{len(nodes)} live nodes"]
    if means:
        parts.append(f"mean GPU utilisation {sum(means) / len(means):.0f}% over {data['window']}")
    parts.append(f"unhealthy: {', '.join(unhealthy)}" if unhealthy else "all healthy")
    if silent:
        parts.append(f"no report yet from {', '.join(silent)}")
    if data.get("idle_since"):
        notice = data.get("idle_notice") or f"every GPU idle since {data['idle_since']}"
        parts.append(f"{notice} (nothing is stopped)")
    return {
        "cluster_id": cluster_id,
        "window": data["window"],
        "start": data["start"],
        "end": data["end"],
        "idle_since": data["idle_since"],
        "idle_notice": data.get("idle_notice"),
        "nodes": nodes,
        "message": "; ".join(parts) + ".",
    }


def _seconds(value: float) -> str:
    return f"{value:g} s"


# --- who the tools call the API as ---------------------------------------------------------------


@dataclass(frozen=True)
class Caller:
    """How the tools reach the API: its URL, the key the server was started with, why the
    config file could not be read (`config_problem`, which every tool answers as `bad_config`
    when no key came from elsewhere), and the threads the waits poll in."""

    api_url: str
    api_key: str | None
    config_problem: str | None
    wait_threads: anyio.CapacityLimiter

    def key_for(self, ctx: Context | None) -> str | None:
        """Over HTTP a caller may send its own key (`Authorization: Bearer rc_…`); otherwise
        the key the server was started with."""
        headers = ctx.headers if ctx is not None else None
        if headers:
            value = headers.get("authorization") or headers.get("Authorization") or ""
            scheme, _, token = value.partition(" ")
            if scheme.lower() == "bearer" and token.strip():
                return token.strip()
        return self.api_key

    def client_for(self, ctx: Context) -> ApiClient:
        key = self.key_for(ctx)
        if key is None and self.config_problem is not None:
            raise ApiError("bad_config", self.config_problem)
        # The audit log tells the MCP's calls from the CLI's by this (docs/audit.md).
        return ApiClient(api_url=self.api_url, api_key=key, user_agent="runcrate-mcp/1")

    def call(self, ctx: Context, work: Callable[[ApiClient], dict[str, Any]]) -> CallToolResult:
        try:
            with self.client_for(ctx) as client:
                return answer(work(client))
        except ApiError as error:
            return tool_error(error.code, error.message, error.status)


class RuncrateServer(MCPServer[Any]):
    """The MCP server, holding who its tools call the API as: a tool reads it from its
    context (`caller`)."""

    def __init__(self, caller: Caller) -> None:
        super().__init__(
            "runcrate", instructions=INSTRUCTIONS, version=package_version(), log_level="WARNING"
        )
        self.caller = caller


def caller(ctx: Context) -> Caller:
    """Who the tool answering `ctx` calls the API as: its server's caller."""
    server = ctx.mcp_server
    assert isinstance(server, RuncrateServer)  # every tool is registered by build_server
    return server.caller


def call(ctx: Context, work: Callable[[ApiClient], dict[str, Any]]) -> CallToolResult:
    """Run `work` with a client for the caller of `ctx`: its answer, or the API's refusal as a
    tool error."""
    return caller(ctx).call(ctx, work)


def planned(flag: str, plan: Callable[[], dict[str, Any]]) -> dict[str, Any]:
    """A plan tool's answer: `{flag: true, "plan": …}`, or the refusal the action would get as
    `{flag: false, "error": …}`. No answer at all (unreachable, a timeout) says nothing about
    the action: it stays a tool error."""
    try:
        return {flag: True, "plan": plan()}
    except ApiError as refusal:
        if refusal.status is None:
            raise
        return {flag: False, "error": refusal.as_dict()}


async def in_thread(work: Callable[[], Any], *, limiter: anyio.CapacityLimiter | None) -> Any:
    # Abandoned on cancel: the caller's cancellation returns at once, and the one request
    # in flight, if any, is the last.
    return await anyio.to_thread.run_sync(work, abandon_on_cancel=True, limiter=limiter)


@dataclass(frozen=True)
class ToolSpec:
    """A tool as the client sees it beside its arguments: its title, hints and description."""

    function: Callable[..., Any]
    title: str
    annotations: ToolAnnotations
    description: str


# Every tool, in the order the server lists them.
TOOLS: list[ToolSpec] = []

ToolFunction = TypeVar("ToolFunction", bound=Callable[..., Any])


def tool(
    *, title: str, annotations: ToolAnnotations, description: str
) -> Callable[[ToolFunction], ToolFunction]:
    """Add the function below to the tools every server offers (`build_server`)."""

    def register(function: ToolFunction) -> ToolFunction:
        TOOLS.append(ToolSpec(function, title, annotations, description))
        return function

    return register


# --- the tools ------------------------------------------------------------------------------------

# --- reading: free ---------------------------------------------------------------------------


@tool(
    title="List GPU models",
    annotations=READS,
    description="List GPU models with the lowest machine price (USD/hour) and the GPU "
    "counts on offer. Free: reads the catalog, creates nothing.",
)
def list_gpus(
    ctx: Context,
    include_community: Annotated[
        bool, Field(description="Also count independent operators' (community) hosts.")
    ] = False,
) -> Annotated[CallToolResult, GpusAnswer]:
    return call(ctx, lambda c: {"gpus": c.gpus(include_community=include_community)})


@tool(
    title="List offers",
    annotations=READS,
    description="List the offers that can start `nodes` machines of `gpu` now, best first, "
    "with the price per machine, per GPU-hour and for the whole cluster (USD/hour), free "
    "machines, the track record, the software each offers and what each machine has (specs: "
    "vCPUs, memory, local NVMe, GPU link, OS image, driver and CUDA versions). Free: creates "
    "nothing.",
)
def list_offers(
    ctx: Context,
    gpu: Annotated[
        str, Field(description="A GPU's slug, from list_gpus (e.g. h100-sxm).", min_length=1)
    ],
    nodes: Nodes,
    include_community: Annotated[
        bool,
        Field(description="Also list community hosts (independent operators: no secrets)."),
    ] = False,
) -> Annotated[CallToolResult, OffersAnswer]:
    return call(
        ctx,
        lambda c: {"offers": c.offers(gpu=gpu, nodes=nodes, include_community=include_community)},
    )


@tool(
    title="Plan a cluster",
    annotations=READS,
    description="Ask the server what creating this cluster would do, with every check the "
    "create runs (balance beside what already runs, the key's scopes and limits, the name, "
    "the environment, the budget, capacity, software, volume) and nothing reserved. "
    "can_create true: the plan (price per hour of the whole cluster, per machine and per "
    "GPU-hour, GPUs in all, hours the balance covers, estimated time to ready, the offer's "
    "track record, what its Ethernet network suits, the repair policy) and a plan_token "
    "valid 10 minutes, "
    "which create_cluster needs with exactly these arguments. can_create false: the "
    "refusal the create would get. Free. Show the price to the user before creating.",
)
def plan_cluster(
    ctx: Context,
    offer_id: OfferId,
    nodes: Nodes,
    name: Name,
    software: SoftwareArg = "none",
    ssh_key_ids: SshKeyIds = None,
    volume_id: VolumeId = None,
    environment: Environment = "default",
    repair_policy: RepairPolicyArg = "ask",
) -> Annotated[CallToolResult, PlanAnswer]:
    body = ApiClient.cluster_body(
        offer_id=offer_id,
        nodes=nodes,
        name=name,
        software=software,
        ssh_key_ids=ssh_key_ids,
        volume_id=volume_id,
        environment=environment,
        repair_policy=repair_policy,
    )

    return call(ctx, lambda c: planned("can_create", lambda: c.plan_cluster(body)))


@tool(
    title="Create a cluster (costs money)",
    annotations=hints(read_only=False, idempotent=True),
    description="Create the planned cluster. COSTS MONEY: creates machines billed per "
    "second at the plan's price (price_per_hour for the whole cluster) from the moment "
    "every machine joined until terminate_cluster. Needs the plan_token plan_cluster "
    "gave, with exactly the planned arguments: the server refuses another body "
    "(plan_mismatch) or a plan older than 10 minutes (plan_expired). Calling again with "
    "the same token returns the same cluster, never a second one. Returns at once with "
    "the cluster provisioning: call wait_for_cluster.",
)
def create_cluster(
    ctx: Context,
    offer_id: OfferId,
    nodes: Nodes,
    name: Name,
    plan_token: Annotated[
        str, Field(description="The plan_token plan_cluster returned.", min_length=1)
    ],
    software: SoftwareArg = "none",
    ssh_key_ids: SshKeyIds = None,
    volume_id: VolumeId = None,
    environment: Environment = "default",
    repair_policy: RepairPolicyArg = "ask",
) -> Annotated[CallToolResult, ClusterAnswer]:
    # One plan, one cluster: a create retried with the same token (after a timeout, say)
    # gets the cluster the first one made. The server binds the token to its body, so the
    # token's digest is the plan's one key.
    digest = hashlib.sha256(plan_token.encode()).hexdigest()

    def create(client: ApiClient) -> dict[str, Any]:
        cluster = client.create_cluster(
            offer_id=offer_id,
            nodes=nodes,
            name=name,
            software=software,
            ssh_key_ids=ssh_key_ids,
            volume_id=volume_id,
            environment=environment,
            repair_policy=repair_policy,
            plan_token=plan_token,
            idempotency_key=f"mcp-plan-{digest}",
        )
        return {"cluster": shown(cluster)}

    return call(ctx, create)


@tool(
    title="List clusters",
    annotations=READS,
    description="List the project's clusters, newest first (status, size, price per "
    "hour, machines). Free.",
)
def list_clusters(ctx: Context) -> Annotated[CallToolResult, ClustersAnswer]:
    return call(ctx, lambda c: {"clusters": c.clusters()})


@tool(
    title="Read a cluster",
    annotations=READS,
    description="Read a cluster: status, failure (node, step, message), machines (each "
    "with its cost), its cost so far (final_cost once ended, the dashboard's figure), "
    "acceptance report and the last network test with its verdict; its events (every "
    "transition, oldest first) only with events=true. Free.",
)
def get_cluster(
    ctx: Context,
    cluster: ClusterRef,
    events: Annotated[
        bool, Field(description="Also give the cluster's events (its whole history).")
    ] = False,
) -> Annotated[CallToolResult, ClusterAnswer]:
    return call(
        ctx,
        lambda c: {"cluster": shown(c.cluster(c.resolve_cluster(cluster)), events=events)},
    )


@tool(
    title="Wait for a cluster",
    annotations=READS,
    description="Wait until a cluster is ready or degraded with no machine still starting, "
    "or ended (failed, terminated, stopped), for at most timeout_seconds (at most "
    f"{MAX_WAIT_SECONDS}), sending progress (machines up out of the size, the current "
    "step). A boot takes minutes: when it answers 'still <status>, call again', call it "
    "again. Free, but a cluster that is up is billed while you wait.",
)
async def wait_for_cluster(
    ctx: Context,
    cluster: ClusterRef,
    timeout_seconds: WaitSeconds = MAX_WAIT_SECONDS,
) -> Annotated[CallToolResult, WaitAnswer]:
    try:
        client = caller(ctx).client_for(ctx)
    except ApiError as error:
        return tool_error(error.code, error.message, error.status)
    wait = Wait()
    try:
        with anyio.move_on_after(timeout_seconds):
            return answer(await wait.until_settled(ctx, client, cluster))
    except ApiError as error:
        return tool_error(error.code, error.message, error.status)
    finally:
        client.close()
    return answer(wait.unsettled(timeout_seconds))


@dataclass
class Wait:
    """One wait_for_cluster: the cluster as last read, the last poll's transient failure if it
    failed, and the progress last reported."""

    last: dict[str, Any] | None = None
    lost: ApiError | None = None
    reported: float = -1.0

    async def until_settled(
        self, ctx: Context, client: ApiClient, cluster: int | str
    ) -> dict[str, Any]:
        """Poll the cluster, reporting progress, until it is settled: the answer then."""
        wait_threads = caller(ctx).wait_threads
        cluster_id = await in_thread(lambda: client.resolve_cluster(cluster), limiter=None)
        while True:
            try:
                last = await in_thread(lambda: client.cluster(cluster_id), limiter=wait_threads)
            except ApiError as error:
                if not error.transient:
                    raise
                # A blip of the API (a restart, a proxy's 503): the cluster goes on,
                # and so does the wait, within its bound.
                self.lost = error
                await anyio.sleep(poll_seconds())
                continue
            self.last, self.lost = last, None
            done, size, sentence = progress(last)
            # Progress only ever grows (the protocol's rule): a step back is not sent.
            if done > self.reported:
                await ctx.report_progress(done, size, sentence)
                self.reported = done
            if is_settled(last):
                return {
                    "cluster": shown(last),
                    "status": last["status"],
                    "settled": True,
                    "ready": last["status"] == "ready",
                    "message": sentence,
                }
            await anyio.sleep(poll_seconds())

    def unsettled(self, timeout_seconds: float) -> dict[str, Any]:
        """The answer when the wait's bound came first: where the cluster stands, to call
        again."""
        last, lost = self.last, self.lost
        after = _seconds(timeout_seconds)
        if last is None:
            message = f"The API did not answer within {after}"
        else:
            message = f"Still {last['status']} after {after} ({progress(last)[2]})"
        if lost is not None:
            message += f"; the API does not answer now ({lost.code}), the cluster goes on"
        return {
            "cluster": shown(last) if last else None,
            "status": last["status"] if last else None,
            "settled": False,
            "ready": False,
            "message": message + ": call wait_for_cluster again.",
        }


@tool(
    title="How to connect",
    annotations=READS,
    description="How to connect and run on a cluster whose machines are up: SSH per node, "
    "the SSH config and known_hosts, the hostfile, torchrun/mpirun/deepspeed commands, "
    "each node's environment, storage and the software's examples (kubeconfig). Free. "
    "From the user's computer a machine is NAME-node-i in the SSH config (the head also "
    "NAME; ssh[].hosts), never a bare node-i; inside the cluster it is node-i.",
)
def get_connect_info(ctx: Context, cluster: ClusterRef) -> Annotated[CallToolResult, ConnectAnswer]:
    return call(ctx, lambda c: {"connect": c.connect(c.resolve_cluster(cluster))})


@tool(
    title="Read a cluster's GPU metrics",
    annotations=READS,
    description="What a cluster's GPUs are doing: per live node its health (unhealthy "
    "with the problems: uncorrectable ECC errors, pages pending retirement, a hardware or "
    "thermal slowdown, a GPU missing), each GPU's latest figures (utilisation, memory "
    "used and total, temperature, power and its limit, SM clock, throttle reasons, ECC "
    "errors) and the node's GPU utilisation over the window (min, mean, max), not every "
    "point; idle_since when every GPU has stayed idle. Free.",
)
def get_cluster_metrics(
    ctx: Context,
    cluster: ClusterRef,
    window: Annotated[
        MetricsWindow,
        Field(description="The window the utilisation summary covers: 15m, 1h, 24h or 7d."),
    ] = "15m",
) -> Annotated[CallToolResult, MetricsAnswer]:
    def read(client: ApiClient) -> dict[str, Any]:
        cluster_id = client.resolve_cluster(cluster)
        return metrics_summary(cluster_id, client.metrics(cluster_id, window=window))

    return call(ctx, read)


@tool(
    title="Run the network test",
    annotations=hints(read_only=False, idempotent=False),
    description="Run the network test on a ready or degraded cluster: all_reduce_perf "
    "across the machines where nccl-tests is installed, otherwise each machine's bandwidth "
    "to node-0. Waits for the result for at most timeout_seconds (at most "
    f"{MAX_WAIT_SECONDS}) and answers the figures with the server's verdict: 'passed' or "
    "'below what Ethernet should give' (its verdict_rule). Still running then: get_cluster "
    "shows the "
    "result later. No charge beyond the machines, which are billed anyway.",
)
async def run_network_test(
    ctx: Context,
    cluster: ClusterRef,
    timeout_seconds: WaitSeconds = MAX_WAIT_SECONDS,
) -> Annotated[CallToolResult, NetworkTestAnswer]:
    try:
        client = caller(ctx).client_for(ctx)
    except ApiError as error:
        return tool_error(error.code, error.message, error.status)
    wait_threads = caller(ctx).wait_threads
    try:
        cluster_id = await in_thread(lambda: client.resolve_cluster(cluster), limiter=None)
        test = await in_thread(lambda: client.network_test(cluster_id), limiter=None)
        with anyio.move_on_after(timeout_seconds):
            await ctx.report_progress(0, 1, "running: measuring between the machines")
            while test["state"] == "running":
                await anyio.sleep(poll_seconds())
                read = await in_thread(lambda: client.cluster(cluster_id), limiter=wait_threads)
                test = read["network_test"] or test
            await ctx.report_progress(1, 1, test["state"])
    except ApiError as error:
        return tool_error(error.code, error.message, error.status)
    finally:
        client.close()
    if test["state"] == "running":
        message = (
            f"Still running after {_seconds(timeout_seconds)}: get_cluster shows the result "
            "in network_test once it is done."
        )
    elif test["verdict"] is not None:
        message = f"Network test done: {test['verdict']}."
    else:
        message = f"Network test {test['state']}: {test.get('error') or 'no figures'}."
    return answer(
        {"network_test": test, "finished": test["state"] != "running", "message": message}
    )


@tool(
    title="Plan replacing a machine",
    annotations=READS,
    description="Ask the server what replacing a lost or unhealthy worker would do, with "
    "every check the replacement runs (the machine may be replaced: never node-0, the head; "
    "the cluster's state; the key's limits, the budget and one hour of the new machine on "
    "the balance; a free machine) and nothing reserved. can_replace true: the plan (why it "
    "may be replaced, the private address the new machine keeps under the same name, the "
    "new machine's price per hour and the cluster's once it is up, what happens to the "
    "bill) and a plan_token valid 10 minutes, which replace_node needs for this machine. "
    "can_replace false: the refusal the replacement would get, e.g. head_not_replaceable, "
    "node_not_replaceable. Free. Show the price to the user before replacing.",
)
def plan_replace_node(
    ctx: Context, cluster: ClusterRef, node: NodeName
) -> Annotated[CallToolResult, ReplacePlanAnswer]:
    def plan(client: ApiClient) -> dict[str, Any]:
        cluster_id = client.resolve_cluster(cluster)
        return planned("can_replace", lambda: client.plan_replace(cluster_id, node))

    return call(ctx, plan)


@tool(
    title="Replace a machine (costs money)",
    # Destructive: the machine replaced is released. Idempotent: the same call again while
    # the new machine starts is refused (replacement_in_progress), never a second machine.
    annotations=hints(read_only=False, destructive=True, idempotent=True),
    description="Replace the planned lost or unhealthy worker in place. COSTS MONEY: a new "
    "machine, billed per second at the plan's price_per_hour from the moment it is up, "
    "takes the machine's name and private address; the machine replaced is released at "
    "once (an unhealthy one's billing ends now, a lost one's ended at its last heartbeat). "
    "Needs the plan_token plan_replace_node gave for this cluster and machine: the server "
    "refuses it for another machine (plan_mismatch) or after 10 minutes (plan_expired). "
    "Returns at once with the new machine starting: call wait_for_cluster.",
)
def replace_node(
    ctx: Context,
    cluster: ClusterRef,
    node: NodeName,
    plan_token: Annotated[
        str, Field(description="The plan_token plan_replace_node returned.", min_length=1)
    ],
) -> Annotated[CallToolResult, ClusterAnswer]:
    def replace(client: ApiClient) -> dict[str, Any]:
        cluster_id = client.resolve_cluster(cluster)
        return {"cluster": shown(client.replace_node(cluster_id, node, plan_token=plan_token))}

    return call(ctx, replace)


@tool(
    title="Plan adding workers",
    annotations=READS,
    description="Ask the server what adding `count` machines to a ready cluster would do, "
    "with every check the add runs (the cluster's state, at most 64 machines, the key's "
    "limits, the budget, one hour of the grown cluster on the balance, enough free machines) "
    "and nothing reserved. can_add true: the plan (what they add per hour, the cluster's "
    "price per hour now and after) and a plan_token valid 10 minutes, which add_workers "
    "needs with the same count. can_add false: the refusal the add would get. Free. Show "
    "the added price and the new total to the user before adding.",
)
def plan_add_workers(
    ctx: Context, cluster: ClusterRef, count: WorkerCount
) -> Annotated[CallToolResult, WorkersPlanAnswer]:
    def plan(client: ApiClient) -> dict[str, Any]:
        cluster_id = client.resolve_cluster(cluster)
        return planned("can_add", lambda: client.plan_add_workers(cluster_id, count=count))

    return call(ctx, plan)


@tool(
    title="Add workers (costs money)",
    # Idempotent: the token binds the cluster's size when planned, so the same call again
    # (a retry after a timeout) is refused plan_mismatch once they were added, never a second
    # add.
    annotations=hints(read_only=False, idempotent=True),
    description="Add the planned machines to a ready cluster. COSTS MONEY: each is billed "
    "per second at the plan's machine_price_per_hour (added_price_per_hour in all) from the "
    "moment it is up until terminate_cluster. Needs the plan_token plan_add_workers gave for "
    "this cluster and count: the server refuses another count, a cluster whose size changed "
    "since (the same token again, once they were added) with plan_mismatch, and a plan older "
    "than 10 minutes with plan_expired. Returns at once with the machines starting: call "
    "wait_for_cluster.",
)
def add_workers(
    ctx: Context,
    cluster: ClusterRef,
    count: WorkerCount,
    plan_token: Annotated[
        str, Field(description="The plan_token plan_add_workers returned.", min_length=1)
    ],
) -> Annotated[CallToolResult, ClusterAnswer]:
    def add(client: ApiClient) -> dict[str, Any]:
        cluster_id = client.resolve_cluster(cluster)
        grown = client.add_workers(cluster_id, count=count, plan_token=plan_token)
        return {"cluster": shown(grown)}

    return call(ctx, add)


@tool(
    title="Set a cluster's repair policy",
    annotations=hints(read_only=False, idempotent=True),
    description="Change who replaces a lost or unhealthy worker of a cluster that runs: ask "
    "(the user, through plan_replace_node and replace_node) or auto (the product, at once "
    "for a lost one, after a grace period for an unhealthy one, each replacement billed "
    "like the others). Free in itself.",
)
def set_repair_policy(
    ctx: Context, cluster: ClusterRef, repair_policy: RepairPolicyArg
) -> Annotated[CallToolResult, ClusterAnswer]:
    def change(client: ApiClient) -> dict[str, Any]:
        cluster_id = client.resolve_cluster(cluster)
        return {"cluster": shown(client.set_repair_policy(cluster_id, repair_policy))}

    return call(ctx, change)


@tool(
    title="Terminate a cluster",
    annotations=hints(read_only=False, destructive=True, idempotent=True),
    description="Terminate a cluster: every machine stops together, its disks are wiped "
    "and billing ends now. Irreversible. Saves money; costs nothing.",
)
def terminate_cluster(
    ctx: Context, cluster: ClusterRef
) -> Annotated[CallToolResult, ClusterAnswer]:
    return call(ctx, lambda c: {"cluster": shown(c.terminate(c.resolve_cluster(cluster)))})


@tool(
    title="List volumes",
    annotations=READS,
    description="List the project's volumes (location, size, USD per month, the cluster "
    "each is attached to). Free; volumes themselves are billed per GB-month.",
)
def list_volumes(ctx: Context) -> Annotated[CallToolResult, VolumesAnswer]:
    return call(ctx, lambda c: {"volumes": c.volumes()})


@tool(
    title="Read the balance",
    annotations=READS,
    description="The project's balance (USD), what its running machines burn per hour, "
    "and the hours it lasts at that rate. Free; owners' and managers' keys only.",
)
def get_balance(ctx: Context) -> Annotated[CallToolResult, BalanceAnswer]:
    return call(ctx, lambda c: {"balance": c.balance()})


@tool(
    title="List SSH keys",
    annotations=READS,
    description="List the project's SSH keys (id, name, fingerprint): a cluster installs "
    "them on every machine, all of them unless create_cluster names some. Free.",
)
def list_ssh_keys(ctx: Context) -> Annotated[CallToolResult, SshKeysAnswer]:
    return call(ctx, lambda c: {"ssh_keys": c.ssh_keys()})


@tool(
    title="Add an SSH key",
    annotations=hints(read_only=False, idempotent=True),
    description="Add a public SSH key to the project (one OpenSSH line: 'TYPE BASE64 "
    "[comment]', e.g. the user's ~/.ssh/id_ed25519.pub; never a private key). A cluster "
    "needs at least one. Refused with ssh_key_exists when the project has it already, "
    "invalid_ssh_key when it is not a public key. Free.",
)
def add_ssh_key(
    ctx: Context,
    public_key: Annotated[
        str, Field(description="The public key's one line.", min_length=1, max_length=16384)
    ],
    name: Annotated[str, Field(description="Defaults to the key's comment.", max_length=200)] = "",
) -> Annotated[CallToolResult, SshKeyAnswer]:
    body = {"name": name, "public_key": public_key}
    return call(ctx, lambda c: {"ssh_key": c.data("POST", "/ssh-keys", json=body)})


# --- the server ---------------------------------------------------------------------------------


def build_server(
    *, api_url: str, api_key: str | None, config_problem: str | None = None
) -> MCPServer:
    """The server. `config_problem`: why the config file could not be read, which every tool
    answers (`bad_config`) when no key came from elsewhere."""
    server = RuncrateServer(
        Caller(
            api_url=api_url,
            api_key=api_key,
            config_problem=config_problem,
            wait_threads=anyio.CapacityLimiter(WAIT_POLL_THREADS),
        )
    )
    for spec in TOOLS:
        server.add_tool(
            spec.function,
            title=spec.title,
            annotations=spec.annotations,
            description=spec.description,
        )
    return server


def configured_server() -> MCPServer:
    """The server `runcrate mcp` serves, with the CLI's settings. Over stdio, stdout is the
    protocol's channel, so a config file that cannot be read is said on stderr and answered by
    every tool (`bad_config`), never printed on stdout; RUNCRATE_API_URL and RUNCRATE_API_KEY
    still work. The tests talk to this same server in memory (tests/mcp/kit.py)."""
    try:
        settings = config.load()
    except config.ConfigError as error:
        sys.stderr.write(f"runcrate mcp: {error}\n")
        url = config.normalise_url(os.environ.get("RUNCRATE_API_URL") or config.DEFAULT_API_URL)
        key = (os.environ.get("RUNCRATE_API_KEY") or "").strip() or None
        return build_server(api_url=url, api_key=key, config_problem=str(error))
    return build_server(api_url=settings.api_url, api_key=settings.api_key)


def main(*, http: bool, host: str, port: int) -> None:
    """`runcrate mcp`: serve `configured_server()` over stdio, or streamable HTTP."""
    server = configured_server()
    if http:
        server.run("streamable-http", host=host, port=port)
    else:
        server.run()
