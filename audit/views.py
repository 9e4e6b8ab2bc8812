"""The audit log's page and its CSV export: owners and managers only; a developer gets the 403
page saying so (accounts/permissions.py, "audit.view")."""

import csv
import json

from django.contrib.auth.decorators import login_required
from django.core.paginator import Paginator
from django.http import HttpResponse
from django.shortcuts import render

from accounts import permissions
from accounts.models import Project
from accounts.requests import ProjectRequest
from audit.access import ACTION
from audit.filters import entries
from audit.forms import FilterForm
from audit.links import LINKED, links
from audit.models import Entry

PAGE_SIZE = 50
CSV_COLUMNS = [
    "at",
    "actor",
    "who",
    "what",
    "object_type",
    "object_id",
    "object_name",
    "changes",
    "outcome",
    "channel",
    "ip",
    "method",
    "path",
    "action",
    "status_code",
]


def _audit_project(request: ProjectRequest) -> Project:
    return permissions.require_page(request, ACTION)


@login_required
def entry_list(request: ProjectRequest) -> HttpResponse:
    project = _audit_project(request)
    form = FilterForm(request.GET or None)
    queryset = entries(project=project, by=form.entry_filter()).select_related(None)
    page = Paginator(queryset, PAGE_SIZE).get_page(request.GET.get("page"))
    linked = links(project=project, entries=page.object_list)
    for entry in page.object_list:
        entry.link = linked.get(entry.pk, "")
    query = request.GET.copy()
    query.pop("page", None)
    context = {
        "form": form,
        "page": page,
        "query": query.urlencode(),
        "linked_kinds": list(LINKED),
    }
    return render(request, "audit/list.html", context)


@login_required
def export_csv(request: ProjectRequest) -> HttpResponse:
    project = _audit_project(request)
    form = FilterForm(request.GET or None)
    response = HttpResponse(content_type="text/csv; charset=utf-8")
    response["Content-Disposition"] = 'attachment; filename="audit.csv"'
    writer = csv.writer(response)
    writer.writerow(CSV_COLUMNS)
    for entry in entries(project=project, by=form.entry_filter()).iterator():
        writer.writerow(_csv_row(entry))
    return response


def _csv_row(entry: Entry) -> list[str]:
    changes = json.dumps(entry.changes, sort_keys=True) if entry.changes else ""
    values = [
        entry.at.isoformat(),
        entry.actor,
        entry.who,
        entry.words,
        entry.object_type,
        entry.object_id,
        entry.object_name,
        changes,
        entry.result,
        entry.channel,
        entry.ip or "",
        entry.method,
        entry.path,
        entry.action,
        "" if entry.status_code is None else str(entry.status_code),
    ]
    return [_cell(value) for value in values]


def _cell(text: str) -> str:
    """A leading =, +, - or @ would make the cell a formula in a spreadsheet: a key's name or a
    path is the user's text."""
    return "'" + text if text[:1] in ("=", "+", "-", "@") else text
