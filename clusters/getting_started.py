"""The three steps a new account sees on the Clusters page until it has a cluster (docs/accounts.md,
"Getting started"): add an SSH key, add credit, create a cluster, each ticked once done.

Cheap on purpose: a project with any cluster has done all three and costs no query here (the
list already knows it has rows); an empty one costs two `exists()` (its keys, its ledger). Who
can add credit is the role the page's request read with its project.
"""

from __future__ import annotations

from dataclasses import dataclass

from django.urls import reverse

from accounts.models import Project
from billing import ledger
from billing.access import role_manages_billing


@dataclass(frozen=True)
class Step:
    key: str
    label: str
    done: bool
    url: str
    help: str


def steps(*, project: Project, role: str | None, has_clusters: bool) -> list[Step] | None:
    """The steps with what is done, or None once there is nothing left to show (a cluster
    exists: it needed a key and credit)."""
    if has_clusters:
        return None
    has_key = project.ssh_keys.exists()
    has_credit = ledger.has_credit(project=project)
    credit_help = "Clusters are paid from the project's balance, per second."
    credit_url = reverse("billing:index")
    if not has_credit and not role_manages_billing(role):
        credit_help = "Ask an owner or manager of the project to add credit."
        credit_url = ""
    return [
        Step(
            "ssh_key",
            "Add an SSH key",
            has_key,
            reverse("accounts:ssh_keys"),
            "It is installed on every machine, so you can log in.",
        ),
        Step("credit", "Add credit", has_credit, credit_url, credit_help),
        Step(
            "cluster",
            "Create a cluster",
            False,
            reverse("offers:picker"),
            "Pick a GPU and a size; every machine starts together or not at all.",
        ),
    ]
