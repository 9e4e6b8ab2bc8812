"""A strict Content-Security-Policy on every answer, and pages that need nothing it forbids:
no inline script or style, nothing from outside (runcrate/csp.py)."""

import re
from datetime import timedelta
from decimal import Decimal

import pytest
from django.utils import timezone

from accounts.models import Environment
from billing.meter import charge_accrued
from clusters.models import Cluster, Node
from tests.billing.conftest import add_credit, bill_cluster
from tests.conftest import log_in
from tests.factories import ClusterFactory

INLINE = re.compile(
    r"""<script(?![^>]*\bsrc=)(?![^>]*type="application/json")[^>]*>|<style\b|\sstyle=|\son[a-z]+=""",
    re.IGNORECASE,
)


def policy(response) -> dict[str, list[str]]:
    header = response.headers["Content-Security-Policy"]
    return {
        directive.split()[0]: directive.split()[1:]
        for directive in (part.strip() for part in header.split(";"))
    }


def test_every_answer_carries_a_policy_that_allows_only_this_site(owner, client):
    for response in (
        client.get("/accounts/login/"),
        owner.browser_client().get("/clusters/"),
        owner.api().get("/api/v1/gpus"),
        client.get("/api/v1/no-such-thing"),
        client.get("/healthz"),
    ):
        directives = policy(response)
        assert directives["default-src"] == ["'self'"]
        assert directives["script-src"] == ["'self'"]
        assert directives["style-src"] == ["'self'"]
        assert directives["object-src"] == ["'none'"]
        assert directives["frame-ancestors"] == ["'none'"]
        assert "'unsafe-inline'" not in response.headers["Content-Security-Policy"]
        assert "'unsafe-eval'" not in response.headers["Content-Security-Policy"]


@pytest.fixture
def pages(owner) -> list[str]:
    """A page of each kind, with the parts that draw bars and charts."""
    add_credit(owner.project, "500.00")
    staging = Environment.objects.create(
        project=owner.project, name="staging", monthly_budget=Decimal("100.00")
    )
    billed = bill_cluster(
        owner.project,
        environment=staging,
        name="billed",
        at=timezone.now() - timedelta(hours=2),
    )
    charge_accrued(now=timezone.now())  # 2 machines at $20.00 for 2 hours: 80% of the budget
    starting = ClusterFactory(
        project=owner.project,
        name="starting",
        status=Cluster.Status.PROVISIONING,
        machines=True,
        machines__status=Node.Status.STARTING,
    )
    return [
        "/clusters/",
        f"/clusters/{billed.pk}/",
        f"/clusters/{starting.pk}/",
        "/offers/",
        "/billing/",
        "/billing/environments/",
        "/storage/",
        "/accounts/",
        "/offers/quote/",
    ]


def test_no_page_has_an_inline_script_or_style(owner, pages, client):
    browser = owner.browser_client()
    found = {}
    for path in [*pages, "/accounts/login/", "/accounts/signup/", "/api/v1/docs"]:
        response = (
            client if path.startswith(("/accounts/login", "/accounts/signup")) else browser
        ).get(path)
        assert response.status_code == 200, path
        hits = INLINE.findall(response.content.decode())
        if hits:
            found[path] = hits
    assert found == {}


@pytest.mark.browser
@pytest.mark.django_db(transaction=True)
def test_the_pages_work_in_a_browser_under_the_policy(page, owner, pages, tmp_path):
    violations: list[str] = []
    page.on(
        "console",
        lambda message: (
            violations.append(message.text) if "Content Security Policy" in message.text else None
        ),
    )
    page.add_init_script(
        "document.addEventListener('securitypolicyviolation', e => "
        "console.error('Content Security Policy: ' + e.violatedDirective + ' ' + e.blockedURI))"
    )
    log_in(page, owner)
    for path in pages:
        page.goto(path)
        page.wait_for_load_state("networkidle")
    # htmx (a script file of ours) still swaps: the provisioning cluster's status polls.
    page.goto(pages[2])
    with page.expect_request(re.compile(r"/clusters/\d+/\?version=\d+&")):
        pass
    # The bars are drawn: the budget bar's rect is as wide as the share spent.
    page.goto("/billing/environments/")
    page.screenshot(path=str(tmp_path / "environments.png"), full_page=True)
    bar = page.locator("#environment-staging .progress")
    drawn = bar.locator("rect").bounding_box()["width"] / bar.bounding_box()["width"]
    assert 0.78 < drawn < 0.82
    page.goto(pages[2])
    page.screenshot(path=str(tmp_path / "cluster.png"), full_page=True)

    assert violations == []
