"""Every page in Chromium, at 1280 px and 390 px, light and dark (docs/accessibility.md).

On each page state that `world()` lists, the sweep checks that the document does not scroll
sideways, that every link of the main navigation is visible or reachable through the phone's
menu, and that axe-core finds no violation of moderate impact or worse on the product's pages
(no serious or critical one on Django's admin, whose markup is Django's). axe-core comes from
the npm registry through `make test` or `make axe` (pinned in the Makefile, fetched into
.venv/axe by bin/fetch_axe.py, never committed) and is added to each page by the test, so
nothing loads from a CDN; without it the sweep fails.

To add a page state: build its data in `world()` and add a `Page` to the list it returns.
`RUNCRATE_SWEEP_SHOTS=<folder>` saves a screenshot of every page in every mode there;
`RUNCRATE_SWEEP_PAGES=<words>` checks only the pages whose name contains one of the words.
"""

import hashlib
import json
import os
from dataclasses import dataclass
from datetime import timedelta
from decimal import Decimal
from pathlib import Path

import pytest
from django.conf import settings
from django.contrib.auth.tokens import default_token_generator
from django.contrib.messages import constants
from django.contrib.messages.storage.base import Message
from django.contrib.messages.storage.cookie import CookieStorage
from django.http import HttpRequest
from django.test import Client
from django.utils import timezone
from django.utils.encoding import force_bytes
from django.utils.http import urlsafe_base64_encode
from django_otp.oath import totp

import audit
from accounts import otp
from accounts.models import Environment, Invitation, Membership
from accounts.projects import create_project
from billing.meter import charge_usage
from billing.models import BillingDetails, LedgerEntry, Payment, UsageRecord
from billing.usage import Month
from clusters import volumes
from clusters.models import Cluster, Event, Node
from clusters.telemetry import logs, metrics
from notifications.models import EVENT_TYPES, Attempt, Delivery, Endpoint
from offers.models import MachineType, QuoteRequest
from tests.audit.world import audit_day
from tests.billing.conftest import bill_cluster
from tests.clusters.front import credit, machine_type_with_hosts, ssh_key
from tests.conftest import Person
from tests.factories import ClusterFactory, EventFactory, LocationFactory, UserFactory

pytestmark = [pytest.mark.browser, pytest.mark.django_db(transaction=True)]

AXE_JS = Path(settings.BASE_DIR) / ".venv" / "axe" / "axe.min.js"
# axe-core's own impacts that fail the sweep: on the product's pages everything but "minor"
# (issue 21), on Django's admin (staff only, Django's markup with our overrides in
# templates/admin/) the serious and critical ones; and on both the rules named here, whatever
# their impact (issue 13 found them, and they are cheap to keep fixed).
FAILING_IMPACTS = ("moderate", "serious", "critical")
ADMIN_FAILING_IMPACTS = ("serious", "critical")
FAILING_RULES = ("heading-order", "empty-table-header")

MODES = {
    "1280-light": {"viewport": {"width": 1280, "height": 900}, "color_scheme": "light"},
    "1280-dark": {"viewport": {"width": 1280, "height": 900}, "color_scheme": "dark"},
    "390-light": {"viewport": {"width": 390, "height": 844}, "color_scheme": "light"},
    "390-dark": {"viewport": {"width": 390, "height": 844}, "color_scheme": "dark"},
    # Tablets: where the bar switches to the menu and the tables to cards, both sides of it.
    "768-light": {"viewport": {"width": 768, "height": 1024}, "color_scheme": "light"},
    "1024-dark": {"viewport": {"width": 1024, "height": 768}, "color_scheme": "dark"},
}


@dataclass(frozen=True)
class Page:
    name: str
    path: str
    who: str  # "anonymous", or a key of the people `world()` returns
    # Whether the page must have the main navigation (a signed-in page of the product's own);
    # where it need not, it is still checked when it is there.
    nav: bool = True
    # A selector to wait for before checking, for a page that draws itself after it loads.
    ready: str | None = None
    # Selectors of what must stay in view on every row (a price, an action): each match must lie
    # inside the window's width and not be hidden in a box scrolled sideways.
    in_view: tuple[str, ...] = ()
    # A button to click once the page is loaded (a form sent empty, to check its errors); the
    # page it leads to is checked.
    then: str | None = None
    # Whether to show a flash message of every level (success, info, warning, error) on it.
    flashes: bool = False
    # axe rules not checked on this page, each for a reason given where the page is listed.
    axe_skip: tuple[str, ...] = ()
    # The axe impacts that fail the page: Django's admin pages pass ADMIN_FAILING_IMPACTS.
    impacts: tuple[str, ...] = FAILING_IMPACTS


@pytest.fixture(scope="session")
def axe_source() -> str:
    if not AXE_JS.exists():
        pytest.fail(
            f"axe-core is not installed at {AXE_JS}: run `make axe` (`make test` does), which "
            "installs the version pinned in the Makefile from the npm registry"
        )
    return AXE_JS.read_text()


def admin_page(name: str, path: str) -> Page:
    """A page of Django's admin, seen by staff: no main navigation of the product's. Its tabular
    inlines (a cluster's machines and events) leave the header cells of their "original" and
    delete columns empty: Django's markup, a minor finding, not checked there."""
    return Page(
        f"admin: {name}",
        path,
        "staff",
        nav=False,
        impacts=ADMIN_FAILING_IMPACTS,
        axe_skip=("empty-table-header",),
    )


def seed_figures(cluster: Cluster, now) -> None:
    """Twenty minutes of an 8-GPU machine's reports every 15 s on each node of `cluster`
    (issue 23's Metrics tab and the list's trace), the minutes rolled up as the beat does."""
    for node in cluster.nodes.all():
        for step in range(80):
            at = now - timedelta(seconds=15 * (80 - step))
            gpus = [
                {
                    "index": index,
                    "utilization_percent": float((step * 3 + index * 11 + node.index * 7) % 101),
                    "memory_used_mib": 60_000 + 500 * index,
                    "memory_total_mib": 81_559,
                    "temperature_c": 55.0 + index,
                    "power_w": 450.0 + 20 * index,
                    "power_limit_w": 700.0,
                    "throttle": 0b100 if index == 3 else 0,
                }
                for index in range(8)
            ]
            metrics.store(node.pk, cluster.pk, gpus=gpus, host=None, at=at)
    metrics.roll_up(60, now=now)


@dataclass
class Parked(Person):
    """A user with two-factor sign-in on whose password was just right: the browser holds a
    session that waits for their code (accounts/otp.py), not a logged-in one."""


def with_two_factor(email: str) -> Person:
    user = UserFactory(email=email)
    project = create_project(owner=user, name="Secured")
    otp.confirm_setup(user=user, code=totp_now(otp.pending_setup(user)))
    return Person(user=user, project=project, key="")


def totp_now(device) -> str:
    return f"{totp(device.bin_key, step=device.step, t0=device.t0):06d}"


def world(owner: Person, newcomer: Person) -> tuple[dict[str, Person], list[Page]]:
    """An owner whose project has a bit of everything, a newcomer who has nothing yet, and a
    member of staff for the admin."""
    project = owner.project
    staff = Person(
        user=UserFactory(email="staff@runcrate.example", is_staff=True, is_superuser=True),
        project=project,
        key="",
    )
    ohio = LocationFactory(
        code="us-east-2", name="Columbus, Ohio", volume_price_per_gb_month=Decimal("0.08")
    )
    offer = machine_type_with_hosts(
        free=6, slug="use2-h100x8-vm", price_per_hour=Decimal("23.92"), location=ohio
    )
    # What each machine has, shown on the offer and the create form (docs/inventory.md).
    MachineType.objects.filter(pk=offer.pk).update(
        vcpus=208, memory_gib=1800, nvme_gib=2048, gpu_link="nvlink", os_image="Ubuntu 22.04",
        driver_version="570", cuda_version="12.8",
    )  # fmt: skip
    machine_type_with_hosts(free=2, slug="use2-a100x8-vm", location=ohio)
    ssh_key(project, "laptop")
    credit(project, "1250.00")
    now = timezone.now()

    def cluster(name: str, state: str, /, **nodes) -> Cluster:
        live = state in Cluster.BILLED
        return ClusterFactory(
            project=project,
            machine_type=offer,
            name=name,
            status=state,
            joined_at=now - timedelta(hours=3) if live else None,
            ready_at=now - timedelta(hours=3) if state == Cluster.Status.READY else None,
            machines=True,
            **{f"machines__{field}": value for field, value in nodes.items()},
        )

    provisioning = cluster("train-provisioning", Cluster.Status.PROVISIONING, step=Node.Step.AGENT)
    ready = cluster(
        "train-ready", Cluster.Status.READY, status=Node.Status.JOINED, step=Node.Step.DONE
    )
    # Degraded as users meet it: Slurm did not install on node-1 (the banner, the rows, the
    # connect panel and the installer's output all say so).
    degraded = cluster(
        "train-degraded", Cluster.Status.DEGRADED, status=Node.Status.JOINED, step=Node.Step.INSTALL
    )
    why = "Installing Slurm failed on node-1: slurm service exited with status 1."
    Cluster.objects.filter(pk=degraded.pk).update(
        software=Cluster.Software.SLURM,
        failure_reason=Event.Reason.INSTALL_FAILED,
        failure_node="node-1",
        failure_step=Node.Step.INSTALL,
        failure_message=why,
    )
    EventFactory(
        cluster=degraded,
        reason=Event.Reason.INSTALL_FAILED,
        message=why,
        output="[node-1] installing slurm ... ok\n[node-1] starting slurmd ... FAILED\n",
    )
    degraded.refresh_from_db()
    failed = cluster("train-failed", Cluster.Status.FAILED, status=Node.Status.FAILED)
    EventFactory(
        cluster=failed,
        reason=Event.Reason.BOOT_TIMEOUT,
        message="node-1 did not boot within 10 minutes.",
    )
    terminated = cluster("train-done", Cluster.Status.TERMINATED, status=Node.Status.ENDED)
    # Idle for 45 minutes and degraded by a GPU's uncorrectable ECC errors: both notices show.
    idle = cluster("train-idle", Cluster.Status.DEGRADED, status=Node.Status.JOINED)
    ecc = "node-1 GPU 3: 2 uncorrectable ECC errors"
    Cluster.objects.filter(pk=idle.pk).update(
        idle_since=now - timedelta(minutes=45),
        failure_reason=Event.Reason.NODE_UNHEALTHY,
        failure_node="node-1",
        failure_message=f"{ecc}.",
        health_problems={
            "gpu:node-1:3:ecc": {"node": "node-1", "message": ecc, "healed": "node-1 GPU 3 ok"}
        },
    )
    EventFactory(cluster=idle, reason=Event.Reason.NODE_UNHEALTHY, message=f"{ecc}.")
    # The audit log with a line of the system's and one with a budget's before and after.
    audit.system(
        project=project,
        action="cluster.stopped_balance",
        object_type="cluster",
        object_id=terminated.pk,
        changes={"status": ["ready", "stopped"]},
    )
    audit_day(project, owner.user, terminated.pk)  # entries in words, a link, a refusal
    # Notification channels: a webhook with a delivered, a retrying and a failed delivery, one
    # failing for a day, a Slack channel switched off (its long URL shortened), one never sent.
    hook = Endpoint.objects.create(
        project=project,
        url="https://hooks.engines.example/runcrate",
        events=["cluster.ready", "cluster.failed", "billing.low_balance"],
    )
    for hours_ago, state, tries in (
        (3, Delivery.State.DELIVERED, [(503, "answered 503"), (200, "")]),
        (
            2,
            Delivery.State.PENDING,
            [(None, "ConnectError: [Errno 111] Connection refused by hooks.engines.example:443")],
        ),
        (1, Delivery.State.FAILED, [(404, "answered 404")]),
    ):
        created = now - timedelta(hours=hours_ago)
        sent = Delivery.objects.create(
            endpoint=hook,
            event_type="cluster.ready",
            body={},
            state=state,
            attempts=len(tries),
            created_at=created,
            next_attempt_at=created + timedelta(minutes=2),
            delivered_at=created + timedelta(minutes=1) if state == "delivered" else None,
        )
        for minutes, (status_code, error) in enumerate(tries):
            Attempt.objects.create(
                delivery=sent,
                at=created + timedelta(minutes=minutes),
                status_code=status_code,
                error=error,
            )
    Endpoint.objects.create(
        project=project,
        url="https://hooks.engines.example/failing",
        events=["node.unhealthy"],
        failing_since=now - timedelta(days=1),
    )
    Endpoint.objects.create(
        project=project,
        kind=Endpoint.Kind.SLACK,
        url="https://hooks.slack.com/services/T0ENGINES/B0CLUSTERS/abcdefghijklmnopqrstuvwx",
        events=list(EVENT_TYPES),
        active=False,
        failing_since=now - timedelta(days=4),
    )
    unsent = Endpoint.objects.create(
        project=project, url="https://hooks.engines.example/new", events=["cluster.idle"]
    )
    # The Logs & jobs tab with a machine's logs and the head's jobs read (simulated machines).
    for node, group in (
        (degraded.nodes.get(index=1), "logs"),
        (degraded.nodes.get(index=0), "jobs"),
    ):
        fetch = logs.fetch_for(node, group)
        assert logs.claim(fetch, now=now)
        logs.run_fetch(fetch_id=fetch.pk)
    seed_figures(ready, now)
    for billed in (ready, degraded):
        UsageRecord.objects.bulk_create(
            UsageRecord(
                project=project,
                cluster=billed,
                node=node,
                price_per_hour=offer.price_per_hour,
                started_at=now - timedelta(hours=3),
                charged_until=now - timedelta(minutes=1),
            )
            for node in billed.nodes.all()
        )
    # Last month's invoice (issue 24): the terminated cluster ran 5 hours then, charged by the
    # meter, with a card top-up; billing details it is made out to.
    last_month = Month.of(now).previous
    ran_from = last_month.start + timedelta(days=24, hours=10)
    UsageRecord.objects.bulk_create(
        UsageRecord(
            project=project,
            cluster=terminated,
            node=node,
            price_per_hour=offer.price_per_hour,
            started_at=ran_from,
            ended_at=ran_from + timedelta(hours=5, minutes=12),
            charged_until=ran_from,
        )
        for node in terminated.nodes.all()
    )
    charge_usage(cluster_id=terminated.pk)
    LedgerEntry.objects.create(
        project=project,
        kind=LedgerEntry.Kind.TOPUP,
        amount=Decimal("500.00"),
        note="Card top-up",
        created_at=ran_from - timedelta(days=2),
    )
    BillingDetails.objects.create(
        project=project,
        company_name="Analytical Engines Ltd",
        address="12 St James's Square\nLondon SW1Y 4JH\nUnited Kingdom",
        tax_id="GB 123 4567 89",
        invoice_email="accounts@engines.example",
    )
    Environment.objects.create(project=project, name="research", monthly_budget=Decimal("800"))
    volumes.create_volume(project=project, name="datasets", location="us-east-2", size_gb=500)
    quote = QuoteRequest.objects.create(
        project=project,
        gpu=offer.gpu,
        location=ohio,
        nodes=32,
        interconnect="infiniband",
        start_date=(now + timedelta(days=30)).date(),
        duration_weeks=8,
        contact_name="Ada Lovelace",
        contact_email="ada@example.com",
    )
    payment = Payment.objects.create(
        project=project,
        amount=Decimal("250.00"),
        idempotency_key="sweep",
        status=Payment.Status.OPEN,
    )
    paid = Payment.objects.create(
        project=project,
        amount=Decimal("100.00"),
        amount_paid=Decimal("100.00"),
        idempotency_key="sweep-paid",
        status=Payment.Status.PAID,
        credited_at=now,
    )
    # An invitation whose link the sweep knows: its sign-up fills in the invited email.
    Invitation.objects.create(
        project=project,
        email="invited@example.com",
        role=Membership.Role.DEVELOPER,
        invited_by=owner.user,
        token_hash=hashlib.sha256(b"sweep-invitation").hexdigest(),
        created_at=now,
        expires_at=now + timedelta(days=7),
    )
    uid = urlsafe_base64_encode(force_bytes(newcomer.user.pk))
    token = default_token_generator.make_token(newcomer.user)

    secured = with_two_factor("secured@example.com")
    parked = with_two_factor("parked@example.com")
    developer = Person(user=UserFactory(email="dev@example.com"), project=project, key="")
    Membership.objects.create(project=project, user=developer.user, role=Membership.Role.DEVELOPER)
    # Whose keys are on it, as the Connect tab says.
    Cluster.objects.filter(pk=ready.pk).update(
        key_holders=[
            {"name": "laptop", "fingerprint": "SHA256:x", "owner": owner.user.email},
            {"name": "dev-desktop", "fingerprint": "SHA256:y", "owner": developer.user.email},
            {"name": "deploy", "fingerprint": "SHA256:z", "owner": ""},
        ]
    )
    # A cluster runs and the balance covers about 24 minutes of it: the runway banner (issue 37).
    low_user = UserFactory(email="low@example.com")
    low = Person(user=low_user, project=create_project(owner=low_user, name="Low"), key="")
    bill_cluster(low.project, size=2, price="10.00", at=now - timedelta(minutes=5))
    credit(low.project, "8.00")
    people = {
        "low": low,
        "owner": owner,
        "developer": developer,
        "newcomer": newcomer,
        "staff": staff,
        "secured": secured,
        "parked": Parked(user=parked.user, project=parked.project, key=""),
    }
    pages = [
        Page("sign-up", "/accounts/signup/", "anonymous"),
        Page(
            "sign-up from an invitation",
            "/accounts/signup/?next=/accounts/invitations/sweep-invitation/",
            "anonymous",
        ),
        Page("sign-up, sent empty", "/accounts/signup/", "anonymous", then="button[type=submit]"),
        Page("log in", "/accounts/login/", "anonymous"),
        Page("password reset", "/accounts/password-reset/", "anonymous"),
        Page("password reset sent", "/accounts/password-reset/sent/", "anonymous"),
        Page("password reset link", f"/accounts/password-reset/{uid}/{token}/", "anonymous"),
        Page("password reset complete", "/accounts/password-reset/complete/", "anonymous"),
        Page("404, logged out", "/no-such-page/", "anonymous"),
        Page("clusters, none yet", "/clusters/", "newcomer"),
        Page("billing, nothing yet", "/billing/", "newcomer"),
        Page("clusters, the balance running out", "/clusters/", "low"),
        Page("storage, nothing yet", "/storage/", "newcomer"),
        Page("account, no keys", "/accounts/", "newcomer"),
        Page("clusters", "/clusters/", "owner", in_view=(".cluster-table td.num",)),
        Page("clusters, ended only", "/clusters/?show=ended", "owner"),
        Page("clusters, search finds none", "/clusters/?q=no-such-cluster", "owner"),
        Page("clusters, with messages", "/clusters/", "owner", flashes=True),
        Page("cluster provisioning", f"/clusters/{provisioning.pk}/", "owner"),
        Page("cluster ready", f"/clusters/{ready.pk}/", "owner"),
        Page("cluster degraded", f"/clusters/{degraded.pk}/", "owner"),
        Page(
            "cluster failed",
            f"/clusters/{failed.pk}/",
            "owner",
            in_view=(".offers-now .price-main", ".offers-now .btn"),
        ),
        Page("cluster terminated", f"/clusters/{terminated.pk}/", "owner"),
        # The cluster page's other tabs (clusters/web/views.py `TABS`), in the states that fill
        # them.
        Page("cluster ready, connect tab", f"/clusters/{ready.pk}/connect/", "owner"),
        Page("cluster ready, machines tab", f"/clusters/{ready.pk}/machines/", "owner"),
        Page("cluster ready, events tab", f"/clusters/{ready.pk}/events/", "owner"),
        Page("cluster ready, billing tab", f"/clusters/{ready.pk}/billing/", "owner"),
        Page("cluster ready, metrics tab", f"/clusters/{ready.pk}/metrics/", "owner"),
        Page(
            "cluster ready, metrics tab, the day",
            f"/clusters/{ready.pk}/metrics/?window=24h",
            "owner",
        ),
        Page("cluster starting, metrics tab", f"/clusters/{provisioning.pk}/metrics/", "owner"),
        Page("cluster idle with a GPU problem", f"/clusters/{idle.pk}/", "owner"),
        Page("cluster idle, machines tab", f"/clusters/{idle.pk}/machines/", "owner"),
        Page("cluster degraded, logs tab", f"/clusters/{degraded.pk}/logs/", "owner"),
        Page(
            "cluster degraded, a machine's logs",
            f"/clusters/{degraded.pk}/logs/node/?node=node-1",
            "owner",
        ),
        Page("cluster ready, logs tab", f"/clusters/{ready.pk}/logs/", "owner"),
        Page("cluster terminated, logs tab", f"/clusters/{terminated.pk}/logs/", "owner"),
        Page("cluster starting, machines tab", f"/clusters/{provisioning.pk}/machines/", "owner"),
        Page("cluster degraded, machines tab", f"/clusters/{degraded.pk}/machines/", "owner"),
        Page("cluster failed, events tab", f"/clusters/{failed.pk}/events/", "owner"),
        Page("cluster terminated, billing tab", f"/clusters/{terminated.pk}/billing/", "owner"),
        Page("terminate, confirm", f"/clusters/{ready.pk}/terminate/", "owner"),
        Page("add workers, confirm", f"/clusters/{ready.pk}/workers/?count=2", "owner"),
        Page("add workers, refused", f"/clusters/{ready.pk}/workers/?count=63", "owner"),
        Page("offers picker", "/offers/", "owner", in_view=(".offer .price-main", ".offer .btn")),
        Page("create form", f"/clusters/new/?offer={offer.slug}&nodes=2", "owner"),
        Page(
            "create form, sent empty",
            f"/clusters/new/?offer={offer.slug}&nodes=1",
            "owner",
            then="button:text('Create cluster')",
        ),
        Page("quote request", "/offers/quote/", "owner"),
        Page(
            "quote request, sent empty",
            "/offers/quote/",
            "owner",
            then="form.quote-form [type=submit]",
        ),
        Page("quotes", "/offers/quotes/", "owner"),
        Page("billing", "/billing/", "owner", in_view=(".statement td.num:last-child",)),
        Page(
            "cluster usage",
            f"/billing/clusters/{ready.pk}/",
            "owner",
            in_view=(".machines td.num:last-child",),
        ),
        Page(
            "environments and budgets",
            "/billing/environments/",
            "owner",
            in_view=(".spend-line .num", ".budget-form button"),
        ),
        Page("payment", f"/billing/payments/{payment.pk}/", "owner"),
        Page("payment, paid", f"/billing/payments/{paid.pk}/", "owner"),
        Page("invoices", "/billing/invoices/", "owner"),
        Page(
            "invoices, details sent empty",
            "/billing/invoices/",
            "newcomer",
            then=".invoice-details-card button[type=submit]",
        ),
        Page(
            "invoice",
            f"/billing/invoices/{last_month.param}/",
            "owner",
            in_view=(".invoice-lines td.num", ".invoice-total"),
        ),
        Page("invoice, this month", f"/billing/invoices/{Month.of(now).param}/", "owner"),
        Page("storage", "/storage/", "owner"),
        Page("account", "/accounts/", "owner", in_view=("#api-keys .btn", "#ssh-keys td .btn")),
        Page("audit log", "/audit/", "owner"),
        Page("members", "/accounts/members/", "owner"),
        Page("clusters, as a developer", "/clusters/", "developer"),
        Page("403, billing as a developer", "/billing/", "developer"),
        Page("audit log, a bad filter", "/audit/?since=yesterday-ish", "owner"),
        Page("notifications, none yet", "/notifications/", "newcomer"),
        Page("notifications", "/notifications/", "owner", in_view=("td.num .btn",)),
        Page(
            "notifications, add sent empty",
            "/notifications/",
            "newcomer",
            then="button:text('Add channel')",
        ),
        Page("notifications, a delivery log", f"/notifications/{hook.pk}/", "owner"),
        Page("notifications, an empty log", f"/notifications/{unsent.pk}/", "owner"),
        Page("notifications, remove", f"/notifications/{hook.pk}/remove/", "owner"),
        Page("password change", "/accounts/password/", "owner"),
        Page("two-factor verify", "/accounts/login/verify/", "parked", nav=False),
        Page(
            "two-factor verify, sent empty",
            "/accounts/login/verify/",
            "parked",
            nav=False,
            then="button:text('Verify')",
        ),
        Page("two-factor security, off", "/accounts/security/", "owner"),
        Page("two-factor security, on", "/accounts/security/", "secured"),
        Page("two-factor setup", "/accounts/security/setup/", "newcomer"),
        Page(
            "two-factor setup, sent empty",
            "/accounts/security/setup/",
            "newcomer",
            then="button:text('Confirm and turn on')",
        ),
        # Swagger UI draws this page inside the dashboard's frame; static/js/swagger-a11y.js
        # mends its markup (no link inside an operation's button, its parameters' choices
        # named, its examples reachable by keyboard) and static/css/swagger.css its contrast,
        # so every rule is checked there too: closed, and with operations open (a deep link
        # opens one) that have parameters with choices, a body and examples.
        Page("API docs", "/api/v1/docs", "owner", ready=".opblock"),
        Page(
            "API docs, an operation with choices open",
            "/api/v1/docs#/offers/offers_api_list_gpus",
            "owner",
            ready=".opblock.is-open .responses-table",
        ),
        Page(
            "API docs, an operation with a body open",
            "/api/v1/docs#/clusters/clusters_api_create_cluster",
            "owner",
            ready=".opblock.is-open .responses-table",
        ),
        # Django's plain page until templates/404.html extends base.html; then checked too.
        Page("404", "/clusters/999999/", "owner", nav=False),
        admin_page("index", "/admin/"),
        admin_page("quote requests", "/admin/offers/quoterequest/"),
        admin_page("quote request", f"/admin/offers/quoterequest/{quote.pk}/change/"),
        admin_page("clusters", "/admin/clusters/cluster/"),
        admin_page("cluster", f"/admin/clusters/cluster/{ready.pk}/change/"),
        admin_page("hosts", "/admin/offers/host/"),
        admin_page("machine types", "/admin/offers/machinetype/"),
        admin_page("ledger", "/admin/billing/ledgerentry/"),
    ]
    return people, pages


# The document's width against the window's, and what sticks out past its right edge.
OVERFLOW = """() => {
    const root = document.documentElement;
    const width = root.clientWidth;
    const culprits = [];
    if (root.scrollWidth > width) {
        const clipped = (element) => {
            for (let up = element.parentElement; up !== document.body; up = up.parentElement) {
                if (getComputedStyle(up).overflowX !== "visible") return true;
            }
            return false;
        };
        const all = [...document.body.querySelectorAll("*")];
        const outside = (element) => {
            const box = element.getBoundingClientRect();
            return box.right > width + 1 && box.width > 0;
        };
        // What sticks out on its own, else what escapes its scrolling box (an absolute child).
        let found = all.filter((element) => !clipped(element) && outside(element));
        if (!found.length) found = all.filter(outside);
        for (const element of found.slice(0, 6)) {
            const name = element.tagName.toLowerCase()
                + (element.id ? "#" + element.id : "")
                + (element.classList.length ? "." + [...element.classList].join(".") : "");
            const right = Math.round(element.getBoundingClientRect().right);
            culprits.push(`${name} (right edge ${right})`);
        }
    }
    return {scrollWidth: root.scrollWidth, clientWidth: width, culprits};
}"""

# The elements of `selector` that are not in view once the window is scrolled to each of them.
OUT_OF_VIEW = """(selector) => {
    const elements = [...document.querySelectorAll(selector)];
    if (!elements.length) return ["none on the page"];
    return elements.filter((element) => {
        let box = element.getBoundingClientRect();
        window.scrollTo(0, window.scrollY + box.top - window.innerHeight / 2);
        box = element.getBoundingClientRect();
        const hit = document.elementFromPoint(box.left + box.width / 2, box.top + box.height / 2);
        return !(box.left >= 0 && box.right <= document.documentElement.clientWidth
            && element.contains(hit));
    }).map((element) => element.textContent.trim().slice(0, 40));
}"""

AXE_RUN = """async ([impacts, rules]) => {
    const results = await axe.run(document, {resultTypes: ["violations"]});
    return results.violations
        .filter((violation) => impacts.includes(violation.impact) || rules.includes(violation.id))
        .map((violation) => ({
            id: violation.id,
            impact: violation.impact,
            help: violation.help,
            targets: violation.nodes.slice(0, 4).map((node) => node.target.join(" ")),
        }));
}"""

# The top bar's links and buttons (of the wide bar and of the phone's menu, which repeat the
# same ones), each with whether a user sees it now: rendered, inside the window, and not covered
# or clipped (what is at its centre is the element itself).
NAV_ITEMS = """() => [...document.querySelectorAll(
    "header nav[aria-label=Main] a, header .who a, header .who button"
)].map((element) => {
    const box = element.getBoundingClientRect();
    const x = box.left + box.width / 2, y = box.top + box.height / 2;
    const seen = element.checkVisibility({visibilityProperty: true}) && box.width > 0
        && box.left >= 0 && box.right <= document.documentElement.clientWidth
        && box.top >= 0 && box.bottom <= window.innerHeight
        && element.contains(document.elementFromPoint(x, y));
    return {item: element.getAttribute("href") || element.textContent.trim(), seen};
})"""


def nav_problems(page, shot: Path | None) -> list[str]:
    """The top bar's items that are neither shown nor shown once the menu is opened."""

    def unseen() -> list[str]:
        items = page.evaluate(NAV_ITEMS)
        return sorted({i["item"] for i in items} - {i["item"] for i in items if i["seen"]})

    if not page.evaluate(NAV_ITEMS):
        return ["no main navigation"]
    missing = unseen()
    if not missing:
        return []
    toggle = page.locator("header .nav-menu > summary")
    if not toggle.is_visible():
        return [f"navigation not visible and no menu to open: {', '.join(missing)}"]
    toggle.click()
    missing = unseen()
    if shot is not None:
        page.screenshot(path=str(shot))
    toggle.click()
    return [f"not reachable through the menu: {', '.join(missing)}"] if missing else []


def flash_cookie(url: str) -> dict:
    """Django's messages cookie holding one message of each level, as a redirect would leave."""
    storage = CookieStorage(HttpRequest())
    levels = [constants.SUCCESS, constants.INFO, constants.WARNING, constants.ERROR]
    messages = [Message(level, f"A {constants.DEFAULT_TAGS[level]} message.") for level in levels]
    value = storage._encode(messages)
    return {"name": storage.cookie_name, "value": value, "url": url}


def check(page, target: Page, mode: str, shots: Path | None, base_url: str) -> list[str]:
    if target.flashes:
        page.context.add_cookies([flash_cookie(base_url)])
    if "#" in target.path:  # from the same page, a new fragment alone would load nothing
        page.goto("about:blank")
    response = page.goto(target.path, wait_until="load")
    if target.then:
        with page.expect_navigation():
            page.click(target.then)
    if target.ready:
        page.wait_for_selector(target.ready)
    problems: list[str] = []
    expected_status = int(target.name[:3]) if target.name[:3] in ("403", "404") else 200
    if response is None or response.status != expected_status:
        status = response.status if response else "none"
        problems.append(f"answered {status}, not {expected_status}")
    slug = "".join(c if c.isalnum() else "-" for c in target.name)
    if shots is not None:
        page.screenshot(path=str(shots / f"{mode}--{slug}.png"), full_page=True)
    overflow = page.evaluate(OVERFLOW)
    if overflow["scrollWidth"] > overflow["clientWidth"]:
        problems.append(
            f"scrolls sideways ({overflow['scrollWidth']} px wide in {overflow['clientWidth']}): "
            + "; ".join(overflow["culprits"])
        )
    for selector in target.in_view:
        if hidden := page.evaluate(OUT_OF_VIEW, selector):
            problems.append(f"{selector} not in view: {hidden}")
    page.evaluate("window.scrollTo(0, 0)")
    if target.who != "anonymous" and (target.nav or page.locator("header .nav").count()):
        menu_shot = shots / f"{mode}--{slug}--menu.png" if shots is not None else None
        problems.extend(nav_problems(page, menu_shot))
    for violation in page.evaluate(AXE_RUN, [list(target.impacts), FAILING_RULES]):
        if violation["id"] in target.axe_skip:
            continue
        problems.append(
            f"axe {violation['id']} ({violation['impact']}: {violation['help']}) at "
            + json.dumps(violation["targets"])
        )
    return [f"[{mode}] {target.name} ({target.path}): {problem}" for problem in problems]


def session_cookie(person: Person, url: str) -> dict:
    client = Client()
    if isinstance(person, Parked):
        client.post(
            "/accounts/login/", {"username": person.user.email, "password": "correct-horse-battery"}
        )
    else:
        client.force_login(person.user)
    return {"name": settings.SESSION_COOKIE_NAME, "value": client.session.session_key, "url": url}


@pytest.mark.parametrize("mode", MODES)
def test_it_fits_every_page_on_the_screen_with_its_navigation_and_no_axe_violation(
    browser, live_server, axe_source, owner, stranger, mode
):
    people, pages = world(owner, newcomer=stranger)
    if only := os.environ.get("RUNCRATE_SWEEP_PAGES", "").split(","):
        pages = [p for p in pages if any(word.strip() in p.name for word in only)]
    shots = os.environ.get("RUNCRATE_SWEEP_SHOTS")
    shots = Path(shots) if shots else None
    if shots is not None:
        shots.mkdir(parents=True, exist_ok=True)
    problems: list[str] = []
    for who in ["anonymous", *people]:
        context = browser.new_context(base_url=live_server.url, **MODES[mode])
        # An init script is not a page's script, so the strict CSP does not refuse it.
        context.add_init_script(script=axe_source)
        if who != "anonymous":
            context.add_cookies([session_cookie(people[who], live_server.url)])
        page = context.new_page()
        for target in (p for p in pages if p.who == who):
            problems.extend(check(page, target, mode, shots, live_server.url))
        context.close()
    assert not problems, f"{len(problems)} problems:\n" + "\n".join(problems)


def test_it_opens_the_phone_menu_without_javascript(browser, live_server, owner):
    context = browser.new_context(
        base_url=live_server.url, java_script_enabled=False, **MODES["390-light"]
    )
    context.add_cookies([session_cookie(owner, live_server.url)])
    page = context.new_page()
    page.goto("/billing/")
    links = page.locator("header .nav-menu nav a")
    assert links.count() == page.locator("header .nav-wide a").count() > 0
    assert not any(links.nth(i).is_visible() for i in range(links.count()))
    assert nav_problems(page, None) == []
    context.close()


def test_it_closes_the_phone_menu_on_escape_and_on_a_click_outside(browser, live_server, owner):
    context = browser.new_context(base_url=live_server.url, **MODES["390-light"])
    context.add_cookies([session_cookie(owner, live_server.url)])
    page = context.new_page()
    page.goto("/clusters/")
    menu, toggle = page.locator("header .nav-menu"), page.locator("header .nav-menu > summary")
    toggle.click()
    assert page.get_by_role("link", name="Storage").is_visible()
    page.keyboard.press("Escape")
    assert menu.get_attribute("open") is None
    assert page.evaluate("document.activeElement.tagName") == "SUMMARY"
    toggle.click()
    page.mouse.click(200, 700)
    assert menu.get_attribute("open") is None
    context.close()


def test_it_offers_a_skip_link_first_that_shows_on_focus_and_lands_in_main(
    browser, live_server, owner
):
    context = browser.new_context(base_url=live_server.url, **MODES["390-dark"])
    context.add_cookies([session_cookie(owner, live_server.url)])
    page = context.new_page()
    page.goto("/clusters/")
    skip = page.locator("a.skip-link")
    assert skip.bounding_box()["y"] < 0  # off screen until focused

    page.keyboard.press("Tab")

    assert page.evaluate("document.activeElement.textContent") == "Skip to content"
    box = skip.bounding_box()
    assert box["y"] >= 0 and box["x"] >= 0
    page.keyboard.press("Enter")
    assert page.evaluate("document.activeElement.id") == "main"
    context.close()
