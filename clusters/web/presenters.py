"""What the Clusters pages show, read from the models for a template: the cluster page's
context (its header, its tabs, its node rows, its poll's URL) and the create form's price card
and estimates. The views parse the request, ask here, and render (docs/architecture.md)."""

import hashlib
import json
import math
from dataclasses import dataclass
from datetime import datetime
from decimal import Decimal
from typing import Any
from urllib.parse import urlencode

from django.conf import settings
from django.db.models import QuerySet
from django.template.defaultfilters import pluralize
from django.urls import reverse
from django.utils import timezone
from django.utils.dateparse import parse_datetime
from django.utils.html import escape
from django.utils.safestring import SafeString, mark_safe

from accounts.requests import ProjectRequest
from billing import balances, ledger, meter
from billing import policy as billing_policy
from billing.context_processors import request_summary
from billing.usage import ClusterCost, cluster_costs
from clusters import connect, estimates, lifecycle, policy
from clusters.errors import ClusterRefused
from clusters.lifecycle.repair import grace_words, replaceable
from clusters.models import STEP_NAMES, Cluster, Event, Node, give_up_after
from clusters.telemetry import logs, metrics
from clusters.web import charts, heatmap
from clusters.web.forms import ClusterForm
from offers.models import MAX_NODES, MIN_NODES, TOO_FEW_NODES, MachineType
from offers.offers import Offer, list_offers, same_shape_first
from runcrate import durations

STATUS_BADGES: dict[str, str] = {
    Cluster.Status.PROVISIONING: "info",
    Cluster.Status.INSTALLING: "info",
    Cluster.Status.READY: "ok",
    Cluster.Status.DEGRADED: "warn",
    Cluster.Status.FAILED: "bad",
    Cluster.Status.TERMINATING: "info",
    Cluster.Status.TERMINATED: "",
    Cluster.Status.STOPPED: "warn",
}
# What a node is doing while it is on a step (the step names what it waits for).
NODE_STEP_PHRASES: dict[str, str] = {
    Node.Step.RUNNING: "Booting",
    Node.Step.AGENT: "Agent checking in",
    Node.Step.NETWORK: "Testing the network",
    Node.Step.INSTALL: "Installing software",
    Node.Step.DONE: "Ready",
}
# The tail of a failure's output the page's banner shows; the event keeps it whole.
FAILURE_OUTPUT_LINES = 40
# How the stepper ends once the cluster has (its status, as the badge says it).
END_STEPS = (Cluster.Status.TERMINATED, Cluster.Status.STOPPED, Cluster.Status.FAILED)


# --- the cluster page's tabs -------------------------------------------------------------------


@dataclass(frozen=True)
class Tab:
    """A tab of the cluster page: its own URL (`clusters:detail` for the first, `clusters:tab`
    for the others), its body's template, and the id of the heading that names its panel."""

    slug: str
    label: str
    template: str
    heading: str

    def url(self, cluster: Cluster) -> str:
        if self is TABS[0]:
            return reverse("clusters:detail", args=[cluster.pk])
        return reverse("clusters:tab", args=[cluster.pk, self.slug])


# The cluster page's tabs, in order.
TABS: tuple[Tab, ...] = (
    Tab("overview", "Overview", "clusters/tabs/overview.html", "overview-title"),
    Tab("connect", "Connect", "clusters/tabs/connect_tab.html", "connect-tab-title"),
    Tab("machines", "Machines", "clusters/tabs/machines.html", "machines-title"),
    Tab("metrics", "Metrics", "clusters/tabs/metrics.html", "metrics-title"),
    Tab("logs", "Logs & jobs", "clusters/tabs/logs.html", "logs-title"),
    Tab("events", "Events", "clusters/tabs/events.html", "events-title"),
    Tab("billing", "Billing", "clusters/tabs/billing.html", "billing-title"),
)


TABS_BY_SLUG = {tab.slug: tab for tab in TABS}


def _instant(at: datetime) -> str:
    """An instant as the page's script reads it (static/js/app.js): ISO 8601, in milliseconds."""
    return at.isoformat(timespec="milliseconds")


def _create_again_url(cluster: Cluster, *, offer: str | None = None) -> str:
    query = {
        "offer": offer or cluster.machine_type.slug,
        "nodes": cluster.size,
        "name": cluster.name,
        "software": cluster.software,
        "environment": cluster.environment.name,
        "repair_policy": cluster.repair_policy,
    }
    return f"{reverse('clusters:new')}?{urlencode(query)}"


# --- the create form ---------------------------------------------------------------------------


def _covers(balance: Decimal, per_hour: Decimal) -> Decimal | None:
    """The seconds `balance` pays for at `per_hour` (the runway, billing/policy.py); None when
    it pays for none, so the card names no span."""
    return billing_policy.runway_seconds(balance, per_hour) or None


def price_card(request: ProjectRequest, offer: Offer, nodes: int) -> dict:
    """The price card: the cluster's price, the balance, and how long the balance runs it
    (docs/clusters.md, "Creating"): alone, and beside what already runs. Only those who see
    billing read the balance and the burn rate (SPEC §5); a developer reads only whether the
    balance covers the cluster."""
    machine_price = offer.machine_price_per_hour
    valid = lifecycle.size_refusal(nodes) is None
    cluster_price = machine_price * nodes
    balance = ledger.balance(project=request.project)
    needed = balances.balance_needed(cluster_price)
    running = request_summary(request)  # None for a developer, who does not see billing
    burn = running.burn_rate if running else Decimal(0)
    return {
        "sees_billing": running is not None,
        "covers_seconds": _covers(balance, cluster_price) if valid else None,
        "burn_rate": burn,
        "covers_with_running_seconds": _covers(balance, cluster_price + burn)
        if valid and burn > 0
        else None,
        "nodes": nodes,
        "cluster_price": cluster_price if valid else None,
        "machine_price": machine_price,
        "balance": balance,
        "needed": needed,
        "min_balance": balances.minimum_balance(),
        "short": valid and balance < needed,
        "too_few": TOO_FEW_NODES if nodes < MIN_NODES else "",
    }


def new_cluster_context(
    request: ProjectRequest, offer: Offer, nodes: int, *, form: ClusterForm, name_suggested: bool
) -> dict:
    """The create form's page: the form, the price card, and how long such a cluster takes to
    be ready (bare, and with software) and when it is given up on."""
    machine_type = offer.machine_type
    assert isinstance(machine_type, MachineType)  # get_offer's offer holds the model
    boot = machine_type.boot_seconds
    return {
        "offer": offer,
        "form": form,
        "has_keys": form.has_ssh_keys,
        "summary": price_card(request, offer, nodes),
        "min_nodes": MIN_NODES,
        # At real speed, as the track record beside it reads; the demo's speed-up said apart.
        "ready_estimate": {
            "bare": estimates.real_time_to_ready(boot_seconds=boot, software="none"),
            "software": estimates.real_time_to_ready(boot_seconds=boot, software="slurm"),
            "give_up_after": give_up_after(machine_type.slow_boot),
            "sim_speed": estimates.sim_speed(),
            "sim_bare": estimates.time_to_ready(boot_seconds=boot, software="none"),
            "sim_software": estimates.time_to_ready(boot_seconds=boot, software="slurm"),
        },
        "name_suggested": name_suggested,
        "repair_policies": repair_policy_choices(),
    }


# --- the cluster page ---------------------------------------------------------------------------


# What the agent and the drivers write on a node row and the page never shows: its GPUs, its
# reachability row and its last health report (one entry per peer each, so 64 × 64 at 64
# nodes), its GPUs' conditions (the cluster's health problems say them) and the drivers' records.
NODE_COLUMNS_UNSHOWN = ("gpus", "reachability", "health", "gpu_health", "driver_state")
# An event's own columns: it shows its node by name alone (the node's index).
EVENT_COLUMNS = tuple(field.name for field in Event._meta.concrete_fields)


def page_nodes() -> QuerySet[Node]:
    # A replacement shares its name (its index) with the machine it replaces: it follows it.
    return Node.objects.defer(*NODE_COLUMNS_UNSHOWN).order_by("index", "pk")


def page_events() -> QuerySet[Event]:
    events = Event.objects.select_related("node").only(*EVENT_COLUMNS, "node__index")
    return events.order_by("-at", "-pk")


@dataclass(frozen=True)
class Step:
    key: str
    label: str
    state: str  # done | current | failed | todo


@dataclass(frozen=True)
class NodeRow:
    node: Node
    doing: str
    steps_done: int
    steps_total: int
    percent: int
    tone: str  # "" | ok | bad
    time_left: str
    deadline: str  # the step's deadline as an ISO instant, which the page counts down to; or ""
    utilization: str = ""  # its GPUs in its latest report: "8 GPUs · 97%", or ""
    reported_at: datetime | None = None  # that report's time
    reporting: bool = False  # whether that report is recent (metrics.reporting)
    problems: tuple[str, ...] = ()  # its open health problems, as the "unhealthy" badge says
    may_replace: bool = False  # a lost or unhealthy worker the user may replace now
    head_sick: bool = False  # node-0, lost or unhealthy: it cannot be replaced in place
    replaced_at: datetime | None = None  # when a machine that left was replaced (asked for)
    replaces: Node | None = None  # the machine this replacement took the name of

    @property
    def gpus_cell(self) -> SafeString:
        """The row's GPUs cell (`#<row id>-gpus`): its latest report's utilisation, and since
        when it is silent. Joined here, not by a template: a poll after a report sends this
        cell of every live row, alone (clusters/parts/gpu_cells.html)."""
        return self._gpus_cell(oob=False)

    @property
    def gpus_cell_oob(self) -> SafeString:
        """The same cell, swapped out of band by its id."""
        return self._gpus_cell(oob=True)

    def _gpus_cell(self, *, oob: bool) -> SafeString:
        return gpus_cell(self.row_id, self.utilization, self.reported_at, self.reporting, oob=oob)

    @property
    def row_id(self) -> str:
        """The row's id, which a poll's changed row is swapped by: the node's name, or, for a
        machine replaced under its name, one of its own."""
        if self.replaced_at is not None:
            return f"{self.node.name}-replaced-{self.node.pk}"
        return self.node.name


def gpus_cell(
    row_id: str, utilization: str, at: datetime | None, reporting: bool, *, oob: bool
) -> SafeString:
    """A machine row's GPUs cell (`#<row id>-gpus`): its latest report's utilisation, and since
    when it is silent; swapped out of band by its id when `oob`."""
    # Joined as text, each value escaped: format_html's three calls a cell were most of a
    # Machines tab poll's own time at 64 nodes (issue 38).
    if not utilization:
        inner = '<span class="muted">—</span>'
    else:
        title = f' title="Its latest report: {at:%H:%M:%S} UTC"' if at else ""
        inner = f"<span{title}>{escape(utilization)}</span>"
        if not reporting:
            since = f"{at:%H:%M}" if at else ""
            inner += f' <span class="muted small">silent since {since} UTC</span>'
    oob_attribute = ' hx-swap-oob="true"' if oob else ""
    return mark_safe(  # noqa: S308 - every value in it escaped above
        f'<td id="{escape(row_id)}-gpus" class="node-gpus"{oob_attribute}>{inner}</td>'
    )


def figures_cells(
    cluster_status: str, nodes: list[tuple[Node, metrics.NodeUtilization | None]], now: datetime
) -> list[SafeString]:
    """Each live row's GPUs cell, out of band, from the nodes alone (no cluster, no header):
    what the Machines tab's poll sends when only the figures moved. The nodes come with their
    figures (`metrics.nodes_with_utilization`): no query here."""
    replaced = {n.replaces_id for n, _ in nodes if n.replaces_id is not None}
    cells = []
    for node, found in nodes:
        if not metrics.recording(cluster_status=cluster_status, node_status=node.status):
            continue
        reported = found.reported_at if found else None
        cells.append(
            gpus_cell(
                f"{node.name}-replaced-{node.pk}" if node.pk in replaced else node.name,
                charts.utilization_text(found.gpus, found.mean_percent) if found else "",
                reported,
                metrics.reporting(reported, now=now),
                oob=True,
            )
        )
    return cells


def _stepper(cluster: Cluster, nodes: list[Node]) -> list[Step]:
    """Reserved → Boot → Agent check-in → Private network → (Software install) → Ready, then
    how it ended (terminated, stopped, failed) once it has.

    A step is done when every original node has passed it; a failed cluster marks the step it
    failed at (or, with no step named, the first one not done) red.
    """
    founders = [n for n in nodes if not n.is_worker]
    joined = cluster.joined_at is not None
    ready = cluster.ready_at is not None

    def everyone(field: str) -> bool:
        return joined or (bool(founders) and all(getattr(n, field) for n in founders))

    steps = [
        ("reserved", "Reserved", True),
        (Node.Step.RUNNING, STEP_NAMES[Node.Step.RUNNING], everyone("running_at")),
        (Node.Step.AGENT, STEP_NAMES[Node.Step.AGENT], everyone("agent_at")),
        (Node.Step.NETWORK, STEP_NAMES[Node.Step.NETWORK], joined),
    ]
    if cluster.software != Cluster.Software.NONE:
        steps.append((Node.Step.INSTALL, STEP_NAMES[Node.Step.INSTALL], ready))
    steps.append(("ready", "Ready", ready))

    keys = [key for key, _, _ in steps]
    first_open = next((key for key, _, done in steps if not done), None)
    failing = None
    if cluster.status in (Cluster.Status.FAILED, Cluster.Status.DEGRADED):
        failing = cluster.failure_step if cluster.failure_step in keys else first_open
    moving = cluster.status in (Cluster.Status.PROVISIONING, Cluster.Status.INSTALLING)
    result = []
    for key, label, done in steps:
        if key == failing:
            state = "failed"
        elif done:
            state = "done"
        elif moving and key == first_open:
            state = "current"
        else:
            state = "todo"
        result.append(Step(key=key, label=label, state=state))
    if cluster.status in END_STEPS:
        # An ended cluster's stepper says how it ended, after the steps it passed.
        result.append(Step(key="end", label=cluster.get_status_display(), state="ended"))
    return result


def _steps_done(node: Node, with_install: bool) -> int:
    """How many of its steps a node has really passed: running, agent, network, and the software
    only once its check passed on the node (step `done`); an install that ran but was never
    checked ready, or that failed, is not done."""
    done = sum(1 for field in ("running_at", "agent_at", "network_at") if getattr(node, field))
    if with_install and node.installed_at and node.step == Node.Step.DONE:
        done += 1
    return done


def replaceable_now(cluster: Cluster, nodes: list[Node]) -> dict[str, Node]:
    """The workers the user may replace now, by name: those the lifecycle's own check lets
    through (`clusters.lifecycle.repair.replaceable`: a running cluster, a lost or unhealthy
    worker, none starting under its name), asked of the nodes read, with no query."""
    if not cluster.is_running:
        return {}
    # Each name asked of its own nodes (the check looks at no other): once over the nodes.
    named: dict[str, list[Node]] = {}
    for node in nodes:
        if node.index != 0:
            named.setdefault(node.name, []).append(node)
    found = {}
    for name, its_nodes in named.items():
        try:
            node, _ = replaceable(cluster, its_nodes, name)
        except ClusterRefused:
            continue
        found[name] = node
    return found


def head_sick(cluster: Cluster, nodes: list[Node]) -> bool:
    """Whether node-0 is lost or unhealthy in a running cluster: where a worker would have its
    Replace button, the head says it cannot be replaced in place."""
    head = next((n for n in nodes if n.index == 0), None)
    return cluster.is_running and head is not None and bool(lifecycle.node_problem(cluster, head))


def _doing(cluster: Cluster, node: Node, *, finished: bool, install_failed: bool) -> tuple:
    """What a machine's row says it is doing, and its tone."""
    if node.status == Node.Status.FAILED:
        return f"Failed at {STEP_NAMES.get(node.step, node.step).lower()}", "bad"
    if node.status == Node.Status.LOST:
        heard = node.heartbeat_at or node.ended_at
        return (f"Lost: silent since {heard:%H:%M:%S} UTC" if heard else "Lost"), "bad"
    if install_failed and node.step == Node.Step.INSTALL:
        # The install stopped: the node that failed says so, the others did not finish.
        failed_here = node.name == cluster.failure_node
        return ("Install failed", "bad") if failed_here else ("Install stopped", "")
    return NODE_STEP_PHRASES.get(node.step, node.step), "ok" if finished else ""


def node_rows(
    cluster: Cluster, nodes: list[Node], now: datetime, *, every: list[Node] | None = None
) -> list[NodeRow]:
    """The rows of `nodes`, read with `every` node of the cluster (default: `nodes`), which say
    what replaced what and what may be replaced."""
    every = nodes if every is None else every
    by_pk = {n.pk: n for n in every}
    replaced_by = {n.replaces_id: n for n in every if n.replaces_id is not None}
    may_replace = replaceable_now(cluster, every)
    sick_head = head_sick(cluster, every)
    with_install = cluster.software != Cluster.Software.NONE
    total = 4 if with_install else 3
    install_failed = cluster.can_retry_install
    deadlines = lifecycle.step_deadlines(cluster, nodes, now) if cluster.is_live else {}
    # One query for the rows, and none where no node's reports are kept.
    kept = [
        n.pk
        for n in nodes
        if metrics.recording(cluster_status=cluster.status, node_status=n.status)
    ]
    gpus_now = metrics.utilization_now(kept)
    rows = []
    for node in nodes:
        now_figures = gpus_now.get(node.pk)
        reported = now_figures.reported_at if now_figures else None
        done = _steps_done(node, with_install)
        deadline = deadlines.get(node.pk)
        left = max(0, int((deadline - now).total_seconds())) if deadline else None
        doing, tone = _doing(cluster, node, finished=done == total, install_failed=install_failed)
        rows.append(
            NodeRow(
                node=node,
                doing=doing if node.status != Node.Status.ENDED else "Released",
                steps_done=done,
                steps_total=total,
                percent=round(100 * done / total),
                tone=tone,
                time_left=f"{durations.countdown(left)} left" if left is not None else "",
                deadline=_instant(deadline) if deadline else "",
                utilization=charts.utilization_text(now_figures.gpus, now_figures.mean_percent)
                if now_figures
                else "",
                reported_at=reported,
                reporting=metrics.reporting(reported, now=now),
                # A machine replaced under its name has left: the name's problems are the new one's.
                problems=() if node.pk in replaced_by else tuple(cluster.problems_of(node.name)),
                may_replace=node.name in may_replace and may_replace[node.name].pk == node.pk,
                head_sick=node.index == 0 and sick_head,
                replaced_at=replaced_by[node.pk].reserved_at if node.pk in replaced_by else None,
                replaces=by_pk.get(node.replaces_id) if node.replaces_id is not None else None,
            )
        )
    return rows


def _failure_event(cluster: Cluster) -> Event | None:
    """The event that explains a failed or degraded cluster (its reason, its node, its output),
    read from the page's prefetched events where there are, else in one query."""
    if cluster.status == Cluster.Status.FAILED:
        reasons = {cluster.failure_reason} if cluster.failure_reason else Event.FAILURES
    elif cluster.status == Cluster.Status.DEGRADED:
        # A cluster degraded before the lifecycle kept its failure fields has only its event.
        reasons = {cluster.failure_reason} if cluster.failure_reason else Event.DEGRADING
    else:
        return None
    if "events" in getattr(cluster, "_prefetched_objects_cache", {}):
        events = [e for e in cluster.events.all() if e.reason in reasons]
        return events[0] if events else None  # newest first
    return page_events().filter(cluster=cluster, reason__in=reasons).first()


def _failure_context(cluster: Cluster) -> dict:
    """What the failed or degraded banner shows beside the cluster's failure fields: the
    failing event's output (its last lines; the Events table has it whole)."""
    event = _failure_event(cluster)
    # The cluster's own fields, or its event's where an older cluster has none.
    why = {
        "node": cluster.failure_node or (event.node.name if event and event.node else ""),
        "reason": cluster.failure_reason or (event.reason if event else ""),
        "message": cluster.failure_message or (event.message if event else ""),
    }
    if event is None or not event.output:
        return {"failure_event": event, "failure_output": "", "failure": why}
    lines = event.output.rstrip().splitlines()
    tail = "\n".join(lines[-FAILURE_OUTPUT_LINES:])
    return {
        "failure": why,
        "failure_event": event,
        "failure_output": tail,
        "failure_output_shown": min(len(lines), FAILURE_OUTPUT_LINES),
        "failure_output_cut": max(0, len(lines) - FAILURE_OUTPUT_LINES),
    }


def _ssh_to_head(cluster: Cluster) -> str:
    """The command that reaches node-0, or "" while it has no address and no gateway."""
    shape = connect.shape_for(cluster)
    if not shape.nodes or not (shape.head.address or shape.gateway):
        return ""
    return connect.ssh_command(shape, shape.head)


# What each launch command is and where it runs, in the order the panel shows them.
COMMANDS = {
    "torchrun": ("PyTorch: torchrun", "Run it on every node; the c10d rendezvous is on node-0."),
    "mpirun": ("MPI: mpirun", "Run it once, from node-0: it starts every rank from the hostfile."),
    "deepspeed": ("DeepSpeed", "Run it once, from node-0: it reads the hostfile."),
    "nccl_test": (
        "NCCL all-reduce test",
        "Run it from node-0 to measure the bandwidth between machines (nccl-tests).",
    ),
}
ENVIRONMENT_HELP = {
    "MASTER_ADDR": "the head, where rank 0 and the rendezvous run",
    "MASTER_PORT": "the rendezvous port",
    "NODE_RANK": "the node's index: 0 on node-0, 1 on node-1, …",
    "NNODES": "machines in the cluster",
    "GPUS_PER_NODE": "GPUs per machine",
    "WORLD_SIZE": "GPUs in the whole cluster",
}


def _connect_panel(cluster: Cluster) -> dict:
    """The connect panel's context: `clusters.connect.details`, with labels, and a version
    that changes whenever what the panel shows changes (a worker joins, an address arrives)."""
    info = connect.details(connect.shape_for(cluster))
    version = hashlib.sha256(json.dumps(info, sort_keys=True).encode()).hexdigest()[:12]
    head_environment = info["environment"][0]["variables"] if info["environment"] else {}
    return {
        "connect": info,
        "connect_version": version,
        # demo machines: the panel says plainly that they cannot be logged into
        "simulated": cluster.runs_simulated(),
        "commands": [
            {"key": key, "label": label, "where": where, "text": info["commands"][key]}
            for key, (label, where) in COMMANDS.items()
            if key in info["commands"]
        ],
        "environment_rows": [
            {
                "name": name,
                "value": "0 … " + str(len(info["environment"]) - 1)
                if name == "NODE_RANK"
                else value,
                "help": ENVIRONMENT_HELP.get(name, ""),
            }
            for name, value in head_environment.items()
        ],
    }


# A settled cluster (ready or degraded, no machine joining) changes only when its user acts,
# which reloads the page, or when it is stopped: a slower poll spares the server.
POLL_SECONDS_MOVING = 2
POLL_SECONDS_SETTLED = 10
# How far ahead the header is handed its cost and uptime: past the meter's next run, whose
# poll answer draws them anew (`_meter_moved`), with a settled poll's interval to spare.
COST_AHEAD_SECONDS = int(settings.RUNCRATE_METER_SECONDS) + POLL_SECONDS_SETTLED


def _poll_seconds(cluster: Cluster, nodes: list[Node]) -> int:
    settled = (
        policy.is_running(cluster.status)
        and not any(n.status == Node.Status.STARTING for n in nodes)
        and not cluster.network_test_running()
    )
    return POLL_SECONDS_SETTLED if settled else POLL_SECONDS_MOVING


def _acceptance(cluster: Cluster) -> dict | None:
    """The acceptance report as the page shows it (SPEC §3), or None before the cluster joined."""
    report = cluster.acceptance or {}
    if not report.get("nodes"):
        return None
    measured = parse_datetime(report.get("measured_at") or "")
    rows = [
        {
            **row,
            "peers": len(row.get("reachability") or {}),
            "reached": sum(1 for ok in (row.get("reachability") or {}).values() if ok),
        }
        for row in report["nodes"]
    ]
    return {"measured_at": measured, "expected": report.get("expected", {}), "nodes": rows}


def detail_context(
    cluster: Cluster, tab: Tab = TABS[0], shown_window: "MetricsWindow | None" = None
) -> dict:
    """What the page shows of the cluster itself: everything but its node rows and events,
    which the page reads whole (`with_every_row`) and a poll only where they changed. On the
    Metrics tab, the charts of `shown_window` (the default window when None)."""
    now = timezone.now()
    nodes = list(cluster.nodes.all())
    up = Cluster.machines_up_in(nodes) if cluster.is_live else 0
    # The one cost (docs/billing.md, "One cost"): the header and the Billing tab's line and
    # rows read it, at one instant; the rows only on the Billing tab.
    cost = cluster_costs([cluster.pk], now=now, rows=tab.slug == "billing")[cluster.pk]
    machines = cluster.machines_priced(up, billed=cost.machines_now)
    machine_type = cluster.machine_type
    context: dict[str, Any] = {
        "cluster": cluster,
        "now": now,
        "nodes": nodes,
        "server_now": _instant(now),
        "countdown_format": json.dumps(durations.COUNTDOWN_FORMAT),
        "machine_type": machine_type,
        "badge": STATUS_BADGES[cluster.status],
        "machines": machines,
        "price_per_hour": cluster.price_per_hour(machines),
        "cost": cost,
        "cost_ahead": "",
        "tab": tab,
        "tabs": [{"tab": t, "url": t.url(cluster), "current": t is tab} for t in TABS],
        "ready_by": _ready_by(cluster, nodes, now),
        "steps": _stepper(cluster, nodes),
        "failure_step_name": STEP_NAMES.get(cluster.failure_step, cluster.failure_step),
        "polling": not cluster.is_final,
        "poll_seconds": _poll_seconds(cluster, nodes),
        "workers_max": max(0, MAX_NODES - up),
        "create_again_url": _create_again_url(cluster) if cluster.is_final else "",
        "connect_version": "",
    }
    context["volume"] = next(iter(cluster.volumes.all()), None)
    context.update(_repair_context(cluster, nodes))
    context.update(_failure_context(cluster))
    context["acceptance"] = _acceptance(cluster)
    context.update(_network_context(cluster, nodes, now))
    if cluster.status in Cluster.BILLED:
        context.update(_reach_context(cluster, machines))
    if cluster.status == Cluster.Status.FAILED:
        context["offers_now"] = _offers_now(cluster)
    context.update(_cost_moves(cluster, tab, cost, machines))
    context.update(_tab_context(cluster, tab, cost, shown_window, now))
    context["meter_run"] = meter.last_run_stamp()
    context["poll_url"] = _poll_url(cluster, context, now)
    return context


def _cost_moves(cluster: Cluster, tab: Tab, cost: ClusterCost, machines: int) -> dict:
    """How the header's cost moves while the cluster runs. On most tabs, second by second
    until the meter's next run has the poll draw it anew (`cost_ahead`: static/js/app.js shows
    its rows; it computes nothing). On the Billing tab, whose line and rows are the same figure
    at the same instant (docs/billing.md, "One cost"), it does not tick: the poll draws the
    header and the tab together once the figure's words change (`cost_moves_in`, seconds)."""
    if not cost.running:
        return {}
    ahead = cost.ahead(price_per_hour=cluster.price_per_hour(machines), seconds=COST_AHEAD_SECONDS)
    if tab.slug == "billing":
        return {"cost_moves_in": ahead[0][0] if ahead else COST_AHEAD_SECONDS}
    return {"cost_ahead": json.dumps(ahead)}


# The repair policies as the Machines tab's form and the create form offer them, each with what
# it does (docs/lifecycle.md, "Repair").
def repair_policy_choices() -> list[dict]:
    return [
        {
            "value": Cluster.RepairPolicy.ASK,
            "label": Cluster.RepairPolicy.ASK.label,
            "help": "A lost or unhealthy worker waits for you to replace it, from the Machines "
            "tab.",
        },
        {
            "value": Cluster.RepairPolicy.AUTO,
            "label": Cluster.RepairPolicy.AUTO.label,
            "help": f"A lost worker is replaced at once; an unhealthy one once it stayed "
            f"unhealthy for {grace_words()}. Each replacement is billed like the machine it "
            "replaces.",
        },
    ]


def _repair_context(cluster: Cluster, nodes: list[Node]) -> dict:
    """The workers that may be replaced now (the degraded banner's links) and the repair
    policy's form, shown while the cluster has not ended (what `set_repair_policy` allows)."""
    return {
        "replace_names": list(replaceable_now(cluster, nodes)),
        "head_refusal": lifecycle.HEAD_REFUSAL if head_sick(cluster, nodes) else "",
        "repair_policies": repair_policy_choices(),
        "repair_grace": grace_words(),
        "repair_policy_open": cluster.can_set_repair_policy,
    }


def _network_context(cluster: Cluster, nodes: list[Node], now: datetime) -> dict:
    """The network: the last test's report, what the interconnect should give, and whether a
    test may run now (or why not)."""
    machine_type = cluster.machine_type
    return {
        "network_test": lifecycle.network_test_report(cluster, now),
        "network_expected": connect.expected_bandwidth(
            machine_type.interconnect, machine_type.get_interconnect_display()
        ),
        "ethernet": machine_type.interconnect == machine_type.Interconnect.ETHERNET,
        "can_test_network": cluster.status in Cluster.NETWORK_TESTABLE,
        "network_test_refusal": cluster.network_test_refusal(nodes, now),
    }


def _reach_context(cluster: Cluster, machines: int) -> dict:
    """How a billed cluster is reached (the SSH command to its head, the connect panel) and the
    link that asks a quote for the same machines on InfiniBand."""
    machine_type = cluster.machine_type
    context = {"ssh_head": _ssh_to_head(cluster), **_connect_panel(cluster)}
    quote = {
        "gpu": machine_type.gpu.slug,
        "nodes": machines,
        "interconnect": "infiniband",
        "location": machine_type.location.code,
    }
    context["quote_url"] = f"{reverse('offers:quote')}?{urlencode(quote)}"
    return context


def _offers_now(cluster: Cluster) -> list[dict]:
    """The offers a failed cluster could be created again on now, its own shape first, each
    with its create link and how its machines differ. Never a failure-drill location, whoever
    looks (docs/inventory.md, "Failure drills"): a suggestion is no place for hosts that fail
    on purpose."""
    machine_type = cluster.machine_type
    offers = list_offers(
        gpu=machine_type.gpu,
        nodes=cluster.size,
        include_community=machine_type.community,
        include_drills=False,
    )
    return [
        {
            "offer": offer,
            "create_url": _create_again_url(cluster, offer=offer.id),
            "other_shape": _other_shape(offer, machine_type),
        }
        for offer in same_shape_first([o for o in offers if o.is_available], like=machine_type)
    ]


def _tab_context(
    cluster: Cluster,
    tab: Tab,
    cost: ClusterCost,
    shown_window: "MetricsWindow | None",
    now: datetime,
) -> dict:
    """What only the shown tab reads: Billing its machines, Logs its sources, Metrics its
    charts, and Metrics and Machines the metrics version they show."""
    context: dict[str, Any] = {}
    if tab.slug == "billing":
        context["billed_machines"] = list(cost.rows)
    if tab.slug == "logs":
        # The machine the picker shows (the poll sends it): a redraw keeps it, not the head.
        picked = shown_window.node if shown_window else None
        context.update(logs.tab_context(cluster, node_name=picked or None))
    if tab.slug in METRICS_TABS:
        # Read before the figures: a report that lands meanwhile moves it past the version the
        # page says it shows, so the next poll draws that report too.
        context["metrics_version"] = metrics.metrics_version(cluster.pk)
    if tab.slug == "metrics":
        context.update(metrics_context(cluster, shown_window or MetricsWindow(), now))
    return context


# The longest the Metrics tab's charts wait before they are drawn anew (their own poll).
CHARTS_SECONDS = 60
# The tabs whose poll says which metrics version the page shows (`metrics=`): the Metrics tab
# redraws its charts when it moved, the Machines tab its rows' utilisation.
METRICS_TABS = ("metrics", "machines")


@dataclass(frozen=True)
class MetricsWindow:
    """What the Metrics tab was asked for: a window (`?window=`; none: the one that fits the
    cluster's age, `metrics.fitting_window`), a node's detail (`?node=`), and a window it does
    not know (said on the page, and the fitting one shown)."""

    name: str = ""  # "": the window that fits the cluster's age
    node: str = ""  # the node whose detail is shown, as asked (checked against the nodes)
    unknown: str = ""  # a window asked for that does not exist

    @classmethod
    def of(cls, raw: str | None, node: str | None = None) -> "MetricsWindow":
        node = (node or "")[:40]
        if raw is None or raw == "" or raw in metrics.WINDOWS:
            return cls(raw or "", node)
        return cls("", node, unknown=raw[:20])


def metrics_context(
    cluster: Cluster, shown: MetricsWindow, now: datetime, *, cells: bool = True
) -> dict:
    """The Metrics tab: the cluster view (clusters.web.heatmap) and the cluster's charts
    (clusters.web.charts) of the window, the asked node's detail, and the links that keep the
    window and the node, all from metrics.window's five queries whatever the node count;
    without `cells`, the heatmaps' cells are not drawn (the charts' own poll)."""
    url = TABS_BY_SLUG["metrics"].url(cluster)
    name = shown.name or metrics.fitting_window(cluster, now=now)
    read = metrics.window(cluster, name, now=now)
    names = [node.node.name for node in read.nodes]
    node = shown.node if shown.node in names else ""
    refusals = []
    if shown.unknown:
        words = charts.WINDOW_WORDS[name]
        refusals.append(f"There is no window “{shown.unknown}”: showing {words}.")
    if shown.node and not node:
        refusals.append(f"There is no live machine “{shown.node}”: showing the whole cluster.")

    def link(window: str, picked: str, **more: str) -> str:
        return _metrics_link(url, window, picked, **more)

    return {
        "metrics_window": shown,
        "metrics_window_name": name,
        "metrics_node": node,
        "metrics_refusals": refusals,
        "metrics_charts": charts.window_charts(
            charts.drawn_from(read, cluster.ready_at), detail={node} if node else ()
        ),
        "metrics_view": heatmap.cluster_view(read, cells=cells),
        "metrics_windows": [
            {"name": choice, "url": link(choice, node), "current": choice == name}
            for choice in metrics.WINDOWS
        ],
        "metrics_url": url,
        # A node's detail: this, then its name (node names need no quoting).
        "metrics_node_base": link(shown.name, "") + ("&" if shown.name else "?") + "node=",
        "metrics_node_names": names,
        "metrics_close_url": link(shown.name, ""),
        # The charts redraw on their own poll, at the window's resolution (a minute at most,
        # so the times under them move): a moved poll sends the figures alone (issue 38).
        "metrics_charts_url": link(shown.name, node, part="charts"),
        "metrics_charts_seconds": min(read.resolution_seconds, CHARTS_SECONDS),
        "metrics_now": None,  # the page's cells are drawn; a moved poll sends `figures_now`
    }


def _metrics_link(url: str, window: str, picked: str, **more: str) -> str:
    """The Metrics tab's `url` asking for `window` and `picked`'s detail (each when given)."""
    query = {"window": window, "node": picked, **more}
    return f"{url}?{urlencode({k: v for k, v in query.items() if v})}".rstrip("?")


def metrics_figures(
    cluster_id: int, shown: MetricsWindow, grid: str | None, now: datetime
) -> dict | None:
    """What a Metrics tab poll sends when only the figures moved (issue 38): the latest
    figures for the page's script (`heatmap.figures_now`), the named nodes and the picked
    node's GPUs, from `metrics.latest`'s one query whatever the node count. None when the
    page's cells are not drawn of what the cluster has now (its `grid`): the panel is drawn
    whole then."""
    # Every figure of each GPU where a node is picked (its GPUs' table says them all), else
    # only what the heatmaps and the named nodes are made of.
    columns = None if shown.node else heatmap.HEAT_READS
    read = metrics.latest(cluster_id, now=now, columns=columns)
    view = heatmap.cluster_view(read, cells=False)
    if grid != view.grid:
        return None
    url = reverse("clusters:tab", args=[cluster_id, "metrics"])
    node = shown.node if shown.node in {n.node.name for n in read.nodes} else ""
    context: dict[str, Any] = {
        "view": view,
        "metrics_now": heatmap.figures_now(read, view),
        "metrics_node_base": _metrics_link(url, shown.name, "")
        + ("&" if shown.name else "?")
        + "node=",
        "named_oob": True,
    }
    if node:
        context["node"] = charts.window_charts(read, detail={node}).nodes[0]
        context["metrics_close_url"] = _metrics_link(url, shown.name, "")
        context["node_oob"] = True
    return context


def _other_shape(offer: Offer, machine_type: MachineType) -> str:
    """How an alternative's machines differ from the failed cluster's, as the page says it
    (GPUs per machine, then kind), or "" for the same shape."""
    other = offer.machine_type
    changes = []
    if other.gpus_per_machine != machine_type.gpus_per_machine:
        changes.append(
            f"{other.gpus_per_machine} GPU{pluralize(other.gpus_per_machine)} per machine, "
            f"not {machine_type.gpus_per_machine}"
        )
    if other.machine_kind != machine_type.machine_kind:
        changes.append(
            f"{other.get_machine_kind_display().lower()}, not "
            f"{machine_type.get_machine_kind_display().lower()}"
        )
    return "; ".join(changes)


def _ready_by(cluster: Cluster, nodes: list[Node], now: datetime) -> dict | None:
    """The estimated time to ready while the cluster starts, for the page's countdown."""
    at = estimates.ready_by(cluster, nodes)
    if at is None:
        return None
    left = int((at - now).total_seconds())
    return {"at": _instant(at), "left": durations.countdown(left), "overdue": left <= 0}


def with_every_row(context: dict) -> dict:
    """The context of a page whose tab shows every node row (Machines) or every event (Events,
    read prefetched); the other tabs show neither, and read neither."""
    cluster, tab = context["cluster"], context["tab"]
    if tab.slug == "machines":
        context["node_rows"] = node_rows(cluster, context["nodes"], context["now"])
    if tab.slug == "events":
        context["events"] = list(cluster.events.all())
    return context


def _poll_url(cluster: Cluster, context: dict, now: datetime) -> str:
    """Where the page polls (its tab's own URL), saying what it shows (docs/clusters.md, "The
    poll"): the cluster's version, how many node rows, the connect panel's version, the meter
    run its balance is from, and, while a network test runs, until when what it shows holds: a
    test past its time reads as failed with nothing written."""
    query: dict[str, str | int] = {
        "version": cluster.version,
        "nodes": len(context["nodes"]),
        "connect": context["connect_version"],
        "meter": context["meter_run"],
    }
    if "metrics_version" in context:
        query["metrics"] = context["metrics_version"]
    if "metrics_window" in context:
        # The window only when one was asked for (else it follows the cluster's age), and the
        # node whose detail the page shows.
        if context["metrics_window"].name:
            query["window"] = context["metrics_window"].name
        if context["metrics_node"]:
            query["node"] = context["metrics_node"]
        # What its cells are drawn of: while the same, a moved poll sends the figures alone.
        query["grid"] = context["metrics_view"].grid
    holds: list[int] = []
    if cluster.network_test_running(now):
        expires = datetime.fromisoformat(cluster.network_test["expires_at"])
        holds.append(math.ceil(expires.timestamp()))
    if "cost_moves_in" in context:  # the Billing tab: redrawn with the header's cost
        holds.append(math.ceil(now.timestamp()) + context["cost_moves_in"])
    if holds:
        query["until"] = min(holds)
    return f"{context['tab'].url(cluster)}?{urlencode(query)}"
