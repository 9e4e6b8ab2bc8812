"""A stranger's session or key never sees, changes or even confirms another project's keys."""

import pytest

from accounts.keys import add_ssh_key
from accounts.models import ApiKey, SshKey
from tests.accounts.sshkeys import ed25519_line


@pytest.fixture
def owners_ssh_key(owner) -> SshKey:
    return add_ssh_key(
        project=owner.project, user=owner.user, name="owner-secret-box", public_key=ed25519_line()
    )


@pytest.fixture
def owners_api_key(owner) -> ApiKey:
    return ApiKey.objects.get(project=owner.project)


def test_it_shows_a_stranger_none_of_the_owners_keys_on_the_page(
    owner, stranger, owners_ssh_key, owners_api_key
):
    content = stranger.browser_client().get("/accounts/").content.decode()

    assert "owner-secret-box" not in content
    assert owners_ssh_key.fingerprint not in content
    assert owners_api_key.prefix not in content
    assert stranger.key[:12] in content


def test_it_answers_404_to_a_stranger_revoking_the_owners_api_key(owners_api_key, stranger):
    client = stranger.browser_client()
    url = f"/accounts/api-keys/{owners_api_key.pk}/revoke/"

    assert client.get(url).status_code == 404
    assert client.post(url).status_code == 404
    assert client.post(url, headers={"hx-request": "true"}).status_code == 404
    owners_api_key.refresh_from_db()
    assert owners_api_key.is_active


def test_it_answers_404_to_a_stranger_removing_the_owners_ssh_key(owners_ssh_key, stranger):
    client = stranger.browser_client()
    url = f"/accounts/ssh-keys/{owners_ssh_key.pk}/remove/"

    assert client.get(url).status_code == 404
    assert client.post(url).status_code == 404
    assert SshKey.objects.filter(pk=owners_ssh_key.pk).exists()


def test_it_lists_none_of_the_owners_ssh_keys_to_a_strangers_key(owners_ssh_key, stranger):
    response = stranger.api().get("/api/v1/ssh-keys")

    assert response.json() == {"data": [], "meta": {"total": 0, "limit": 100, "offset": 0}}


def test_it_answers_404_not_found_to_a_strangers_key_for_the_owners_ssh_key(
    owners_ssh_key, stranger
):
    for response in (
        stranger.api().get(f"/api/v1/ssh-keys/{owners_ssh_key.pk}"),
        stranger.api().delete(f"/api/v1/ssh-keys/{owners_ssh_key.pk}"),
    ):
        assert response.status_code == 404
        assert response.json()["error"]["code"] == "not_found"
    assert SshKey.objects.filter(pk=owners_ssh_key.pk).exists()


def test_it_answers_a_stranger_the_same_404_as_for_a_key_that_never_existed(
    owners_ssh_key, stranger
):
    theirs = stranger.api().delete(f"/api/v1/ssh-keys/{owners_ssh_key.pk}")
    missing = stranger.api().delete("/api/v1/ssh-keys/999999")

    assert theirs.json()["error"]["message"].replace(str(owners_ssh_key.pk), "N") == missing.json()[
        "error"
    ]["message"].replace("999999", "N")


def test_it_adds_a_strangers_key_to_the_strangers_project_only(owner, stranger):
    stranger.api().post(
        "/api/v1/ssh-keys",
        {"name": "mine", "public_key": ed25519_line()},
        content_type="application/json",
    )

    assert not SshKey.objects.filter(project=owner.project).exists()
    assert owner.api().get("/api/v1/ssh-keys").json()["data"] == []


def test_it_answers_me_with_the_keys_own_project(owner, stranger):
    assert stranger.api().get("/api/v1/me").json()["data"]["project"]["id"] == stranger.project.pk
    assert owner.api().get("/api/v1/me").json()["data"]["project"]["id"] == owner.project.pk
