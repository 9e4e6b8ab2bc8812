"""A team from the invitation to a developer's cluster (docs/accounts.md): the owner invites a
developer by email; the developer joins through the link, creates a cluster that gets their own
key (not the owner's), terminates it, and meets the permission table's refusals for billing,
budgets and the team, in the dashboard and in the API with a key of their own."""

import re
from decimal import Decimal

import pytest
from django.core import mail
from django.test import Client

from accounts import keys
from accounts.models import Membership, User
from clusters.models import Cluster
from tests.accounts.sshkeys import ed25519_line
from tests.accounts.test_invitations import PASSWORD, invite, link_in
from tests.clusters.front import credit, machine_type_with_hosts
from tests.factories import issue_key


@pytest.fixture(autouse=True)
def _work_in_memory():
    from clusters import lifecycle

    with lifecycle.dispatching_to(lifecycle.CollectingDispatcher()) as dispatcher:
        yield dispatcher


def ticked_keys(html: str) -> list[str]:
    """The values of the create form's ticked SSH key boxes."""
    boxes = re.findall(r'<input[^>]*name="ssh_keys"[^>]*>', html)
    return [re.search(r'value="(\d+)"', box).group(1) for box in boxes if " checked" in box]


def join(owner, email: str, captured) -> tuple[Client, User]:
    with captured(execute=True):
        assert invite(owner.browser_client(), email).status_code == 302
    link = link_in(mail.outbox[-1])
    visitor = Client()
    visitor.post(
        f"/accounts/signup/?next={link}",
        {"email": email, "password1": PASSWORD, "password2": PASSWORD},
    )
    assert visitor.post(link).status_code == 302
    return visitor, User.objects.get(email=email)


def test_a_developer_joins_creates_and_terminates_and_is_refused_billing_budgets_and_team(
    owner, django_capture_on_commit_callbacks
):
    owners_key = keys.add_ssh_key(
        project=owner.project, user=owner.user, name="owner-laptop", public_key=ed25519_line()
    )
    credit(owner.project, "500.00")
    offer = machine_type_with_hosts(free=4, slug="use2-h100x8-vm", price_per_hour=Decimal("10"))

    dev, dev_user = join(owner, "dev@example.com", django_capture_on_commit_callbacks)
    assert Membership.objects.get(project=owner.project, user=dev_user).role == "developer"

    # Their own key, added as any member adds one.
    added = dev.post(
        "/accounts/ssh-keys/add/", {"name": "dev-laptop", "public_key": ed25519_line()}
    )
    assert added.status_code == 302
    devs_key = owner.project.ssh_keys.get(name="dev-laptop")
    assert devs_key.created_by == dev_user

    # The create form offers both keys, says whose each is, and ticks only the developer's.
    form = dev.get(f"/clusters/new/?offer={offer.slug}&nodes=2")
    assert form.status_code == 200
    html = form.content.decode()
    assert ticked_keys(html) == [str(devs_key.pk)]
    assert "owner@example.com's" in html and "yours" in html
    created = dev.post(
        "/clusters/new/",
        {
            "offer": offer.slug,
            "name": "devs-run",
            "nodes": "2",
            "environment": "default",
            "software": "none",
            "ssh_keys": ticked_keys(html),
        },
    )
    assert created.status_code == 302
    cluster = Cluster.objects.get(name="devs-run")
    assert (cluster.project, cluster.created_by) == (owner.project, dev_user)
    assert list(cluster.ssh_keys.all()) == [devs_key]
    assert owners_key.public_key not in cluster.authorized_keys
    assert cluster.key_holders == [
        {"name": "dev-laptop", "fingerprint": devs_key.fingerprint, "owner": "dev@example.com"}
    ]

    assert dev.post(f"/clusters/{cluster.pk}/terminate/").status_code == 302
    cluster.refresh_from_db()
    assert cluster.status in (Cluster.Status.TERMINATING, Cluster.Status.TERMINATED)

    # No billing, budgets or team in the dashboard: no link, and the pages refuse with why.
    page = dev.get("/clusters/").content.decode()
    assert 'href="/billing/"' not in page and 'href="/audit/"' not in page
    assert 'href="/billing/"' in owner.browser_client().get("/clusters/").content.decode()
    for path in ("/billing/", "/billing/invoices/", "/accounts/members/", "/audit/"):
        refused = dev.get(path)
        assert refused.status_code == 403, path
        assert "Your role in this project is developer." in refused.content.decode(), path
    budget = dev.post("/billing/environments/default/budget/", {"monthly_budget": "1"})
    assert budget.status_code == 403
    assert owner.project.environments.get(name="default").monthly_budget is None

    # The API, with a key the developer made: the same refusals, named by the table.
    api = Client(
        headers={"authorization": f"Bearer {issue_key(user=dev_user, project=owner.project)}"}
    )
    for method, path, body in (
        ("get", "/api/v1/billing/balance", None),
        ("put", "/api/v1/environments/default/budget", {"amount": "1.00"}),
        ("get", "/api/v1/members", None),
        ("post", "/api/v1/members", {"email": "x@example.com", "role": "developer"}),
        ("get", "/api/v1/audit", None),
    ):
        answer = getattr(api, method)(path, body, content_type="application/json")
        assert answer.status_code == 403, path
        error = answer.json()["error"]
        assert error["code"] == "role_forbidden", path
        assert "Only an owner" in error["message"], path
    assert owner.project.environments.get(name="default").monthly_budget is None
    # What the role may do still works through the same key.
    assert api.get(f"/api/v1/clusters/{cluster.pk}").status_code == 200


def test_a_member_removed_takes_their_keys_but_not_what_a_cluster_recorded(
    owner, django_capture_on_commit_callbacks
):
    _, dev_user = join(owner, "dev@example.com", django_capture_on_commit_callbacks)
    devs_key = keys.add_ssh_key(
        project=owner.project, user=dev_user, name="dev-laptop", public_key=ed25519_line()
    )
    shared = keys.add_ssh_key(
        project=owner.project, user=None, name="deploy", public_key=ed25519_line()
    )
    credit(owner.project, "500.00")
    offer = machine_type_with_hosts(free=4, slug="use2-h100x8-vm", price_per_hour=Decimal("10"))
    member = Membership.objects.get(project=owner.project, user=dev_user)
    api = owner.api()

    # The owner chooses the developer's keys by member, beside the shared one by id.
    answer = api.post(
        "/api/v1/clusters",
        {
            "name": "team-run",
            "offer_id": offer.slug,
            "nodes": 2,
            "member_ids": [member.pk],
            "ssh_key_ids": [shared.pk],
        },
        content_type="application/json",
    )
    assert answer.status_code == 201, answer.json()
    cluster = Cluster.objects.get(name="team-run")
    assert sorted(k["name"] for k in cluster.key_holders) == ["deploy", "dev-laptop"]
    holders = {k["name"]: k["owner"] for k in answer.json()["data"]["ssh_keys"]}
    assert holders == {"deploy": "", "dev-laptop": "dev@example.com"}
    connect = owner.browser_client().get(f"/clusters/{cluster.pk}/connect/").content.decode()
    assert "dev@example.com's" in connect and "(shared)" in connect

    removed = owner.browser_client().post(f"/accounts/members/{member.pk}/remove/")
    assert removed.status_code == 302
    assert not owner.project.ssh_keys.filter(pk=devs_key.pk).exists()
    cluster.refresh_from_db()
    # Still on the machines until the cluster ends, and the panel still says so.
    assert devs_key.public_key in cluster.authorized_keys
    assert "dev@example.com's" in (
        owner.browser_client().get(f"/clusters/{cluster.pk}/connect/").content.decode()
    )


def test_an_unknown_member_or_a_member_without_keys_is_refused_and_nothing_is_reserved(
    owner, teammate
):
    keys.add_ssh_key(
        project=owner.project, user=owner.user, name="owner-laptop", public_key=ed25519_line()
    )
    credit(owner.project, "500.00")
    offer = machine_type_with_hosts(free=4, slug="use2-h100x8-vm", price_per_hour=Decimal("10"))
    body = {"name": "team-run", "offer_id": offer.slug, "nodes": 2}
    teammates = Membership.objects.get(project=owner.project, user=teammate.user)

    unknown = owner.api().post(
        "/api/v1/clusters", {**body, "member_ids": [999999]}, content_type="application/json"
    )
    keyless = owner.api().post(
        "/api/v1/clusters", {**body, "member_ids": [teammates.pk]}, content_type="application/json"
    )
    # The teammate has no key of their own, and the owner's is not theirs to use by default.
    by_default = teammate.api().post("/api/v1/clusters", body, content_type="application/json")

    assert (unknown.status_code, unknown.json()["error"]["code"]) == (422, "unknown_member")
    assert "999999" in unknown.json()["error"]["message"]
    assert (keyless.status_code, keyless.json()["error"]["code"]) == (422, "no_ssh_keys")
    assert "members chosen have no SSH key" in keyless.json()["error"]["message"]
    assert (by_default.status_code, by_default.json()["error"]["code"]) == (422, "no_ssh_keys")
    assert "You have no SSH key in this project" in by_default.json()["error"]["message"]
    assert not Cluster.objects.exists()


def test_a_developer_removes_only_their_own_ssh_keys(owner, teammate):
    owners = keys.add_ssh_key(
        project=owner.project, user=owner.user, name="owner-laptop", public_key=ed25519_line()
    )
    shared = keys.add_ssh_key(
        project=owner.project, user=None, name="deploy", public_key=ed25519_line()
    )
    theirs = keys.add_ssh_key(
        project=owner.project, user=teammate.user, name="dev-laptop", public_key=ed25519_line()
    )
    client = teammate.browser_client()

    account = client.get("/accounts/").content.decode()
    page = client.post(f"/accounts/ssh-keys/{owners.pk}/remove/")
    api = teammate.api().delete(f"/api/v1/ssh-keys/{shared.pk}")
    listed = {k["name"]: k["owner"] for k in teammate.api().get("/api/v1/ssh-keys").json()["data"]}

    assert f"/accounts/ssh-keys/{theirs.pk}/remove/" in account
    assert f"/accounts/ssh-keys/{owners.pk}/remove/" not in account
    assert page.status_code == 403
    assert "Only an owner or a manager may remove another member" in page.content.decode()
    assert (api.status_code, api.json()["error"]["code"]) == (403, "role_forbidden")
    assert set(owner.project.ssh_keys.values_list("name", flat=True)) == {
        "owner-laptop",
        "deploy",
        "dev-laptop",
    }
    assert listed == {
        "owner-laptop": "owner@example.com",
        "deploy": "",
        "dev-laptop": "teammate@example.com",
    }
    assert client.post(f"/accounts/ssh-keys/{theirs.pk}/remove/").status_code == 302
    assert owner.api().delete(f"/api/v1/ssh-keys/{shared.pk}").status_code == 204
    assert set(owner.project.ssh_keys.values_list("name", flat=True)) == {"owner-laptop"}
