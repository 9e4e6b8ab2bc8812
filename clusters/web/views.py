"""The Clusters pages: the list, the create form, the cluster page and its actions.

Views stay thin: every change goes through `clusters.lifecycle`, and how a cluster reads on a
page (its stepper, its nodes' progress, its panels) is `clusters.web.presenters`'; a view parses
the request, asks the presenter, and renders. Every lookup is scoped to the request's project,
so another project's cluster is a 404.
"""

from dataclasses import dataclass, field, replace
from datetime import datetime
from decimal import Decimal
from typing import Any
from urllib.parse import urlencode

from django.contrib import messages
from django.contrib.auth.decorators import login_required
from django.core.paginator import Paginator
from django.core.serializers.json import DjangoJSONEncoder
from django.db.models import Case, Count, Prefetch, Q, QuerySet, Value, When
from django.http import Http404, HttpResponse, QueryDict
from django.shortcuts import get_object_or_404, redirect, render
from django.template.loader import render_to_string
from django.utils import timezone
from django.utils.cache import patch_vary_headers
from django.utils.html import json_script
from django.views.decorators.http import require_http_methods, require_POST

from accounts import permissions
from accounts.models import Project
from accounts.projects import get_for_project, in_project, require_project
from accounts.requests import ProjectRequest
from billing import meter
from billing.context_processors import request_summary
from billing.usage import ClusterCost, cluster_costs
from clusters import connect, getting_started, lifecycle, volumes
from clusters.errors import ClusterRefused
from clusters.models import Cluster, Node, Volume
from clusters.telemetry import metrics
from clusters.web import charts, plans
from clusters.web.forms import ClusterForm, VolumeForm, suggest_name
from clusters.web.presenters import (
    METRICS_TABS,
    STATUS_BADGES,
    TABS,
    TABS_BY_SLUG,
    MetricsWindow,
    Tab,
    detail_context,
    figures_cells,
    metrics_context,
    metrics_figures,
    new_cluster_context,
    node_rows,
    page_events,
    page_nodes,
    price_card,
    with_every_row,
)
from offers.models import MIN_NODES
from offers.offers import Offer, get_offer
from offers.quotes import quotes_for
from offers.visibility import sees_drills
from runcrate import durations, outages
from runcrate.money import usd

CLUSTERS_PER_PAGE = 50
# htmx stops polling when a poll is answered with this status.
STOP_POLLING = 286


# The htmx target a tab link swaps (templates/clusters/parts/tab_nav.html).
TAB_PANEL = "cluster-tab"


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
        cost = costs[cluster.pk]
        machines = cluster.machines_priced(cluster.machines_up, billed=cost.machines_now)
        rows.append(
            ClusterRow(
                cluster=cluster,
                machines=machines,
                price_per_hour=cluster.price_per_hour(machines),
                badge=STATUS_BADGES[cluster.status],
                age=durations.age(cluster.created_at, now),
                cost=cost,
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


@permissions.page_requires("clusters.manage")
@require_http_methods(["GET", "POST"])
def cluster_new(request: ProjectRequest) -> HttpResponse:
    # The price card reads the project's balance and the form its keys: a user in no project
    # gets the 404 every project page gives (accounts/projects.py), before any of that.
    project = require_project(request)
    data = request.POST if request.method == "POST" else request.GET
    nodes = _requested_nodes(data.get("nodes"))
    drills = sees_drills(user=request.user, project=project)
    offer = get_offer(slug=data.get("offer", ""), nodes=nodes, include_drills=drills)
    if offer is None:
        context: dict[str, Any] = {"offer_slug": data.get("offer", "")}
        return render(request, "clusters/new.html", context, status=404)

    if request.htmx and request.method == "GET":  # the price summary follows the nodes field
        context = {"offer": offer, "summary": price_card(request, offer, nodes)}
        return render(request, "clusters/new.html#summary", context)

    suggested = False
    if request.method == "POST":
        form = ClusterForm(request.POST, project=project, offer=offer, user=request.user)
        cluster = _create_from(request, project, form, offer) if form.is_valid() else None
        if cluster is not None:
            # No flash: the cluster page says it is starting while it provisions, and stops
            # saying so once it is past that (docs/clusters.md).
            return redirect("clusters:detail", pk=cluster.pk)
    else:
        form, suggested = _prefilled_form(request, project, data, offer, nodes)
    context = new_cluster_context(request, offer, nodes, form=form, name_suggested=suggested)
    return render(request, "clusters/new.html", context, status=400 if form.errors else 200)


def _create_from(
    request: ProjectRequest, project: Project, form: ClusterForm, offer: Offer
) -> Cluster | None:
    """The cluster a valid form creates, or None with the lifecycle's refusal on the form."""
    cleaned = form.cleaned_data
    try:
        return lifecycle.create_cluster(
            project=project,
            user=request.user,
            environment=cleaned["environment"],
            offer_slug=offer.id,
            nodes=cleaned["nodes"],
            name=cleaned["name"],
            software=cleaned["software"],
            ssh_key_ids=[key.pk for key in cleaned["ssh_keys"]],
            volume_id=cleaned["volume"],
            repair_policy=cleaned["repair_policy"] or Cluster.RepairPolicy.ASK,
        )
    except ClusterRefused as refusal:
        form.add_refusal(refusal)
        return None


def _prefilled_form(
    request: ProjectRequest, project: Project, data: QueryDict, offer: Offer, nodes: int
) -> tuple[ClusterForm, bool]:
    """The form as a link fills it (a create-again link gives name, software, environment,
    volume and repair policy), and whether its name is one suggested because the link gave
    none."""
    initial = {"offer": offer.id, "nodes": nodes}
    for key in ("name", "software", "environment", "volume", "repair_policy"):
        if data.get(key):
            initial[key] = data[key]
    suggested = "name" not in initial
    if suggested:
        initial["name"] = suggest_name(project=project, offer=offer, nodes=nodes)
    form = ClusterForm(initial=initial, project=project, offer=offer, user=request.user)
    return form, suggested


# --- the cluster page ---------------------------------------------------------------------------


def _clusters_with_details(*, events: bool = True) -> QuerySet[Cluster]:
    """One cluster's page in a fixed number of queries, whatever its number of nodes; a poll's
    answer reads only the events it sends (`events=False`)."""
    prefetch = [
        Prefetch("nodes", queryset=page_nodes()),
        Prefetch("volumes", queryset=Volume.objects.select_related("location")),
    ]
    if events:
        prefetch.append(Prefetch("events", queryset=page_events()))
    return Cluster.objects.select_related(
        "environment", "machine_type__location", "machine_type__gpu", "quote__gpu"
    ).prefetch_related(*prefetch)


def _get_cluster_for_user(
    request: ProjectRequest, pk: int, *, details: bool = False, events: bool = True
) -> Cluster:
    if details:
        return get_for_project(request, _clusters_with_details(events=events), pk=pk)
    queryset = Cluster.objects.select_related("environment")
    return get_for_project(request, queryset, pk=pk)


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
    # The Metrics tab's window and node; the Logs tab's picked node (its poll sends the
    # picker's choice, so a redraw keeps it).
    shown_window = (
        MetricsWindow.of(request.GET.get("window"), request.GET.get("node"))
        if tab in ("metrics", "logs")
        else None
    )
    if shown is not None:
        response = _poll(request, pk, shown, shown_tab, shown_window)
    elif request.htmx and tab == "metrics" and request.GET.get("part") == "charts":
        response = _charts_answer(request, pk, shown_window or MetricsWindow())
    else:
        # Only the Events tab shows every event (`with_every_row`).
        cluster = _get_cluster_for_user(
            request, pk, details=True, events=shown_tab.slug == "events"
        )
        context = with_every_row(detail_context(cluster, shown_tab, shown_window))
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


def _metrics_moved(request: ProjectRequest, version: int) -> bool:
    """Whether a report came since the page's figures were drawn (the poll's `metrics`), the
    cluster's metrics version being `version`. A page that does not say (another tab) has none
    to redraw."""
    shown = request.GET.get("metrics")
    return shown is not None and shown != str(version)


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
    # Asked after the cluster was found in the user's project: a stranger learns nothing. Read
    # once, before any figures: a report landing meanwhile is drawn by the next poll.
    now_version = metrics.metrics_version(pk) if tab.slug in METRICS_TABS else 0
    metrics_moved = tab.slug in METRICS_TABS and _metrics_moved(request, now_version)
    if status in Cluster.TERMINAL:
        # An ended cluster's page stops polling; its last answer said it all.
        moved = metrics_moved = False
    if version == shown and _still_holds(request) and not moved and not metrics_moved:
        if status in Cluster.TERMINAL:
            response = HttpResponse(status=STOP_POLLING)
            response["HX-Reswap"] = "none"
            return response
        return HttpResponse(status=204)
    # Only the figures moved (a report came; the cluster, the meter and the clock did not).
    figures_only = metrics_moved and version == shown and not moved and _still_holds(request)
    if figures_only and tab.slug == "machines":
        return _figures_answer(request, pk, status, now_version)
    if figures_only and tab.slug == "metrics":
        window = shown_window or MetricsWindow()
        answer = _metrics_figures_answer(request, pk, window, now_version)
        if answer is not None:
            return answer
    queryset = in_project(request, _clusters_with_details(events=False))
    cluster = get_object_or_404(queryset, pk=pk)
    context = detail_context(cluster, tab, shown_window)
    context["balance_moved"] = moved
    context["metrics_moved"] = metrics_moved
    # The last answer once final (the page as it stays, and the polling stops), and the answer
    # to a page ahead of the cluster (a version it never had: nothing can say what changed).
    if cluster.is_final or shown > cluster.version:
        context["events"] = list(page_events().filter(cluster=cluster))
        context["node_rows"] = node_rows(cluster, context["nodes"], context["now"])
        return _whole_answer(request, cluster, context)
    return _changes_answer(request, cluster, context, shown)


def _figures_answer(request: ProjectRequest, pk: int, status: str, version: int) -> HttpResponse:
    """The Machines tab's answer when only the figures moved (a report came; the cluster, the
    meter and the clock did not): each live row's GPUs cell and the metrics version the page
    now shows (`#metrics-shown`, which its poll includes), out of band, and nothing swapped in
    place of the header (`HX-Reswap: none`), which holds what it held. One query past the
    poll's three, whatever the node count: the nodes with their figures. `version`: the
    metrics version, read before them."""
    cells = figures_cells(status, metrics.nodes_with_utilization(pk), timezone.now())
    context = {"metrics_version": version, "metrics_oob": True}
    parts = [f"<template>{''.join(cells)}</template>" if cells else ""]
    # Without the request: the part reads nothing of it, nor of the context processors.
    parts.append(render_to_string("clusters/parts/metrics_shown.html", context))
    response = HttpResponse("".join(parts))
    response["HX-Reswap"] = "none"
    return response


class CompactJSON(DjangoJSONEncoder):
    """JSON with no spaces after its commas and colons: a moved Metrics tab poll at 64 × 8
    GPUs sends a few thousand of each. (Still ASCII, and written by json, not orjson as the
    API's answers are: `json_script`'s escaping of a string that is not ASCII takes several
    times as long, twice what orjson saves here.)"""

    def __init__(self, **options: Any) -> None:
        super().__init__(**{**options, "separators": (",", ":")})


def _metrics_figures_answer(
    request: ProjectRequest, pk: int, shown_window: MetricsWindow, version: int
) -> HttpResponse | None:
    """The Metrics tab's answer when only the figures moved and the page's cells are drawn of
    what the cluster has (its `grid`): the latest figures as JSON (`#metrics-now`), which the
    page's script draws into the cells and the table it has (static/js/app.js), the named
    nodes and the picked node's GPUs, and the metrics version the page now shows
    (`#metrics-shown`), all out of band, with `HX-Reswap: none`; the charts redraw on their
    own poll (`_charts_answer`). One query past the poll's three, whatever the node count
    (`metrics.latest`). None when the grid moved: the panel is drawn whole. `version`: the
    metrics version, read before the figures."""
    context = metrics_figures(pk, shown_window, request.GET.get("grid"), timezone.now())
    if context is None:
        return None
    figures = json_script(context.pop("metrics_now"), "metrics-now", encoder=CompactJSON)
    parts = [figures.replace("<script ", '<script hx-swap-oob="true" ', 1)]
    # These two parts without the request: they read nothing of it, nor of the eight context
    # processors that rendering with it runs (a tenth of this answer at 64 nodes).
    parts.append(render_to_string("clusters/tabs/metrics_named.html", context))
    if "node" in context:
        parts.append(render_to_string("clusters/tabs/metrics.html#node_now", context, request))
    shown = {"metrics_version": version, "metrics_oob": True}
    parts.append(render_to_string("clusters/parts/metrics_shown.html", shown))
    response = HttpResponse("".join(parts))
    response["HX-Reswap"] = "none"
    return response


def _charts_answer(request: ProjectRequest, pk: int, shown_window: MetricsWindow) -> HttpResponse:
    """The Metrics tab's charts, on their own poll (`part=charts`, every window's resolution
    up to a minute): the whole cluster's, and the picked node's out of band. An ended
    cluster's page is drawn whole by the page's poll: this one stops (286)."""
    cluster = _get_cluster_for_user(request, pk)
    if not cluster.is_running:
        return HttpResponse(status=STOP_POLLING)
    context = metrics_context(cluster, shown_window, timezone.now(), cells=False)
    shown = context["metrics_charts"]
    context.update(cluster=cluster, polling=True, shown=shown)
    parts = [render_to_string("clusters/tabs/metrics.html#cluster_charts", context, request)]
    for node in shown.nodes:
        node_context = {**context, "node": node, "node_oob": True}
        parts.append(
            render_to_string("clusters/tabs/metrics.html#node_charts", node_context, request)
        )
    return HttpResponse("".join(parts))


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
        parts += _machines_changes(request, cluster, context, shown)
    elif tab == "events":
        # Up to the version read: an event written since comes with the next poll, and only then.
        context["new_events"] = list(
            page_events().filter(cluster=cluster, version__gt=shown, version__lte=cluster.version)
        )
        parts.append(render_to_string("clusters/parts/changes.html", context, request))
    elif shown != cluster.version or tab in ("connect", "billing") or context.get("metrics_moved"):
        # (Overview, when only the meter ran, has nothing new: the header has the cost.)
        parts += _tab_parts(request, context)
    parts += _balance_part(request, context)
    return HttpResponse("".join(parts))


def _machines_changes(
    request: ProjectRequest, cluster: Cluster, context: dict, shown: int
) -> list[str]:
    """The Machines tab's part of a changed poll: the node rows stamped after `shown` (in place,
    by id) and the rows the page lacks (appended), the reports and the machines' actions; and
    when a report came (the metrics version moved), each other live row's GPUs cell alone
    (`#<node>-gpus`), never its whole row. When only the figures moved, only those cells: the
    rows, reports and actions hold what they held."""
    nodes, now = context["nodes"], context["now"]
    on_page = _count(request.GET.get("nodes"))
    # The page shows the first `on_page` machines the cluster had (none is ever deleted).
    shown_pks = {n.pk for n in sorted(nodes, key=lambda n: n.pk)[:on_page]}
    added = [n for n in nodes if n.pk not in shown_pks]
    if any(n.replaces_id is not None for n in added):
        # A replacement's row goes beside the one it replaces, whose row changes its id:
        # the tab whole, once.
        context["node_rows"] = node_rows(cluster, nodes, now)
        return _tab_parts(request, context)
    changed = [n for n in nodes if n.pk in shown_pks and n.version > shown]
    cells: list = []
    if context.get("metrics_moved"):
        changed_pks = {n.pk for n in changed}
        cells = [
            n
            for n in nodes
            if n.pk in shown_pks
            and n.pk not in changed_pks
            and metrics.recording(cluster_status=cluster.status, node_status=n.status)
        ]
    # One read of the figures for the rows and the cells together (node_rows reads them).
    rows = node_rows(cluster, [*changed, *cells, *added], now, every=nodes)
    context["changed_rows"] = rows[: len(changed)]
    context["gpu_cells"] = rows[len(changed) : len(changed) + len(cells)]
    context["added_rows"] = rows[len(changed) + len(cells) :]
    parts: list[str] = [render_to_string("clusters/parts/changes.html", context, request)]
    if cells:
        parts.append(render_to_string("clusters/parts/gpu_cells.html", context, request))
    # The metrics version the page shows, which its poll includes (the header's carries the
    # same, but the page keeps this one when only the figures move: `_figures_answer`).
    context["metrics_oob"] = True
    parts.append(render_to_string("clusters/parts/metrics_shown.html", context, request))
    figures_only = (
        shown == cluster.version and not context.get("balance_moved") and _still_holds(request)
    )
    if not figures_only:
        context["oob"] = context["reports_oob"] = True
        parts.append(render_to_string("clusters/parts/machines_actions.html", context, request))
        parts.append(render_to_string("clusters/parts/reports.html", context, request))
    return parts


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


STALE_WORKERS_PLAN = (
    "Nothing was added: the price you confirmed is more than 10 minutes old, or was for another "
    "number of workers or another size of the cluster (workers were added since). This is the "
    "price now; confirm again to add them."
)


@permissions.page_requires("clusters.manage")
@require_http_methods(["GET", "POST"])
@outages.committing
def cluster_add_workers(request: ProjectRequest, pk: int) -> HttpResponse:
    """GET (the Machines tab's form) shows what adding `count` workers costs (what they add
    per hour, the cluster's new price) or why it cannot be, and asks; POST adds them, with the
    page's plan_token: a POST without one changes nothing and shows the page. Works without
    JavaScript."""
    cluster = _get_cluster_for_user(request, pk)
    count = _count(
        request.POST.get("count") if request.method == "POST" else request.GET.get("count")
    )
    token = request.POST.get("plan_token", "") if request.method == "POST" else ""
    if count is None or not token:
        return _add_workers_page(request, cluster, count)
    try:
        plans.check_token(
            token, project=request.project, api_key=None, body=plans.workers_body(cluster, count)
        )
    except ClusterRefused:
        return _add_workers_page(request, cluster, count, refused=STALE_WORKERS_PLAN)
    try:
        lifecycle.add_workers(cluster=cluster, count=count)
    except ClusterRefused as refusal:
        return _add_workers_page(request, cluster, count, refused=refusal.message)
    noun = "worker" if count == 1 else "workers"
    messages.success(request, f"Adding {count} {noun}: each is billed once it is up.")
    return redirect("clusters:tab", pk=cluster.pk, tab="machines")


def _add_workers_page(
    request: ProjectRequest, cluster: Cluster, count: int | None, *, refused: str = ""
) -> HttpResponse:
    """The add-workers confirm page: the plan of `count` workers with its token, or why not."""
    context: dict[str, Any] = {"cluster": cluster, "count": count, "refused": refused}
    try:
        if count is None:
            raise ClusterRefused("invalid_count", "Say how many workers to add, as a whole number.")
        planned = lifecycle.plan_add_workers(cluster=cluster, count=count)
    except ClusterRefused as refusal:
        context["refusal"] = refusal.message
    else:
        context["plan"] = planned
        context["plan_token"] = plans.issue_token(
            project=request.project,
            api_key=None,
            body=plans.workers_body(cluster, count, machines_now=planned.machines_now),
        )
    return render(request, "clusters/add_workers.html", context)


@permissions.page_requires("clusters.manage")
@require_http_methods(["GET", "POST"])
@outages.committing
def cluster_replace_node(request: ProjectRequest, pk: int, node: str) -> HttpResponse:
    """GET shows what replacing the worker `node` does (which machine, why, the address it
    keeps, what it costs) or why it cannot be; POST replaces it. Works without JavaScript."""
    cluster = _get_cluster_for_user(request, pk)
    if request.method == "GET":
        context: dict[str, Any] = {"cluster": cluster, "node_name": node}
        try:
            plan = lifecycle.plan_replace(cluster=cluster, node_name=node)
        except ClusterRefused as refusal:
            context["refusal"] = refusal.message
        else:
            context["plan"] = plan
            context["cluster_price_per_hour"] = plan.price_per_hour * plan.machines_after
        return render(request, "clusters/replace.html", context)
    try:
        new = lifecycle.replace_node(cluster=cluster, node_name=node, user=request.user)
    except ClusterRefused as refusal:
        messages.error(request, refusal.message)
    else:
        messages.success(
            request,
            f"Replacing {new.name}: a new machine takes its name and private address "
            f"{new.private_ip}, and is billed from the moment it is up.",
        )
    return redirect("clusters:tab", pk=cluster.pk, tab="machines")


@permissions.page_requires("clusters.manage")
@require_POST
@outages.committing
def cluster_repair_policy(request: ProjectRequest, pk: int) -> HttpResponse:
    """Change who decides to replace a lost or unhealthy worker (the Machines tab's form)."""
    cluster = _get_cluster_for_user(request, pk)
    try:
        cluster = lifecycle.set_repair_policy(
            cluster=cluster, policy=request.POST.get("repair_policy", ""), user=request.user
        )
    except ClusterRefused as refusal:
        messages.error(request, refusal.message)
    else:
        messages.success(request, f"Repair policy: {cluster.get_repair_policy_display().lower()}.")
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
    context = with_every_row(detail_context(cluster, TABS_BY_SLUG["machines"]))
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
