"""Revoking an API key follows the same rule as removing an SSH key (accounts/keys.py
`removal_refusal`): a member revokes their own keys; another member's needs an owner or a
manager; an owner's, an owner. On the account page and through the API alike."""

import pytest

from accounts import keys
from accounts.models import ApiKey, Membership
from audit.models import Entry
from tests.accounts.sshkeys import ed25519_line
from tests.conftest import Person, _person

ME = "/api/v1/me"


@pytest.fixture
def manager(owner: Person) -> Person:
    person = _person("manager@example.com", project=owner.project)
    Membership.objects.filter(user=person.user).update(role=Membership.Role.MANAGER)
    return person


@pytest.fixture
def developer(owner: Person) -> Person:
    return _person("developer@example.com", project=owner.project)


def key_of(person: Person) -> ApiKey:
    return ApiKey.objects.get(user=person.user, project=person.project)


def by_page(actor: Person, target: Person) -> int:
    url = f"/accounts/api-keys/{key_of(target).pk}/revoke/"
    return actor.browser_client().post(url).status_code


def by_api(actor: Person, target: Person):
    return actor.api().delete(f"/api/v1/keys/{key_of(target).pk}")


@pytest.mark.parametrize("target_name", ["owner", "teammate"])
def test_a_developer_revokes_no_other_members_key(owner, teammate, developer, target_name):
    target = {"owner": owner, "teammate": teammate}[target_name]

    page = by_page(developer, target)
    confirm = developer.browser_client().get(f"/accounts/api-keys/{key_of(target).pk}/revoke/")
    api = by_api(developer, target)

    assert page == 403
    assert confirm.status_code == 403
    assert "Only an owner or a manager may remove another member" in confirm.content.decode()
    assert (api.status_code, api.json()["error"]["code"]) == (403, "role_forbidden")
    assert key_of(target).revoked_at is None
    assert target.api().get(ME).status_code == 200  # the key still works


def test_a_manager_revokes_a_developers_key_but_not_an_owners(owner, manager, developer):
    refused_page = by_page(manager, owner)
    refused_api = by_api(manager, owner)

    assert refused_page == 403
    assert (refused_api.status_code, refused_api.json()["error"]["code"]) == (
        403,
        "role_forbidden",
    )
    assert "Only an owner may remove an owner's SSH key" in refused_api.json()["error"]["message"]
    assert owner.api().get(ME).status_code == 200

    assert by_api(manager, developer).status_code == 204
    assert developer.api().get(ME).status_code == 401


def test_an_owner_revokes_a_managers_key_from_the_page(owner, manager):
    assert by_page(owner, manager) == 302
    assert key_of(manager).revoked_at is not None


@pytest.mark.parametrize("channel", ["page", "api"])
def test_anyone_revokes_their_own_key(developer, channel):
    if channel == "page":
        assert by_page(developer, developer) == 302
    else:
        assert by_api(developer, developer).status_code == 204
    assert key_of(developer).revoked_at is not None


def test_a_stranger_still_gets_404(owner, stranger):
    page = stranger.browser_client().post(f"/accounts/api-keys/{key_of(owner).pk}/revoke/")
    api = by_api(stranger, owner)

    assert (page.status_code, api.status_code) == (404, 404)
    assert key_of(owner).revoked_at is None


def test_the_page_offers_revoke_and_remove_only_where_allowed(owner, manager, developer):
    owners_ssh = keys.add_ssh_key(
        project=owner.project, user=owner.user, name="owner-laptop", public_key=ed25519_line()
    )
    developers_ssh = keys.add_ssh_key(
        project=owner.project, user=developer.user, name="dev", public_key=ed25519_line()
    )

    as_developer = developer.browser_client().get("/accounts/").content.decode()
    as_manager = manager.browser_client().get("/accounts/").content.decode()

    assert f"/accounts/api-keys/{key_of(developer).pk}/revoke/" in as_developer
    assert f"/accounts/api-keys/{key_of(owner).pk}/revoke/" not in as_developer
    assert f"/accounts/api-keys/{key_of(manager).pk}/revoke/" not in as_developer
    assert f"/accounts/api-keys/{key_of(developer).pk}/revoke/" in as_manager
    assert f"/accounts/api-keys/{key_of(owner).pk}/revoke/" not in as_manager
    assert f"/accounts/ssh-keys/{developers_ssh.pk}/remove/" in as_manager
    assert f"/accounts/ssh-keys/{owners_ssh.pk}/remove/" not in as_manager


def test_a_manager_removes_no_owners_ssh_key(owner, manager):
    owners_ssh = keys.add_ssh_key(
        project=owner.project, user=owner.user, name="owner-laptop", public_key=ed25519_line()
    )

    api = manager.api().delete(f"/api/v1/ssh-keys/{owners_ssh.pk}")

    assert (api.status_code, api.json()["error"]["code"]) == (403, "role_forbidden")
    assert owner.project.ssh_keys.filter(pk=owners_ssh.pk).exists()


def test_the_audit_records_a_revocation_and_a_refusal(owner, developer):
    by_api(developer, owner)
    by_api(owner, developer)

    entries = Entry.objects.filter(action__contains="revoke_api_key").order_by("pk")
    assert [(e.user_email, e.status_code, e.result) for e in entries] == [
        ("developer@example.com", 403, "refused"),
        ("owner@example.com", None, "done"),  # written in the revocation's transaction
    ]
    assert entries[1].summary.startswith("revoked API key `")
