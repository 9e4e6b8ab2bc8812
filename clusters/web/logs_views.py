"""The Logs & jobs tab's own views (clusters/telemetry/logs.py; the tab itself is
clusters/web/views.py's):
a machine's logs, Fetch logs, the jobs panel's poll, a text's download. Every cluster is looked
up within the user's project (another project's is a 404) and every node within that cluster;
no command text ever comes from the request: it names a machine and a group, nothing else."""

from __future__ import annotations

from urllib.parse import urlencode

from django.contrib import messages
from django.contrib.auth.decorators import login_required
from django.http import Http404, HttpResponse
from django.shortcuts import redirect, render
from django.urls import reverse
from django.utils.cache import patch_vary_headers
from django.views.decorators.http import require_GET, require_POST

from accounts import permissions
from accounts.projects import get_for_project
from accounts.requests import ProjectRequest
from clusters.errors import ClusterRefused
from clusters.models import Cluster, NodeLog
from clusters.telemetry import logs
from runcrate.text import visible_controls

# htmx stops polling on this status (the cluster ended: nothing more to read).
STOP_POLLING = 286


def _cluster(request: ProjectRequest, pk: int) -> Cluster:
    return get_for_project(request, Cluster.objects.select_related("environment"), pk=pk)


def _node_answer(
    request: ProjectRequest, cluster: Cluster, name: str | None, *, notice: str = ""
) -> HttpResponse:
    """The picked machine's logs: the region alone for htmx, a page of its own without it."""
    context = {"cluster": cluster, **logs.tab_context(cluster, node_name=name)}
    context["logs_notice"] = notice
    if request.htmx:
        context["panel"] = context.get("logs_panel")
        response = render(request, "clusters/logs/node.html", context)
    else:
        response = render(request, "clusters/logs/page.html", context)
    patch_vary_headers(response, ("HX-Request",))
    return response


@login_required
@require_GET
def logs_node(request: ProjectRequest, pk: int) -> HttpResponse:
    """One machine's logs, as last read (`?node=node-1`; the head by default)."""
    cluster = _cluster(request, pk)
    return _node_answer(request, cluster, request.GET.get("node"))


@permissions.page_requires("clusters.manage")
@require_POST
def logs_fetch(request: ProjectRequest, pk: int) -> HttpResponse:
    """Fetch logs (group `logs`, any running machine) or Refresh jobs (group `jobs`, the head):
    a read queued, or a refusal in words that changes nothing."""
    cluster = _cluster(request, pk)
    group = request.POST.get("group", logs.Group.LOGS)
    name = request.POST.get("node", "")
    if group not in logs.Group.values:
        group = logs.Group.LOGS
    node = next((n for n in logs.readable_nodes(cluster) if n.name == name), None)
    refused = ""
    try:
        logs.request_fetch(cluster=cluster, node=node, group=group)
    except ClusterRefused as refusal:
        refused = refusal.message
    if group == logs.Group.JOBS:
        if request.htmx:
            return _jobs_answer(request, cluster, notice=refused)
        if refused:
            messages.error(request, refused)
        else:
            messages.success(request, "Reading the jobs on the head: reload in a few seconds.")
        return redirect("clusters:tab", pk=cluster.pk, tab="logs")
    if request.htmx:
        return _node_answer(request, cluster, name, notice=refused)
    if refused:
        messages.error(request, refused)
    else:
        messages.success(request, f"Reading {name}'s logs: reload in a few seconds.")
    picked = urlencode({"node": node.name if node else ""})
    return redirect(f"{reverse('clusters:logs_node', args=[cluster.pk])}?{picked}")


def _jobs_answer(request: ProjectRequest, cluster: Cluster, *, notice: str = "") -> HttpResponse:
    context = {"cluster": cluster, **logs.tab_context(cluster)}
    context["panel"] = context.get("jobs_panel")
    context["jobs_notice"] = notice
    return render(request, "clusters/logs/jobs.html", context)


@login_required
@require_GET
def logs_jobs(request: ProjectRequest, pk: int) -> HttpResponse:
    """The jobs panel's poll: reads the head's jobs again when the last read is 30 s old and
    none runs (`logs.refresh_jobs`), and answers the panel; 286 once the cluster ended."""
    cluster = _cluster(request, pk)
    if not cluster.is_live:
        return HttpResponse(status=STOP_POLLING)
    logs.refresh_jobs(cluster)
    return _jobs_answer(request, cluster)


@login_required
@require_GET
def logs_download(request: ProjectRequest, pk: int, node: str, kind: str) -> HttpResponse:
    """A kept text as a text/plain attachment, named after the cluster, machine and text, its
    control characters made visible as on the page (a `cat` of it replays no escape sequence);
    `?raw=1` gives the text as the host printed it, named `….raw.txt`."""
    cluster = _cluster(request, pk)
    if not cluster.is_live:
        raise Http404("This cluster has ended; its logs are gone.")
    found = next((n for n in logs.readable_nodes(cluster) if n.name == node), None)
    text = (
        NodeLog.objects.filter(fetch__node=found, kind=kind).select_related("fetch").first()
        if found
        else None
    )
    if text is None:
        raise Http404("No such log.")
    raw = request.GET.get("raw") == "1"
    output = text.output if raw else visible_controls(text.output)
    response = HttpResponse(output, content_type="text/plain; charset=utf-8")
    stamp = text.fetched_at.strftime("%Y%m%dT%H%M%SZ")
    response["Content-Disposition"] = (
        f'attachment; filename="{cluster.name}-{node}-{kind}-{stamp}{".raw" if raw else ""}.txt"'
    )
    return response
