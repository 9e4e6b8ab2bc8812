"""`runcrate mcp`: the MCP server (the official `mcp` SDK's MCPServer, formerly FastMCP), so an
AI agent can plan, create, wait for and terminate clusters through the same API (docs/mcp.md).

Spending needs two calls: `plan_cluster` shows the price, the hours the balance covers and what
the network suits, and gives a confirmation token; `create_cluster` refuses without that token
for exactly the same offer, nodes, name, software, volume and environment. The token is an
HMAC-SHA256 over those parameters, the caller's key and an expiry, signed with a secret this
process draws at start: it cannot be forged, reused for another cluster, or kept past its ten
minutes or the server's life. It keeps an agent from creating by accident; the limits a key
may spend are the server's to enforce.

Every API refusal comes back as a tool error (`isError`) whose text is "code: message" and
whose structured content is `{"error": {"code", "message", "status"}}`.
"""

from __future__ import annotations

import hashlib
import hmac
import json
import re
import secrets
import time
from collections.abc import Callable
from datetime import UTC, datetime
from decimal import ROUND_DOWN, Decimal, InvalidOperation
from typing import Annotated, Any

from mcp.server import MCPServer
from mcp.server.mcpserver import Context
from mcp.types import CallToolResult, TextContent
from pydantic import Field

from runcrate_cli.client import ApiClient, ApiError

PLAN_TTL_SECONDS = 600
# The one form a token has: the expiry in ASCII digits without a leading zero, a dot, and the
# HMAC in lowercase hex. Anything else (a leading 0, full-width digits, "00" + token, a space
# or newline around it) is not a token, so one plan has exactly one token and one create.
PLAN_TOKEN = re.compile(r"[1-9][0-9]{0,11}\.[0-9a-f]{64}", re.ASCII)
DEFAULT_WAIT_SECONDS = 600
MAX_WAIT_SECONDS = 3600
# What the self-serve Ethernet network suits, as the offers page and the cluster page say it
# (docs/offers.md, templates/offers/picker.html); the figure is clusters.connect.ETHERNET_GBITS.
ETHERNET = {
    "interconnect": "ethernet",
    "expected": "about 1-2 Gbit/s between machines over an encrypted private network "
    "(10.77.0.0/24); all_reduce_perf reports a bus bandwidth of roughly 0.1-0.25 GB/s across "
    "nodes, while GPUs inside one machine talk at NVLink/PCIe speed",
    "suits": "independent jobs on every node, Slurm job arrays, Ray tasks, Kubernetes "
    "workloads and LoRA fine-tuning",
    "not_for": "training a full model across machines, where GPUs exchange gradients every "
    "step: for InfiniBand or RoCE, request a quote",
}
INSTRUCTIONS = (
    "Runcrate rents 2 to 64 GPU machines as one cluster, billed per second. To create one: "
    "list_gpus, list_offers(gpu, nodes), plan_cluster (shows the price and gives a "
    "confirmation token; show the price to the user), create_cluster with that token, "
    "wait_for_cluster, get_connect_info. terminate_cluster ends billing. Every call that "
    "fails returns the API's error code and message."
)

ClusterRef = Annotated[int | str, Field(description="The cluster's id (a number) or its name.")]


class PlanRefused(Exception):
    def __init__(self, code: str, message: str) -> None:
        super().__init__(message)
        self.code = code
        self.message = message


class Plans:
    """Confirmation tokens for `create_cluster`: `EXPIRY.SIGNATURE`."""

    def __init__(self, *, secret: bytes | None = None, ttl: int = PLAN_TTL_SECONDS) -> None:
        self._secret = secret or secrets.token_bytes(32)
        self.ttl = ttl

    def _signature(self, fields: dict[str, Any], expires: int) -> str:
        message = json.dumps({**fields, "expires": expires}, sort_keys=True).encode()
        return hmac.new(self._secret, message, hashlib.sha256).hexdigest()

    def issue(self, fields: dict[str, Any], *, now: float | None = None) -> tuple[str, int]:
        expires = int(now if now is not None else time.time()) + self.ttl
        return f"{expires}.{self._signature(fields, expires)}", expires

    def check(self, token: str, fields: dict[str, Any], *, now: float | None = None) -> None:
        token = token or ""
        if not PLAN_TOKEN.fullmatch(token):
            raise PlanRefused(
                "confirmation_required",
                "create_cluster needs the confirmation_token that plan_cluster returned for "
                "this offer, nodes, name and software: call plan_cluster first and show the "
                "user its price.",
            )
        expires = int(token.partition(".")[0])
        # The whole token, as bytes, against the one this server would issue for this plan.
        expected = f"{expires}.{self._signature(fields, expires)}"
        if not hmac.compare_digest(expected.encode("ascii"), token.encode("ascii")):
            raise PlanRefused(
                "confirmation_mismatch",
                "This confirmation_token was not given for these parameters (offer, nodes, "
                "name, software, volume, environment must be exactly the planned ones) or by "
                "this server: call plan_cluster again.",
            )
        if expires < (now if now is not None else time.time()):
            raise PlanRefused(
                "confirmation_expired",
                f"This confirmation_token has expired (they last {self.ttl // 60} minutes): "
                "call plan_cluster again.",
            )


def plan_fields(
    *,
    key: str | None,
    offer_id: str,
    nodes: int,
    name: str,
    software: str,
    volume_id: int | None,
    environment: str,
) -> dict[str, Any]:
    """What a token is bound to. The key's digest, not the key, so a token from one caller of
    the HTTP server is worthless to another."""
    return {
        "key": hashlib.sha256((key or "").encode()).hexdigest(),
        "offer_id": offer_id,
        "nodes": nodes,
        "name": name,
        "software": software,
        "volume_id": volume_id,
        "environment": environment,
    }


def tool_error(code: str, message: str, status: int | None = None) -> CallToolResult:
    return CallToolResult(
        content=[TextContent(type="text", text=f"{code}: {message}")],
        structured_content={"error": {"code": code, "message": message, "status": status}},
        is_error=True,
    )


def _hours(balance: str, price: str) -> str | None:
    try:
        per_hour = Decimal(price)
        return str((Decimal(balance) / per_hour).quantize(Decimal("0.01"), ROUND_DOWN))
    except (InvalidOperation, ZeroDivisionError):
        return None


def build_server(*, api_url: str, api_key: str | None, plans: Plans | None = None) -> MCPServer:
    server = MCPServer("runcrate", instructions=INSTRUCTIONS, log_level="WARNING")
    plans = plans or Plans()

    def key_for(ctx: Context | None) -> str | None:
        """Over HTTP a caller may send its own key (`Authorization: Bearer rc_…`); otherwise
        the key the server was started with."""
        headers = ctx.headers if ctx is not None else None
        if headers:
            value = headers.get("authorization") or headers.get("Authorization") or ""
            scheme, _, token = value.partition(" ")
            if scheme.lower() == "bearer" and token.strip():
                return token.strip()
        return api_key

    def call(ctx: Context, work: Callable[[ApiClient], Any]) -> Any:
        try:
            with ApiClient(api_url=api_url, api_key=key_for(ctx)) as client:
                return work(client)
        except ApiError as error:
            return tool_error(error.code, error.message, error.status)
        except PlanRefused as refusal:
            return tool_error(refusal.code, refusal.message)

    # --- reading: free -------------------------------------------------------------------------

    @server.tool(
        description="List GPU models with the lowest machine price (USD/hour) and the GPU "
        "counts on offer. Free: reads the catalog, creates nothing."
    )
    def list_gpus(
        ctx: Context,
        include_community: Annotated[
            bool, Field(description="Also count independent operators' (community) hosts.")
        ] = False,
    ) -> Any:
        return call(ctx, lambda c: {"gpus": c.gpus(include_community=include_community)})

    @server.tool(
        description="List the offers that can start `nodes` machines of `gpu` now, best first, "
        "with the price per machine and for the whole cluster (USD/hour), free machines and "
        "the software each offers. Free: creates nothing."
    )
    def list_offers(
        ctx: Context,
        gpu: Annotated[str, Field(description="A GPU's slug, from list_gpus (e.g. h100-sxm).")],
        nodes: Annotated[int, Field(description="How many machines: 2 to 64.")],
        include_community: Annotated[
            bool,
            Field(description="Also list community hosts (independent operators: no secrets)."),
        ] = False,
    ) -> Any:
        return call(
            ctx,
            lambda c: {
                "offers": c.offers(gpu=gpu, nodes=nodes, include_community=include_community)
            },
        )

    @server.tool(
        description="Plan a cluster before creating it: the price per hour of the whole "
        "cluster, how many hours the project's balance covers, the offer, its free machines, "
        "what its Ethernet network suits, and a confirmation_token (valid 10 minutes) that "
        "create_cluster needs for exactly these parameters. Free: reserves nothing. Show the "
        "price to the user before creating."
    )
    def plan_cluster(
        ctx: Context,
        gpu: Annotated[str, Field(description="The GPU's slug, as given to list_offers.")],
        offer_id: Annotated[str, Field(description="An offer's id, from list_offers.")],
        nodes: Annotated[int, Field(description="How many machines: 2 to the offer's max.")],
        name: Annotated[str, Field(description="The cluster's name: a DNS label.")],
        software: Annotated[str, Field(description="none, slurm, kubernetes or ray.")] = "none",
        volume_id: Annotated[
            int | None, Field(description="A volume to attach (list_volumes), or none.")
        ] = None,
        environment: Annotated[str, Field(description="The environment's name.")] = "default",
    ) -> Any:
        def plan(client: ApiClient) -> dict:
            found = client.offers(gpu=gpu, nodes=nodes, include_community=True)
            offer = next((o for o in found if o["id"] == offer_id), None)
            if offer is None:
                raise ApiError(
                    "unknown_offer",
                    f"There is no offer {offer_id!r} for {nodes} machines of {gpu}: "
                    "list_offers shows the ones there are.",
                    404,
                )
            problems = []
            if offer["availability"] != "available":
                problems.append(
                    f"The offer cannot start {nodes} machines now "
                    f"({offer['availability'].replace('_', ' ')})."
                )
            if software not in offer["software"]:
                problems.append(
                    f"The offer does not run {software!r}; it offers "
                    f"{', '.join(offer['software'])}."
                )
            try:
                balance: dict | None = client.balance(price_per_hour=offer["price_per_hour"])
            except ApiError as error:
                if error.status != 403:
                    raise
                balance = None  # no billing scope, or a developer's key (SPEC §5)
            result: dict[str, Any] = {
                "offer": offer,
                "nodes": nodes,
                "name": name,
                "software": software,
                "volume_id": volume_id,
                "environment": environment,
                "price_per_hour": offer["price_per_hour"],
                "machine_price_per_hour": offer["machine_price_per_hour"],
                "currency": "USD",
                "billing": "Per second for every machine, from the moment all of them joined "
                "until the cluster is terminated; creating needs balance_needed in the balance.",
                "free_machines": offer["nodes_available"],
                "balance": balance["balance"] if balance else None,
                # What the create needs, as the API computes it (one rule, on the server).
                "balance_needed": balance["balance_needed"] if balance else None,
                "hours_covered": (
                    _hours(balance["balance"], offer["price_per_hour"]) if balance else None
                ),
                "network": ETHERNET
                if offer["interconnect"] == "ethernet"
                else {"interconnect": offer["interconnect"]},
                "community": offer["community"],
            }
            if balance is None:
                result["balance_note"] = (
                    "This key cannot see billing: that takes the billing scope and an owner's "
                    "or manager's key."
                )
            if offer["community"]:
                result["community_note"] = (
                    "Runs on an independent operator's hosts: keep secrets off it."
                )
            result["can_create"] = not problems
            result["problems"] = problems
            if not problems:
                fields = plan_fields(
                    key=key_for(ctx),
                    offer_id=offer_id,
                    nodes=nodes,
                    name=name,
                    software=software,
                    volume_id=volume_id,
                    environment=environment,
                )
                token, expires = plans.issue(fields)
                result["confirmation_token"] = token
                result["confirmation_expires_at"] = (
                    datetime.fromtimestamp(expires, UTC).isoformat().replace("+00:00", "Z")
                )
            return result

        return call(ctx, plan)

    @server.tool(
        description="Create the planned cluster. COSTS MONEY: creates machines billed per "
        "second at the offer's price (the plan's price_per_hour for the whole cluster) from "
        "the moment every machine joined until terminate_cluster. Needs the "
        "confirmation_token plan_cluster gave for exactly these parameters; refused without "
        "it. Calling again with the same token returns the same cluster, never a second one. "
        "Returns at once with the cluster provisioning: call wait_for_cluster."
    )
    def create_cluster(
        ctx: Context,
        offer_id: Annotated[str, Field(description="The planned offer's id.")],
        nodes: Annotated[int, Field(description="The planned number of machines.")],
        name: Annotated[str, Field(description="The planned name.")],
        confirmation_token: Annotated[
            str, Field(description="The confirmation_token plan_cluster returned.")
        ],
        software: Annotated[str, Field(description="The planned software.")] = "none",
        volume_id: Annotated[int | None, Field(description="The planned volume, if any.")] = None,
        environment: Annotated[str, Field(description="The planned environment.")] = "default",
    ) -> Any:
        def create(client: ApiClient) -> dict:
            fields = plan_fields(
                key=key_for(ctx),
                offer_id=offer_id,
                nodes=nodes,
                name=name,
                software=software,
                volume_id=volume_id,
                environment=environment,
            )
            plans.check(confirmation_token, fields)
            # One plan, one cluster: an agent that calls again with the same token (after a
            # timeout, say) gets the cluster the first call made, never a second one.
            # The token is canonical (checked above), so its digest is the plan's one key.
            token_digest = hashlib.sha256(confirmation_token.encode("ascii")).hexdigest()
            cluster = client.create_cluster(
                offer_id=offer_id,
                nodes=nodes,
                name=name,
                software=software,
                volume_id=volume_id,
                environment=environment,
                idempotency_key=f"mcp-plan-{token_digest}",
            )
            return {"cluster": cluster}

        return call(ctx, create)

    @server.tool(
        description="List the project's clusters, newest first (status, size, price per "
        "hour). Free."
    )
    def list_clusters(ctx: Context) -> Any:
        return call(ctx, lambda c: {"clusters": c.clusters()})

    @server.tool(
        description="Read a cluster: status, failure (node, step, message), machines, events, "
        "acceptance report and last network test. Free."
    )
    def get_cluster(ctx: Context, cluster: ClusterRef) -> Any:
        return call(ctx, lambda c: {"cluster": c.cluster(c.resolve_cluster(cluster))})

    @server.tool(
        description="Wait until a cluster is ready, degraded or ended (failed, terminated, "
        "stopped), polling the API, at most timeout_seconds. Free, but a cluster that is up "
        "is billed while you wait. Returns the cluster and whether it settled."
    )
    def wait_for_cluster(
        ctx: Context,
        cluster: ClusterRef,
        timeout_seconds: Annotated[
            float, Field(description="Give up after this many seconds.", gt=0, le=MAX_WAIT_SECONDS)
        ] = DEFAULT_WAIT_SECONDS,
    ) -> Any:
        def wait(client: ApiClient) -> dict:
            final, settled = client.wait_for_cluster(
                client.resolve_cluster(cluster), timeout=timeout_seconds
            )
            return {"cluster": final, "settled": settled, "ready": final["status"] == "ready"}

        return call(ctx, wait)

    @server.tool(
        description="How to connect and run on a cluster whose machines are up: SSH per node, "
        "the SSH config and known_hosts, the hostfile, torchrun/mpirun/deepspeed commands, "
        "each node's environment, storage and the software's examples (kubeconfig). Free. "
        "From the user's computer a machine is NAME-node-i in the SSH config (the head also "
        "NAME; ssh[].hosts), never a bare node-i; inside the cluster it is node-i."
    )
    def get_connect_info(ctx: Context, cluster: ClusterRef) -> Any:
        return call(ctx, lambda c: {"connect": c.connect(c.resolve_cluster(cluster))})

    @server.tool(
        description="Start the network test on a ready or degraded cluster: all_reduce_perf "
        "across the machines where nccl-tests is installed, otherwise each machine's bandwidth "
        "to node-0. No charge beyond the machines, which are billed anyway; takes a minute or "
        "so. Returns the running test; get_cluster shows the result in network_test."
    )
    def run_network_test(ctx: Context, cluster: ClusterRef) -> Any:
        return call(ctx, lambda c: {"network_test": c.network_test(c.resolve_cluster(cluster))})

    @server.tool(
        description="Terminate a cluster: every machine stops together, its disks are wiped "
        "and billing ends now. Irreversible. Saves money; costs nothing."
    )
    def terminate_cluster(ctx: Context, cluster: ClusterRef) -> Any:
        return call(ctx, lambda c: {"cluster": c.terminate(c.resolve_cluster(cluster))})

    @server.tool(
        description="List the project's volumes (location, size, USD per month, the cluster "
        "each is attached to). Free; volumes themselves are billed per GB-month."
    )
    def list_volumes(ctx: Context) -> Any:
        return call(ctx, lambda c: {"volumes": c.volumes()})

    @server.tool(
        description="The project's balance (USD), what its running machines burn per hour, "
        "and the hours it lasts at that rate. Free; owners' and managers' keys only."
    )
    def get_balance(ctx: Context) -> Any:
        return call(ctx, lambda c: {"balance": c.balance()})

    return server


def serve(*, api_url: str, api_key: str | None, http: bool, host: str, port: int) -> None:
    server = build_server(api_url=api_url, api_key=api_key)
    if http:
        server.run("streamable-http", host=host, port=port)
    else:
        server.run()
