"""The Clusters pages: the list, the create form, the cluster page and its actions.

Views stay thin: every change goes through `clusters.lifecycle`, and what they add is only how
a cluster reads on a page (its stepper, its nodes' progress). Every lookup is scoped to the
request's project, so another project's cluster is a 404.
"""

import hashlib
import json
import math
from dataclasses import dataclass, field, replace
from datetime import datetime
from decimal import Decimal
from typing import Any
from urllib.parse import urlencode

from django.contrib import messages
from django.contrib.auth.decorators import login_required
from django.core.paginator import Paginator
from django.db.models import Case, Count, Prefetch, Q, QuerySet, Value, When
from django.http import Http404, HttpResponse
from django.shortcuts import get_object_or_404, redirect, render
from django.template.defaultfilters import pluralize
from django.template.loader import render_to_string
from django.urls import reverse
from django.utils import timezone
from django.utils.cache import patch_vary_headers
from django.utils.dateparse import parse_datetime
from django.views.decorators.http import require_http_methods, require_POST

from accounts import permissions
from accounts.projects import get_for_project, in_project, require_project
from accounts.requests import ProjectRequest
from billing import balances, ledger, meter
from billing.context_processors import request_summary
from billing.usage import ClusterCost, MachineRow, Month, cluster_costs, machine_rows
from clusters import charts, connect, estimates, getting_started, lifecycle, logs, metrics, volumes
from clusters.errors import ClusterRefused
from clusters.forms import ClusterForm, VolumeForm, suggest_name
from clusters.models import STEP_NAMES, Cluster, Event, Node, Volume, give_up_after
from offers.models import MAX_NODES, MIN_NODES, TOO_FEW_NODES, MachineType
from offers.offers import Offer, get_offer, list_offers, same_shape_first
from offers.quotes import quotes_for
from runcrate import durations, outages
from runcrate.money import usd

CLUSTERS_PER_PAGE = 50
# htmx stops polling when a poll is answered with this status.
STOP_POLLING = 286

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
# The htmx target a tab link swaps (templates/clusters/parts/tab_nav.html).
TAB_PANEL = "cluster-tab"


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
    }
    return f"{reverse('clusters:new')}?{urlencode(query)}"


# --- the list ---------------------------------------------------------------------------------


@dataclass(frozen=True)
class ClusterRow:
    cluster: Cluster
    machines: int
    price_per_hour: Decimal
    badge: str
    age: str
    cost: ClusterCost  # cost so far and uptime
    trace: charts.Sparkline | None  # its mean GPU utilisation over the last hour


def _cluster_rows(clusters, now: datetime) -> list[ClusterRow]:
    clusters = list(clusters)
    costs = cluster_costs([cluster.pk for cluster in clusters], now=now)  # one query
    # One query for every live cluster of the page (none when none is live).
    traces = metrics.utilization_traces([c.pk for c in clusters if c.is_live], now=now)
    rows = []
    for cluster in clusters:
        machines = cluster.machines_priced(cluster.machines_up)
        rows.append(
            ClusterRow(
                cluster=cluster,
                machines=machines,
                price_per_hour=cluster.price_per_hour(machines),
                badge=STATUS_BADGES[cluster.status],
                age=durations.age(cluster.created_at, now),
                cost=costs[cluster.pk],
                trace=charts.sparkline(traces.get(cluster.pk, []), now=now),
            )
        )
    return rows


# The list's filter (docs/clusters.md, "The list"): live or ended by the model's own groups
# (Cluster.LIVE, Cluster.TERMINAL); "all" is the default and shows the live ones first.
CLUSTER_SHOWS: dict[str, str] = {"all": "All", "live": "Live", "ended": "Ended"}
# The longest name search kept: a cluster's name is shorter still.
CLUSTER_SEARCH_MAX = 100


@dataclass(frozen=True)
class ClusterFilter:
    show: str  # a key of CLUSTER_SHOWS
    query: str  # a part of the name, "" for none
    # Counted for the full page only (`_counted`); the rows' poll needs neither.
    total: int = 0  # the project's clusters, whatever the filter
    counts: dict[str, int] = field(default_factory=dict)  # per key of CLUSTER_SHOWS, searched

    def links(self) -> list[tuple[str, str, int, str]]:
        """(key, label, count, url) for each choice, keeping the search."""
        links = []
        for key, label in CLUSTER_SHOWS.items():
            query = {"q": self.query} if self.query else {}
            if key != "all":
                query["show"] = key
            links.append((key, label, self.counts[key], f"?{urlencode(query)}"))
        return links


def _cluster_filter(request: ProjectRequest) -> ClusterFilter:
    show = request.GET.get("show", "all")
    query = request.GET.get("q", "").strip()[:CLUSTER_SEARCH_MAX]
    return ClusterFilter(show if show in CLUSTER_SHOWS else "all", query)


def _counted(shown: ClusterFilter, clusters: QuerySet[Cluster]) -> ClusterFilter:
    found = Q(name__icontains=shown.query) if shown.query else Q()
    counts = clusters.aggregate(  # one query, however many clusters
        total=Count("pk"),
        all=Count("pk", filter=found),
        live=Count("pk", filter=found & Q(status__in=Cluster.LIVE)),
        ended=Count("pk", filter=found & Q(status__in=Cluster.TERMINAL)),
    )
    return replace(shown, total=counts.pop("total"), counts=counts)


def _filtered(clusters: QuerySet[Cluster], shown: ClusterFilter) -> QuerySet[Cluster]:
    if shown.query:
        clusters = clusters.filter(name__icontains=shown.query)
    if shown.show == "live":
        clusters = clusters.filter(status__in=Cluster.LIVE)
    elif shown.show == "ended":
        clusters = clusters.filter(status__in=Cluster.TERMINAL)
    ended = Case(When(status__in=Cluster.TERMINAL, then=Value(1)), default=Value(0))
    return clusters.alias(ended=ended).order_by("ended", "-created_at", "-pk")


@login_required
def cluster_list(request: ProjectRequest) -> HttpResponse:
    project = require_project(request)
    shown = _cluster_filter(request)
    clusters = (
        _filtered(Cluster.objects.filter(project=project), shown)
        .select_related("environment", "machine_type__location", "machine_type__gpu", "quote")
        .annotate(machines_up=Count("nodes", filter=Q(nodes__status__in=Node.LIVE)))
    )
    page = Paginator(clusters, CLUSTERS_PER_PAGE).get_page(request.GET.get("page"))
    rows = _cluster_rows(page, timezone.now())
    polling = any(row.cluster.is_live for row in rows)
    context: dict[str, Any] = {"page": page, "rows": rows, "polling": polling}
    if request.htmx:
        response = render(request, "clusters/list.html#rows", context)
        if not polling:
            response.status_code = STOP_POLLING
    else:
        context["shown"] = shown = _counted(shown, Cluster.objects.filter(project=project))
        context["quotes"] = list(quotes_for(request.project))
        context["getting_started"] = getting_started.steps(
            project=request.project,
            role=permissions.request_role(request),
            has_clusters=shown.total > 0,
        )
        response = render(request, "clusters/list.html", context)
    patch_vary_headers(response, ("HX-Request",))
    return response


# --- the create form --------------------------------------------------------------------------


def _requested_nodes(raw: str | None) -> int:
    try:
        return int(raw or MIN_NODES)
    except ValueError:
        return MIN_NODES


def _covers(balance: Decimal, per_hour: Decimal) -> Decimal | None:
    """The seconds `balance` pays for at `per_hour`."""
    return balance * 3600 / per_hour if per_hour > 0 and balance > 0 else None


def _summary(request: ProjectRequest, offer: Offer, nodes: int) -> dict:
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


@permissions.page_requires("clusters.manage")
@require_http_methods(["GET", "POST"])
def cluster_new(request: ProjectRequest) -> HttpResponse:
    # The price card reads the project's balance and the form its keys: a user in no project
    # gets the 404 every project page gives (accounts/projects.py), before any of that.
    project = require_project(request)
    data = request.POST if request.method == "POST" else request.GET
    nodes = _requested_nodes(data.get("nodes"))
    offer = get_offer(slug=data.get("offer", ""), nodes=nodes)
    if offer is None:
        context: dict[str, Any] = {"offer_slug": data.get("offer", "")}
        return render(request, "clusters/new.html", context, status=404)

    if request.htmx and request.method == "GET":  # the price summary follows the nodes field
        context = {"offer": offer, "summary": _summary(request, offer, nodes)}
        return render(request, "clusters/new.html#summary", context)

    suggested = ""
    if request.method == "POST":
        form = ClusterForm(request.POST, project=project, offer=offer, user=request.user)
        if form.is_valid():
            cleaned = form.cleaned_data
            try:
                cluster = lifecycle.create_cluster(
                    project=project,
                    user=request.user,
                    environment=cleaned["environment"],
                    offer_slug=offer.id,
                    nodes=cleaned["nodes"],
                    name=cleaned["name"],
                    software=cleaned["software"],
                    ssh_key_ids=[key.pk for key in cleaned["ssh_keys"]],
                    volume_id=cleaned["volume"],
                )
            except ClusterRefused as refusal:
                form.add_refusal(refusal)
            else:
                # No flash: the cluster page says it is starting while it provisions, and stops
                # saying so once it is past that (docs/clusters.md).
                return redirect("clusters:detail", pk=cluster.pk)
    else:
        initial = {"offer": offer.id, "nodes": nodes}
        for key in ("name", "software", "environment", "volume"):
            if data.get(key):
                initial[key] = data[key]
        if "name" not in initial:
            initial["name"] = suggested = suggest_name(project=project, offer=offer, nodes=nodes)
        form = ClusterForm(initial=initial, project=project, offer=offer, user=request.user)

    machine_type = offer.machine_type
    assert isinstance(machine_type, MachineType)  # get_offer's offer holds the model
    boot = machine_type.boot_seconds
    context = {
        "offer": offer,
        "form": form,
        "has_keys": form.has_ssh_keys,
        "summary": _summary(request, offer, nodes),
        "min_nodes": MIN_NODES,
        "ready_estimate": {
            "bare": estimates.time_to_ready(boot_seconds=boot, software=Cluster.Software.NONE),
            "software": estimates.time_to_ready(boot_seconds=boot, software=Cluster.Software.SLURM),
            "give_up_after": give_up_after(machine_type.slow_boot),
        },
        "name_suggested": bool(suggested),
    }
    return render(request, "clusters/new.html", context, status=400 if form.errors else 200)


# --- the cluster page ---------------------------------------------------------------------------


# What the agent and the drivers write on a node row and the page never shows: its GPUs, its
# reachability row (one entry per peer, so 64 × 64 at 64 nodes) and the drivers' records.
NODE_COLUMNS_UNSHOWN = ("gpus", "reachability", "driver_state")


def _page_nodes() -> QuerySet[Node]:
    return Node.objects.defer(*NODE_COLUMNS_UNSHOWN).order_by("index")


def _page_events() -> QuerySet[Event]:
    unshown = [f"node__{column}" for column in NODE_COLUMNS_UNSHOWN]
    return Event.objects.select_related("node").defer(*unshown).order_by("-at", "-pk")


def _clusters_with_details(*, events: bool = True) -> QuerySet[Cluster]:
    """One cluster's page in a fixed number of queries, whatever its number of nodes; a poll's
    answer reads only the events it sends (`events=False`)."""
    prefetch = [
        Prefetch("nodes", queryset=_page_nodes()),
        Prefetch("volumes", queryset=Volume.objects.select_related("location")),
    ]
    if events:
        prefetch.append(Prefetch("events", queryset=_page_events()))
    return Cluster.objects.select_related(
        "environment", "machine_type__location", "machine_type__gpu", "quote__gpu"
    ).prefetch_related(*prefetch)


def _get_cluster_for_user(request: ProjectRequest, pk: int, *, details: bool = False) -> Cluster:
    if details:
        return get_for_project(request, _clusters_with_details(), pk=pk)
    queryset = Cluster.objects.select_related("environment")
    return get_for_project(request, queryset, pk=pk)


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


def _node_rows(cluster: Cluster, nodes: list[Node], now: datetime) -> list[NodeRow]:
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
        doing = NODE_STEP_PHRASES.get(node.step, node.step)
        if node.status == Node.Status.FAILED:
            tone = "bad"
            doing = f"Failed at {STEP_NAMES.get(node.step, node.step).lower()}"
        elif node.status == Node.Status.LOST:
            tone = "bad"
            heard = node.heartbeat_at or node.ended_at
            doing = f"Lost: silent since {heard:%H:%M:%S} UTC" if heard else "Lost"
        elif install_failed and node.step == Node.Step.INSTALL:
            # The install stopped: the node that failed says so, the others did not finish.
            failed_here = node.name == cluster.failure_node
            tone = "bad" if failed_here else ""
            doing = "Install failed" if failed_here else "Install stopped"
        elif done == total:
            tone = "ok"
        else:
            tone = ""
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
                problems=tuple(cluster.problems_of(node.name)),
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
    return _page_events().filter(cluster=cluster, reason__in=reasons).first()


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


def _poll_seconds(cluster: Cluster, nodes: list[Node]) -> int:
    settled = (
        cluster.status in (Cluster.Status.READY, Cluster.Status.DEGRADED)
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


def _detail_context(
    cluster: Cluster, tab: Tab = TABS[0], shown_window: "MetricsWindow | None" = None
) -> dict:
    """What the page shows of the cluster itself: everything but its node rows and events,
    which the page reads whole (`_with_every_row`) and a poll only where they changed. On the
    Metrics tab, the charts of `shown_window` (the default window when None)."""
    now = timezone.now()
    nodes = list(cluster.nodes.all())
    up = Cluster.machines_up_in(nodes) if cluster.is_live else 0
    cost = cluster_costs([cluster.pk], now=now)[cluster.pk]
    # An ended cluster is priced for the machines it was billed for (a worker added counts),
    # a live one for those up (or the size it starts with).
    machines = cost.machines if cluster.is_final and cost.machines else cluster.machines_priced(up)
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
    context.update(_failure_context(cluster))
    context["acceptance"] = _acceptance(cluster)
    context["network_test"] = lifecycle.network_test_report(cluster, now)
    context["network_expected"] = connect.expected_bandwidth(
        machine_type.interconnect, machine_type.get_interconnect_display()
    )
    context["ethernet"] = machine_type.interconnect == machine_type.Interconnect.ETHERNET
    context["can_test_network"] = cluster.status in Cluster.NETWORK_TESTABLE
    context["network_test_refusal"] = cluster.network_test_refusal(nodes, now)
    if cluster.status in Cluster.BILLED:
        context["ssh_head"] = _ssh_to_head(cluster)
        context.update(_connect_panel(cluster))
        quote = {
            "gpu": machine_type.gpu.slug,
            "nodes": machines,
            "interconnect": "infiniband",
            "location": machine_type.location.code,
        }
        context["quote_url"] = f"{reverse('offers:quote')}?{urlencode(quote)}"
    if cluster.status == Cluster.Status.FAILED:
        offers = list_offers(
            gpu=machine_type.gpu, nodes=cluster.size, include_community=machine_type.community
        )
        context["offers_now"] = [
            {
                "offer": offer,
                "create_url": _create_again_url(cluster, offer=offer.id),
                "other_shape": _other_shape(offer, machine_type),
            }
            for offer in same_shape_first([o for o in offers if o.is_available], like=machine_type)
        ]
    if tab.slug == "billing":
        context["billed_machines"] = _billed_machines(cluster, cost, now)
    if tab.slug == "logs":
        context.update(logs.tab_context(cluster))
    if tab.slug in METRICS_TABS:
        # Read before the figures: a report that lands meanwhile moves it past the version the
        # page says it shows, so the next poll draws that report too.
        context["metrics_version"] = metrics.metrics_version(cluster.pk)
    if tab.slug == "metrics":
        context.update(_metrics_context(cluster, shown_window or MetricsWindow(), now))
    context["meter_run"] = meter.last_run_stamp()
    context["poll_url"] = _poll_url(cluster, context, now)
    return context


# The tabs whose poll says which metrics version the page shows (`metrics=`): the Metrics tab
# redraws its charts when it moved, the Machines tab its rows' utilisation.
METRICS_TABS = ("metrics", "machines")
DEFAULT_WINDOW = "15m"


@dataclass(frozen=True)
class MetricsWindow:
    """The window the Metrics tab shows (`?window=`), and what to say of one it does not know."""

    name: str = DEFAULT_WINDOW
    refused: str = ""

    @classmethod
    def of(cls, raw: str | None) -> "MetricsWindow":
        if raw is None or raw == "" or raw in metrics.WINDOWS:
            return cls(raw or DEFAULT_WINDOW)
        shown = charts.WINDOW_WORDS[DEFAULT_WINDOW]
        return cls(refused=f"There is no window “{raw[:20]}”: showing {shown}.")


def _metrics_context(cluster: Cluster, shown: MetricsWindow, now: datetime) -> dict:
    """The Metrics tab: the window's charts (clusters.charts, from metrics.window's five
    queries) and the window picker's links."""
    url = TABS_BY_SLUG["metrics"].url(cluster)
    return {
        "metrics_window": shown,
        "metrics_charts": charts.window_charts(metrics.window(cluster, shown.name, now=now)),
        "metrics_windows": [
            {"name": name, "url": f"{url}?window={name}", "current": name == shown.name}
            for name in metrics.WINDOWS
        ],
    }


def _billed_machines(cluster: Cluster, cost: ClusterCost, now: datetime) -> list[MachineRow]:
    """Every machine billed for the cluster, a row per machine and calendar month it ran in,
    as the Billing page's statement shows them (billing.usage.machine_rows)."""
    if cost.billed_from is None:
        return []
    month, last = Month.of(cost.billed_from), Month.of(cost.billed_until or now)
    rows: list[MachineRow] = []
    while month.start <= last.start:
        rows += machine_rows(cluster=cluster, month=month)
        month = month.next
    return rows


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


def _with_every_row(context: dict) -> dict:
    """The context of a page that shows every node row and every event (read prefetched)."""
    cluster = context["cluster"]
    context["node_rows"] = _node_rows(cluster, context["nodes"], context["now"])
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
        query["window"] = context["metrics_window"].name
    if cluster.network_test_running(now):
        expires = datetime.fromisoformat(cluster.network_test["expires_at"])
        query["until"] = math.ceil(expires.timestamp())
    return f"{context['tab'].url(cluster)}?{urlencode(query)}"


def _count(raw: str | None) -> int | None:
    """A whole number ≥ 0 from the query string, or None for anything else."""
    if raw and len(raw) <= 20 and raw.isascii() and raw.isdigit():
        return int(raw)
    return None


@login_required
def cluster_detail(request: ProjectRequest, pk: int, tab: str = TABS[0].slug) -> HttpResponse:
    """The page on one of its tabs (`TABS`, each its own URL), and its poll (htmx). A poll that
    says which version it shows is answered from the cluster's version alone while nothing
    changed (`_poll`); one that does not gets the whole answer: the header, and the tab's
    panel out of band (on the Connect tab, the panel only when it differs from the version the
    page shows: the poll's `connect`, so a poll never touches a panel the user is selecting or
    copying from). A tab link (htmx, aimed at the panel) gets the tab's panel, with the header
    and the tab list out of band."""
    shown_tab = TABS_BY_SLUG.get(tab)
    if shown_tab is None:
        raise Http404("No such tab.")
    shown = _count(request.GET.get("version")) if request.htmx else None
    shown_window = MetricsWindow.of(request.GET.get("window")) if tab == "metrics" else None
    if shown is not None:
        response = _poll(request, pk, shown, shown_tab, shown_window)
    else:
        cluster = _get_cluster_for_user(request, pk, details=True)
        context = _with_every_row(_detail_context(cluster, shown_tab, shown_window))
        if request.htmx and request.headers.get("HX-Target") == TAB_PANEL:
            response = _tab_answer(request, context)
        elif request.htmx:
            response = _whole_answer(request, cluster, context)
        else:
            response = render(request, "clusters/detail.html", context)
    patch_vary_headers(response, ("HX-Request", "HX-Target"))
    return response


def _tab_answer(request: ProjectRequest, context: dict) -> HttpResponse:
    """A tab link's answer: the tab's panel, and the header (its poll now asks for this tab)
    and the tab list (which says which tab is current) out of band."""
    parts = [render_to_string("clusters/parts/tab_panel.html", context, request)]
    context["header_oob"] = True
    parts.append(render_to_string("clusters/parts/header.html", context, request))
    parts.append(render_to_string("clusters/parts/tab_nav.html", context, request))
    return HttpResponse("".join(parts))


def _meter_moved(request: ProjectRequest) -> bool:
    """Whether the meter ran since the page's balance was drawn (the poll's `meter`): a cache
    read, no query."""
    return request.GET.get("meter", "") != meter.last_run_stamp()


def _metrics_moved(request: ProjectRequest, pk: int) -> bool:
    """Whether a report came since the page's figures were drawn (the poll's `metrics`): a
    cache read, no query. A page that does not say (another tab) has none to redraw."""
    shown = request.GET.get("metrics")
    return shown is not None and shown != str(metrics.metrics_version(pk))


def _poll(
    request: ProjectRequest,
    pk: int,
    shown: int,
    tab: Tab,
    shown_window: MetricsWindow | None = None,
) -> HttpResponse:
    """The page's poll, showing version `shown`. Unchanged: one query (the cluster's version,
    looked up within the user's project) and `204`, which htmx swaps nothing for; `286`, which
    stops the polling, when the cluster is final. Changed, or the meter ran since (which moves
    the cost and the balance), or on the Metrics and Machines tabs a report came (the metrics
    version moved, not the cluster's): what changed since `shown`, with the top bar's
    balance."""
    clusters = in_project(request, Cluster.objects.all()).values_list("version", "status")
    try:
        version, status = clusters.get(pk=pk)
    except Cluster.DoesNotExist:
        raise Http404("No such cluster in your project.") from None
    moved = _meter_moved(request)
    # Asked after the cluster was found in the user's project: a stranger learns nothing.
    metrics_moved = tab.slug in METRICS_TABS and _metrics_moved(request, pk)
    if status in Cluster.TERMINAL:
        # An ended cluster's page stops polling; its last answer said it all.
        moved = metrics_moved = False
    if version == shown and _still_holds(request) and not moved and not metrics_moved:
        if status in Cluster.TERMINAL:
            response = HttpResponse(status=STOP_POLLING)
            response["HX-Reswap"] = "none"
            return response
        return HttpResponse(status=204)
    queryset = in_project(request, _clusters_with_details(events=False))
    cluster = get_object_or_404(queryset, pk=pk)
    context = _detail_context(cluster, tab, shown_window)
    context["balance_moved"] = moved
    context["metrics_moved"] = metrics_moved
    # The last answer once final (the page as it stays, and the polling stops), and the answer
    # to a page ahead of the cluster (a version it never had: nothing can say what changed).
    if cluster.is_final or shown > cluster.version:
        context["events"] = list(_page_events().filter(cluster=cluster))
        context["node_rows"] = _node_rows(cluster, context["nodes"], context["now"])
        return _whole_answer(request, cluster, context)
    return _changes_answer(request, cluster, context, shown)


def _still_holds(request: ProjectRequest) -> bool:
    """Whether what the page shows holds now, as far as the clock goes (the poll's `until`)."""
    raw = request.GET.get("until")
    if raw is None:
        return True
    until = _count(raw)
    return until is not None and timezone.now().timestamp() < until


def _whole_answer(request: ProjectRequest, cluster: Cluster, context: dict) -> HttpResponse:
    """The header, and the tab's panel out of band."""
    parts: list[str] = [render_to_string("clusters/parts/header.html", context, request)]
    parts += _tab_parts(request, context)
    parts += _balance_part(request, context)
    response = HttpResponse("".join(parts))
    if cluster.is_final:
        response.status_code = STOP_POLLING
    return response


def _tab_parts(request: ProjectRequest, context: dict) -> list[str]:
    """The tab's panel, out of band; on the Connect tab only when the page's panel is not the
    one the cluster has now (the poll's `connect`): the connect panel alone while the machines
    stay up, the whole tab when they come up or go."""
    shown_connect = request.GET.get("connect")
    if context["tab"].slug == "connect" and shown_connect is not None:
        if shown_connect == context["connect_version"]:
            return []
        if shown_connect and context["connect_version"]:
            context["oob"] = True
            return [render_to_string("clusters/tabs/connect.html", context, request)]
    context["panel_oob"] = True
    return [render_to_string("clusters/parts/tab_panel.html", context, request)]


def _balance_part(request: ProjectRequest, context: dict) -> list[str]:
    """The top bar's balance, out of band, once the meter ran since the page drew it."""
    if not context.get("balance_moved"):
        return []
    balance = {"topbar_balance": request_summary(request), "balance_oob": True}
    return [render_to_string("billing/topbar_balance.html", balance, request)]


def _changes_answer(request: ProjectRequest, cluster: Cluster, context: dict, shown: int):
    """What changed since version `shown`: the header (which carries the new version in its
    poll), then out of band what the tab shows of it: on Machines the node rows stamped after
    `shown`, the rows the page lacks (workers added), the reports and the machines' actions;
    on Events the events that came after `shown`; on Connect the panel when its version
    differs from the page's; on the other tabs their panel whole."""
    parts: list[str] = [render_to_string("clusters/parts/header.html", context, request)]
    tab = context["tab"].slug
    if tab == "machines":
        nodes, now = context["nodes"], context["now"]
        on_page = _count(request.GET.get("nodes"))
        on_page = len(nodes) if on_page is None else on_page
        # A report moves every row's utilisation: all of them, then.
        redraw = context.get("metrics_moved", False)
        changed = [n for n in nodes if n.index < on_page and (redraw or n.version > shown)]
        context["changed_rows"] = _node_rows(cluster, changed, now)
        context["added_rows"] = _node_rows(cluster, [n for n in nodes if n.index >= on_page], now)
        context["oob"] = context["reports_oob"] = True
        parts.append(render_to_string("clusters/parts/changes.html", context, request))
        parts.append(render_to_string("clusters/parts/machines_actions.html", context, request))
        parts.append(render_to_string("clusters/parts/reports.html", context, request))
    elif tab == "events":
        # Up to the version read: an event written since comes with the next poll, and only then.
        context["new_events"] = list(
            _page_events().filter(cluster=cluster, version__gt=shown, version__lte=cluster.version)
        )
        parts.append(render_to_string("clusters/parts/changes.html", context, request))
    elif shown != cluster.version or tab in ("connect", "billing") or context.get("metrics_moved"):
        # (Overview, when only the meter ran, has nothing new: the header has the cost.)
        parts += _tab_parts(request, context)
    parts += _balance_part(request, context)
    return HttpResponse("".join(parts))


# --- actions --------------------------------------------------------------------------------


@permissions.page_requires("clusters.manage")
@require_http_methods(["GET", "POST"])
@outages.committing
def cluster_terminate(request: ProjectRequest, pk: int) -> HttpResponse:
    """GET asks for confirmation, POST terminates: the confirmation works without JavaScript."""
    cluster = _get_cluster_for_user(request, pk)
    if request.method == "GET":
        machines = cluster.nodes.filter(status__in=Node.LIVE).count()
        context = {"cluster": cluster, "machines": machines}
        return render(request, "clusters/terminate.html", context)
    try:
        lifecycle.terminate(cluster=cluster, user=request.user)
    except ClusterRefused as refusal:
        messages.error(request, refusal.message)
    else:
        messages.success(
            request, f"Terminating {cluster.name}: every machine stops and billing ends now."
        )
    return redirect("clusters:detail", pk=cluster.pk)


@permissions.page_requires("clusters.manage")
@require_POST
@outages.committing
def cluster_retry_install(request: ProjectRequest, pk: int) -> HttpResponse:
    cluster = _get_cluster_for_user(request, pk)
    try:
        lifecycle.retry_install(cluster=cluster)
    except ClusterRefused as refusal:
        messages.error(request, refusal.message)
    else:
        messages.success(request, f"Installing {cluster.get_software_display()} again.")
    return redirect("clusters:detail", pk=cluster.pk)


@permissions.page_requires("clusters.manage")
@require_POST
@outages.committing
def cluster_add_workers(request: ProjectRequest, pk: int) -> HttpResponse:
    cluster = _get_cluster_for_user(request, pk)
    try:
        count = int(request.POST.get("count", ""))
    except ValueError:
        messages.error(request, "Say how many workers to add, as a whole number.")
        return redirect("clusters:detail", pk=cluster.pk)
    try:
        lifecycle.add_workers(cluster=cluster, count=count)
    except ClusterRefused as refusal:
        messages.error(request, refusal.message)
    else:
        noun = "worker" if count == 1 else "workers"
        messages.success(request, f"Adding {count} {noun}: each is billed once it is up.")
    return redirect("clusters:tab", pk=cluster.pk, tab="machines")


@permissions.page_requires("clusters.manage")
@require_POST
@outages.committing
def cluster_network_test(request: ProjectRequest, pk: int) -> HttpResponse:
    """Start the network test. Without JavaScript: a message and back to the page; with htmx:
    the page's poll answer at once, so the running test shows and the page polls fast."""
    cluster = _get_cluster_for_user(request, pk)
    refused = ""
    try:
        lifecycle.run_network_test(cluster=cluster, user=request.user)
    except ClusterRefused as refusal:
        refused = refusal.message
    if not request.htmx:
        if refused:
            messages.error(request, refused)
        else:
            messages.success(request, "Network test started: the result shows on this page.")
        return redirect("clusters:tab", pk=cluster.pk, tab="machines")
    cluster = _get_cluster_for_user(request, pk, details=True)
    context = _with_every_row(_detail_context(cluster, TABS_BY_SLUG["machines"]))
    context["network_test_refused"] = refused
    response = _whole_answer(request, cluster, context)
    patch_vary_headers(response, ("HX-Request",))
    return response


# --- downloads: the SSH config, the hostfile, the kubeconfig -----------------------------------


def _connectable(request: ProjectRequest, pk: int, what: str) -> Cluster | HttpResponse:
    """The project's cluster while its machines are up. Once they are gone (or going) the
    owner is sent to the cluster's page, saying why: the ready email's links outlive the
    cluster. Before they are up, and for another project's cluster, a 404."""
    queryset = Cluster.objects.select_related("machine_type__location").prefetch_related(
        "nodes", "volumes"
    )
    cluster = get_for_project(request, queryset, pk=pk)
    if cluster.status in Cluster.BILLED:
        return cluster
    if cluster.status == Cluster.Status.PROVISIONING:
        raise Http404("This cluster's machines are not up.")
    ended = "has ended" if cluster.is_final else "is terminating"
    messages.info(request, f"This cluster {ended}; its {what} is gone with it.")
    return redirect("clusters:detail", cluster.pk)


def _download(content: str, filename: str, content_type: str) -> HttpResponse:
    response = HttpResponse(content, content_type=f"{content_type}; charset=utf-8")
    response["Content-Disposition"] = f'attachment; filename="{filename}"'
    response["Cache-Control"] = "private, no-store"
    return response


@login_required
def cluster_ssh_config(request: ProjectRequest, pk: int) -> HttpResponse:
    cluster = _connectable(request, pk, "SSH config")
    if isinstance(cluster, HttpResponse):
        return cluster
    shape = connect.shape_for(cluster)
    return _download(connect.ssh_config(shape), f"{shape.name}.ssh-config", "text/plain")


@login_required
def cluster_known_hosts(request: ProjectRequest, pk: int) -> HttpResponse:
    cluster = _connectable(request, pk, "known_hosts")
    if isinstance(cluster, HttpResponse):
        return cluster
    shape = connect.shape_for(cluster)
    return _download(connect.known_hosts(shape), f"{shape.name}.known_hosts", "text/plain")


@login_required
def cluster_hostfile(request: ProjectRequest, pk: int) -> HttpResponse:
    cluster = _connectable(request, pk, "hostfile")
    if isinstance(cluster, HttpResponse):
        return cluster
    return _download(connect.hostfile(connect.shape_for(cluster)), "hostfile", "text/plain")


@login_required
def cluster_kubeconfig(request: ProjectRequest, pk: int) -> HttpResponse:
    cluster = _connectable(request, pk, "kubeconfig")
    if isinstance(cluster, HttpResponse):
        return cluster
    if cluster.software != Cluster.Software.KUBERNETES:
        raise Http404("This cluster runs no Kubernetes.")
    shape = connect.shape_for(cluster)
    try:
        content = connect.kubeconfig(shape)
    except connect.NoRoute as no_route:
        raise Http404(str(no_route)) from None
    return _download(content, f"{shape.name}-kubeconfig.yaml", "application/yaml")


# --- the Storage page: volumes ----------------------------------------------------------------


def _get_volume_for_user(request: ProjectRequest, pk: int) -> Volume:
    queryset = Volume.objects.filter(deleted_at__isnull=True).select_related("location", "cluster")
    return get_for_project(request, queryset, pk=pk)


@permissions.page_requires("volumes.manage")
@require_http_methods(["GET", "POST"])
@outages.committing
def storage(request: ProjectRequest) -> HttpResponse:
    """The project's volumes, and the form that creates one."""
    project = require_project(request)
    locations = volumes.volume_locations()
    if request.method == "POST":
        form = VolumeForm(request.POST, locations=locations)
        if form.is_valid():
            data = form.cleaned_data
            try:
                volume = volumes.create_volume(
                    project=project,
                    name=data["name"],
                    location=data["location"],
                    size_gb=data["size_gb"],
                )
            except ClusterRefused as refusal:
                form.add_refusal(refusal)
            else:
                messages.success(
                    request,
                    f"Volume {volume.name} created: {volume.size_gb:,} GB in "
                    f"{volume.location.code}, {usd(volume.price_per_month)} per month.",
                )
                return redirect("storage:list")
    else:
        form = VolumeForm(locations=locations)
    live = list(volumes.live_volumes(project))
    context = {
        "form": form,
        "rows": [
            {
                "volume": volume,
                "rate": volume.price_per_gb_month,
                "per_month": volume.price_per_month,
            }
            for volume in live
        ],
        "monthly_total": sum((v.price_per_month for v in live), Decimal("0")),
    }
    return render(request, "clusters/storage.html", context, status=400 if form.errors else 200)


@permissions.page_requires("volumes.manage")
@require_http_methods(["GET", "POST"])
@outages.committing
def volume_delete(request: ProjectRequest, pk: int) -> HttpResponse:
    """GET asks for confirmation, POST deletes: refused while a cluster holds the volume."""
    volume = _get_volume_for_user(request, pk)
    if request.method == "GET":
        return render(request, "clusters/volume_delete.html", {"volume": volume})
    try:
        volumes.delete_volume(volume=volume)
    except ClusterRefused as refusal:
        messages.error(request, refusal.message)
    else:
        messages.success(request, f"Volume {volume.name} deleted; its billing ended now.")
    return redirect("storage:list")
