"""The authorization matrix (issue 33): every page and every API operation, called by an owner,
a manager, a developer, a stranger (the owner of another project) and a visitor signed in
nowhere, against real objects of the owner's project.

The routes are read from the URL conf and the API's schema; each is named below with the rule
that guards it, an action of the permission table (accounts/permissions.py `TABLE`) or one of
the few kinds of route that no role decides. The expected answer of each role is computed from
the table: a role it refuses gets 403, a role it allows gets past the check (neither 403 nor
404), a stranger gets 404 for an object of another project, a visitor the login page (or 401
from the API). A route added without a rule here fails `test_every_route_has_a_rule`, naming it.

Each call runs in a savepoint rolled back after it, so what one role's call changes (a revoked
key, a terminated cluster) is not what the next role finds.
"""

import json
from collections.abc import Callable
from dataclasses import dataclass
from datetime import date
from decimal import Decimal

import pytest
from django.db import transaction
from django.test import Client
from django.urls import URLPattern, URLResolver, get_resolver, reverse

from accounts import invitations, keys, permissions
from accounts.models import ApiKey, Invitation, Membership, SshKey
from billing.models import Payment
from clusters.models import Cluster, Node, Volume
from notifications.endpoints import create_endpoint
from notifications.models import Endpoint
from offers.models import QuoteRequest
from runcrate.api import api
from tests.accounts.sshkeys import ed25519_line
from tests.conftest import Person, _person
from tests.factories import ClusterFactory, GpuModelFactory

# Routes no role of the table decides.
PUBLIC = "public"  # anyone, signed in or not (sign-up, log-in, health checks, Stripe's calls)
SIGNED_IN = "signed in"  # any signed-in user, about themselves or the project they act in
MEMBER = "member"  # any member of the object's project (reading a cluster, its files)
AGENT = "agent"  # a node's agent, by the node's token: no person's key is one

# Every page, by URL name, with its rule.
PAGES: dict[str, str] = {
    "home": SIGNED_IN,
    "healthz": PUBLIC,
    "readyz": PUBLIC,
    "accounts:login": PUBLIC,
    "accounts:signup": PUBLIC,
    "accounts:two_factor_verify": PUBLIC,
    "accounts:password_reset": PUBLIC,
    "accounts:password_reset_sent": PUBLIC,
    "accounts:password_reset_confirm": PUBLIC,
    "accounts:password_reset_complete": PUBLIC,
    "accounts:invitation": PUBLIC,
    "billing:stripe_webhook": PUBLIC,
    "accounts:logout": SIGNED_IN,
    "accounts:account": SIGNED_IN,
    "accounts:ssh_keys": SIGNED_IN,
    "accounts:switch_project": MEMBER,  # to the owner's project: a stranger's is a 404
    "accounts:security": SIGNED_IN,
    "accounts:password_change": SIGNED_IN,
    "accounts:password_change_done": SIGNED_IN,
    "accounts:two_factor_setup": SIGNED_IN,
    "accounts:two_factor_turn_off": SIGNED_IN,
    "accounts:two_factor_recovery_codes": SIGNED_IN,
    "accounts:two_factor_require": "project.require_two_factor",
    "accounts:create_api_key": "keys.own",
    "accounts:add_ssh_key": "keys.own",
    "accounts:revoke_api_key": "keys.remove_others",  # the target's key, not the caller's
    "accounts:remove_ssh_key": "keys.remove_others",
    "accounts:members": "team.view",
    "accounts:invite": "team.invite_developer",
    "accounts:change_role": "team.change_role",
    "accounts:remove_member": "team.remove",
    "accounts:revoke_invitation": "team.invite_developer",
    "audit:list": "audit.view",
    "audit:export": "audit.view",
    "billing:index": "billing.view",
    "billing:export": "billing.view",
    "billing:cluster_usage": "billing.view",
    "billing:add_credit": "billing.manage",
    "billing:payment": "billing.view",
    "billing:payment_retry": "billing.manage",
    "billing:demo_checkout": "billing.manage",
    "billing:demo_pay": "billing.manage",
    "billing:dismiss_banner": SIGNED_IN,
    "billing:invoices": "billing.view",
    "billing:invoice_details": "billing.manage",
    "billing:invoice": "billing.view",
    "billing:environments": "billing.view",
    "billing:set_budget": "budgets.manage",
    "clusters:list": MEMBER,
    "clusters:new": "clusters.manage",
    "clusters:detail": MEMBER,
    "clusters:tab": MEMBER,
    "clusters:ssh_config": MEMBER,
    "clusters:known_hosts": MEMBER,
    "clusters:hostfile": MEMBER,
    "clusters:kubeconfig": MEMBER,
    "clusters:logs_node": MEMBER,
    "clusters:logs_jobs": MEMBER,
    "clusters:logs_download": MEMBER,
    "clusters:logs_fetch": "clusters.manage",
    "clusters:terminate": "clusters.manage",
    "clusters:retry_install": "clusters.manage",
    "clusters:add_workers": "clusters.manage",
    "clusters:replace_node": "clusters.manage",
    "clusters:repair_policy": "clusters.manage",
    "clusters:network_test": "clusters.manage",
    "storage:list": "volumes.manage",
    "storage:delete": "volumes.manage",
    "notifications:list": "notifications.manage",
    "notifications:add": "notifications.manage",
    "notifications:deliveries": "notifications.manage",
    "notifications:send_test": "notifications.manage",
    "notifications:remove": "notifications.manage",
    "offers:picker": MEMBER,
    "offers:quote": MEMBER,
    "offers:quotes": MEMBER,
}

# Every API operation, by operation id, with its rule.
OPERATIONS: dict[str, str] = {
    "offers_api_list_gpus": MEMBER,
    "offers_api_offers": MEMBER,
    "offers_api_create_quote": MEMBER,
    "offers_api_list_quotes": MEMBER,
    "offers_api_get_quote": MEMBER,
    "accounts_api_me": MEMBER,
    "accounts_api_list_ssh_keys": "keys.own",
    "accounts_api_create_ssh_key": "keys.own",
    "accounts_api_get_ssh_key": "keys.own",
    "accounts_api_delete_ssh_key": "keys.remove_others",
    "accounts_api_list_api_keys": "keys.own",
    "accounts_api_create_api_key": "keys.own",
    "accounts_api_revoke_api_key": "keys.remove_others",
    "accounts_api_list_members": "team.view",
    "accounts_api_invite_member": "team.invite_developer",
    "accounts_api_change_member": "team.change_role",
    "accounts_api_remove_member": "team.remove",
    "clusters_api_list_clusters": "clusters.manage",
    "clusters_api_create_cluster": "clusters.manage",
    "clusters_api_plan_cluster": "clusters.manage",
    "clusters_api_get_cluster": "clusters.manage",
    "clusters_api_terminate_cluster": "clusters.manage",
    "clusters_api_retry_install": "clusters.manage",
    "clusters_api_add_workers": "clusters.manage",
    "clusters_api_plan_add_workers": "clusters.manage",
    "clusters_api_plan_replace": "clusters.manage",
    "clusters_api_replace_node": "clusters.manage",
    "clusters_api_change_cluster": "clusters.manage",
    "clusters_api_run_network_test": "clusters.manage",
    "clusters_api_delete_machine": "clusters.manage",
    "clusters_api_cluster_metrics": "clusters.manage",
    "clusters_api_cluster_connect": "clusters.manage",
    "clusters_api_list_volumes": "volumes.manage",
    "clusters_api_create_volume": "volumes.manage",
    "clusters_api_delete_volume": "volumes.manage",
    "billing_api_balance": "billing.view",
    "billing_api_usage_of_month": "billing.view",
    "billing_api_transactions": "billing.view",
    "billing_api_put_budget": "budgets.manage",
    "notifications_api_list_webhooks": "notifications.manage",
    "notifications_api_create_webhook": "notifications.manage",
    "notifications_api_delete_webhook": "notifications.manage",
    "notifications_api_test_webhook": "notifications.manage",
    "notifications_api_list_deliveries": "notifications.manage",
    "audit_api_list_audit": "audit.view",
    "clusters_agent_api_check_in": AGENT,
    "clusters_agent_api_network": AGENT,
    "clusters_agent_api_report_metrics": AGENT,
}

# An allowed role may still get a 404 here, after the check, for a reason of the object named.
NOT_FOUND_AFTER_THE_CHECK: dict[str, str] = {
    "accounts:invitation": "an unknown invitation token is a 404 to anyone",
    "billing:invoice": "the month has no invoice lines (a month without usage is a 404)",
    "billing:demo_checkout": "the demo's checkout exists only for a demo payment",
    "billing:demo_pay": "the demo's checkout exists only for a demo payment",
    "clusters:new": "without an offer named in ?offer= the page says none is chosen",
    "clusters:kubeconfig": "a cluster without Kubernetes has no kubeconfig",
    "clusters:logs_download": "no logs were fetched for the node yet",
}
# Named by a name the caller's own project has too (an environment): a stranger reaches theirs.
OWN_PROJECTS_NAME = {"billing:set_budget", "billing_api_put_budget"}
# May answer 503 to anyone: the readiness check says a service it needs is down (here, celery).
UNAVAILABLE_MAY_BE = {"readyz"}

# What a POST sends: a valid body where the API reads one before any check of the caller.
PAGE_BODIES: dict[str, Callable[["World"], dict]] = {
    "accounts:switch_project": lambda w: {"project": w.people["owner"].project.pk},
    "clusters:repair_policy": lambda w: {"repair_policy": "auto"},
}
API_BODIES: dict[str, dict] = {
    "accounts_api_change_member": {"role": "manager"},
    "accounts_api_invite_member": {"email": "new@example.com", "role": "developer"},
    "notifications_api_create_webhook": {
        "url": "http://127.0.0.1:9/new",
        "events": ["cluster.ready"],
    },
    "billing_api_put_budget": {"amount": "500.00"},
    "clusters_api_add_workers": {"count": 1},
    "clusters_api_plan_add_workers": {"count": 1},
    "clusters_api_change_cluster": {"repair_policy": "auto"},
    "clusters_agent_api_network": {"reachability": {}},
}

ROLES = ("owner", "manager", "developer")


@dataclass
class World:
    """The owner's project with one of everything, a member of each role, and a stranger."""

    people: dict[str, Person]  # owner, manager, developer, target, stranger
    cluster: Cluster
    volume: Volume
    ssh_key: SshKey
    api_key: ApiKey
    membership: Membership
    invitation: Invitation
    endpoint: Endpoint
    payment: Payment
    quote: QuoteRequest

    @property
    def environment(self) -> str:
        return self.cluster.environment.name


@pytest.fixture
def world(owner, settings) -> World:
    settings.DEBUG = True  # a webhook on 127.0.0.1 over http (tests/notifications/conftest.py)
    settings.RUNCRATE_WEBHOOKS_ALLOW_PRIVATE = True
    manager = _person("manager@example.com", project=owner.project)
    Membership.objects.filter(user=manager.user).update(role=Membership.Role.MANAGER)
    developer = _person("developer@example.com", project=owner.project)
    # The developer whose things the others act on: another member's key, cluster, membership.
    target = _person("target@example.com", project=owner.project)
    stranger = _person("stranger@example.com")
    project = owner.project
    cluster = ClusterFactory(
        project=project,
        created_by=target.user,
        status=Cluster.Status.READY,
        machines=True,
        machines__status=Node.Status.JOINED,
        machines__step=Node.Step.DONE,
    )
    gpu = GpuModelFactory()
    return World(
        people={
            "owner": owner,
            "manager": manager,
            "developer": developer,
            "target": target,
            "stranger": stranger,
        },
        cluster=cluster,
        volume=Volume.objects.create(
            project=project,
            name="datasets",
            location=cluster.machine_type.location,
            size_gb=100,
            price_per_gb_month=Decimal("0.10"),
        ),
        ssh_key=keys.add_ssh_key(
            project=project, user=target.user, name="target-laptop", public_key=ed25519_line()
        ),
        api_key=ApiKey.objects.get(user=target.user, project=project),
        membership=Membership.objects.get(user=target.user, project=project),
        invitation=invitations.invite(
            project=project,
            by=owner.user,
            email="invited@example.com",
            role=Membership.Role.DEVELOPER,
            now=cluster.created_at,
        ),
        endpoint=create_endpoint(
            project=project,
            user=owner.user,
            url="http://127.0.0.1:9/hooks",
            events=["cluster.ready"],
        ),
        payment=Payment.objects.create(
            project=project, created_by=owner.user, amount=Decimal("10.00"), idempotency_key="m"
        ),
        quote=QuoteRequest.objects.create(
            project=project,
            requested_by=target.user,
            gpu=gpu,
            nodes=4,
            interconnect="infiniband",
            start_date=date(2031, 1, 6),
            duration_weeks=4,
            contact_name="Target",
            contact_email="target@example.com",
        ),
    )


# The URL of each page, with the owner's project's objects in it.
PAGE_ARGUMENTS: dict[str, Callable[[World], dict]] = {
    "accounts:revoke_api_key": lambda w: {"pk": w.api_key.pk},
    "accounts:remove_ssh_key": lambda w: {"pk": w.ssh_key.pk},
    "accounts:change_role": lambda w: {"pk": w.membership.pk},
    "accounts:remove_member": lambda w: {"pk": w.membership.pk},
    "accounts:revoke_invitation": lambda w: {"pk": w.invitation.pk},
    "accounts:invitation": lambda w: {"token": "not-a-token"},
    "accounts:password_reset_confirm": lambda w: {"uidb64": "MQ", "token": "set-password"},
    "billing:cluster_usage": lambda w: {"cluster_id": w.cluster.pk},
    "billing:payment": lambda w: {"pk": w.payment.pk},
    "billing:payment_retry": lambda w: {"pk": w.payment.pk},
    "billing:demo_checkout": lambda w: {"pk": w.payment.pk},
    "billing:demo_pay": lambda w: {"pk": w.payment.pk},
    "billing:invoice": lambda w: {"month": "2030-01"},
    "billing:set_budget": lambda w: {"name": w.environment},
    "clusters:logs_download": lambda w: {"pk": w.cluster.pk, "node": "node-0", "kind": "system"},
    "clusters:tab": lambda w: {"pk": w.cluster.pk, "tab": "events"},
    "clusters:replace_node": lambda w: {"pk": w.cluster.pk, "node": "node-1"},
    "notifications:deliveries": lambda w: {"endpoint_id": w.endpoint.pk},
    "notifications:send_test": lambda w: {"endpoint_id": w.endpoint.pk},
    "notifications:remove": lambda w: {"endpoint_id": w.endpoint.pk},
    "storage:delete": lambda w: {"pk": w.volume.pk},
}
# Every other cluster page names the cluster alone.
for _name in set(PAGES) - set(PAGE_ARGUMENTS) - {"clusters:list", "clusters:new"}:
    if _name.startswith("clusters:"):
        PAGE_ARGUMENTS[_name] = lambda w: {"pk": w.cluster.pk}

# The object each API path's parameter names, by operation id.
API_ARGUMENTS: dict[str, Callable[[World], dict]] = {
    "offers_api_get_quote": lambda w: {"quote_id": w.quote.pk},
    "accounts_api_get_ssh_key": lambda w: {"key_id": w.ssh_key.pk},
    "accounts_api_delete_ssh_key": lambda w: {"key_id": w.ssh_key.pk},
    "accounts_api_revoke_api_key": lambda w: {"key_id": w.api_key.pk},
    "accounts_api_change_member": lambda w: {"member_id": w.membership.pk},
    "accounts_api_remove_member": lambda w: {"member_id": w.membership.pk},
    "clusters_api_delete_machine": lambda w: {"cluster_id": w.cluster.pk, "name": "node-1"},
    "clusters_api_plan_replace": lambda w: {"cluster_id": w.cluster.pk, "name": "node-1"},
    "clusters_api_replace_node": lambda w: {"cluster_id": w.cluster.pk, "name": "node-1"},
    "clusters_api_delete_volume": lambda w: {"volume_id": w.volume.pk},
    "billing_api_put_budget": lambda w: {"name": w.environment},
    "notifications_api_delete_webhook": lambda w: {"webhook_id": w.endpoint.pk},
    "notifications_api_test_webhook": lambda w: {"webhook_id": w.endpoint.pk},
    "notifications_api_list_deliveries": lambda w: {"webhook_id": w.endpoint.pk},
    "clusters_agent_api_check_in": lambda w: {"node_id": w.cluster.nodes.first().pk},
    "clusters_agent_api_network": lambda w: {"node_id": w.cluster.nodes.first().pk},
    "clusters_agent_api_report_metrics": lambda w: {"node_id": w.cluster.nodes.first().pk},
}


def _page_routes(resolver=None, prefix="", namespace=""):
    """The name of every page route, admin and the API apart (tests/audit/test_walk.py)."""
    resolver = resolver or get_resolver()
    for pattern in resolver.url_patterns:
        route = prefix + str(pattern.pattern)
        if isinstance(pattern, URLResolver):
            if route.startswith(("admin/", "api/")):
                continue
            inner = namespace + (f"{pattern.namespace}:" if pattern.namespace else "")
            yield from _page_routes(pattern, route, inner)
        elif isinstance(pattern, URLPattern) and pattern.name:
            yield namespace + pattern.name


def _api_operations() -> list[tuple[str, str, str]]:
    """(method, path, operation id) of every operation of the API's schema."""
    return sorted(
        (method.upper(), path, operation["operationId"])
        for path, operations in api.get_openapi_schema()["paths"].items()
        for method, operation in operations.items()
    )


ROUTES = sorted(set(_page_routes()))
API_OPERATIONS = _api_operations()


def test_every_route_has_a_rule():
    """A page or an operation added without saying who may call it fails here, by name."""
    unruled = [name for name in ROUTES if name not in PAGES]
    unruled += [op for _, _, op in API_OPERATIONS if op not in OPERATIONS]
    assert unruled == [], f"Say in PAGES or OPERATIONS who may call: {', '.join(unruled)}"
    stale = set(PAGES) - set(ROUTES) | set(OPERATIONS) - {op for _, _, op in API_OPERATIONS}
    assert stale == set(), f"No such route any more: {', '.join(sorted(stale))}"
    for rule in [*PAGES.values(), *OPERATIONS.values()]:
        assert rule in (PUBLIC, SIGNED_IN, MEMBER, AGENT) or permissions.roles_for(rule)


def _allowed(rule: str, role: str) -> bool:
    if rule in (PUBLIC, SIGNED_IN, MEMBER):
        return True
    if rule == AGENT:
        return False
    return permissions.allowed(role, rule)


def _call(client: Client, method: str, url: str, body: dict | None = None, *, form=False):
    """The answer, in a savepoint rolled back after it: the next role finds the same world."""
    with transaction.atomic():
        if method == "GET":
            response = client.get(url)
        elif form:
            response = client.post(url, body or {})
        else:
            response = client.generic(
                method, url, json.dumps(body or {}), content_type="application/json"
            )
        transaction.set_rollback(True)
    return response


def _page_url(name: str, world: World) -> str:
    arguments = PAGE_ARGUMENTS.get(name)
    return reverse(name, kwargs=arguments(world) if arguments else None)


def _page_method(client: Client, url: str) -> str:
    """GET, or POST for a route that takes no GET (an action)."""
    return "POST" if _call(client, "GET", url).status_code == 405 else "GET"


@pytest.mark.parametrize("name", ROUTES)
def test_every_page_answers_each_role_as_the_table_says(world, name):
    rule = PAGES.get(name)
    assert rule is not None, f"{name} has no rule in PAGES"
    url = _page_url(name, world)
    owners = world.people["owner"].browser_client()
    method = _page_method(owners, url)
    has_object = (name in PAGE_ARGUMENTS or name in PAGE_BODIES) and rule not in (
        PUBLIC,
        SIGNED_IN,
    )
    has_object = has_object and name not in OWN_PROJECTS_NAME
    body = PAGE_BODIES.get(name, lambda w: {})(world)
    answers = {}
    for role in (*ROLES, "stranger", "visitor"):
        client = Client() if role == "visitor" else world.people[role].browser_client()
        answers[role] = _call(client, method, url, body, form=True)
    seen = {role: response.status_code for role, response in answers.items()}

    for role in ROLES:
        status = seen[role]
        assert status < 500 or name in UNAVAILABLE_MAY_BE, f"{name} {method} as {role}: {status}"
        if _allowed(rule, role):
            allowed_404 = name in NOT_FOUND_AFTER_THE_CHECK
            assert status != 403 and (status != 404 or allowed_404), (
                f"{name} {method} as {role}, allowed by {rule!r}: {status}"
            )
        else:
            assert status == 403, f"{name} {method} as {role}, refused by {rule!r}: {seen}"
    if has_object:
        assert seen["stranger"] == 404, f"{name} {method} as a stranger: {seen}"
    else:
        # The stranger acts in their own project, where the table makes them the owner.
        refused = (403,) if name in NOT_FOUND_AFTER_THE_CHECK else (403, 404)
        assert seen["stranger"] not in refused, seen
    if rule == PUBLIC:
        assert seen["visitor"] < 500 or name in UNAVAILABLE_MAY_BE
    else:
        assert seen["visitor"] == 302, f"{name} {method} as a visitor: {seen}"
        assert answers["visitor"]["location"].startswith("/accounts/login/")


def _api_url(path: str, operation: str, world: World) -> str:
    arguments = API_ARGUMENTS.get(operation, lambda w: {})(world)
    if "{cluster_id}" in path:
        arguments.setdefault("cluster_id", world.cluster.pk)
    url = path
    for key, value in arguments.items():
        url = url.replace("{" + key + "}", str(value))
    assert "{" not in url, f"{operation}: say in API_ARGUMENTS what {path} names"
    return url


@pytest.mark.parametrize(
    ("method", "path", "operation"), API_OPERATIONS, ids=[op for _, _, op in API_OPERATIONS]
)
def test_every_api_operation_answers_each_role_as_the_table_says(world, method, path, operation):
    rule = OPERATIONS.get(operation)
    assert rule is not None, f"{operation} has no rule in OPERATIONS"
    url = _api_url(path, operation, world)
    has_object = operation in API_ARGUMENTS or "{cluster_id}" in path
    has_object = has_object and operation not in OWN_PROJECTS_NAME
    body = API_BODIES.get(operation)
    people = (*ROLES, "stranger")
    seen = {role: _call(world.people[role].api(), method, url, body) for role in people}
    seen["visitor"] = _call(Client(), method, url, body)
    status = {role: response.status_code for role, response in seen.items()}

    for role in ROLES:
        assert status[role] < 500, f"{operation} as {role}: {status}"
        if rule == AGENT:
            # A person's key is no node's token.
            assert status[role] in (401, 403), f"{operation} as {role}: {status}"
        elif _allowed(rule, role):
            assert status[role] not in (401, 403, 404), (
                f"{operation} as {role}, allowed by {rule!r}: {status[role]} "
                f"{seen[role].content[:300]!r}"
            )
        else:
            assert status[role] == 403, f"{operation} as {role}, refused by {rule!r}: {status}"
            assert seen[role].json()["error"]["code"] == "role_forbidden"
    if rule == AGENT:
        assert status["stranger"] in (401, 403)
    elif has_object:
        assert status["stranger"] == 404, f"{operation} as a stranger: {status}"
    else:
        assert status["stranger"] < 500 and status["stranger"] not in (401, 403, 404), status
    expected = (401, 403) if rule == AGENT else (401,)  # the agent's auth answers 403
    assert status["visitor"] in expected, f"{operation} with no key: {status}"
