from io import StringIO

import pytest
from django.core.management import CommandError, call_command
from django.test import Client

from accounts.models import ApiKey, Environment, Membership, User, hash_api_key


def _issue(*args: str) -> list[str]:
    out = StringIO()
    call_command("issue_api_key", *args, stdout=out)
    return out.getvalue().splitlines()


def _works(raw: str) -> dict:
    response = Client(headers={"authorization": f"Bearer {raw}"}).get("/api/v1/me")
    assert response.status_code == 200, response.content
    return response.json()["data"]


def test_it_prints_a_working_key_as_the_last_line(owner):
    lines = _issue("owner@example.com", "--name", "deploy bot")

    raw = lines[-1]
    assert raw.startswith("rc_live_")
    key = ApiKey.objects.get(key_hash=hash_api_key(raw))
    assert (key.name, key.user, key.project) == ("deploy bot", owner.user, owner.project)
    assert _works(raw)["project"]["id"] == owner.project.pk


def test_it_finds_the_user_whatever_the_emails_case(owner):
    raw = _issue("OWNER@Example.com")[-1]

    assert ApiKey.objects.get(key_hash=hash_api_key(raw)).name == "cli"


def test_it_refuses_an_unknown_email_naming_it(db):
    with pytest.raises(CommandError, match=r"No user has the email ghost@example\.com"):
        _issue("ghost@example.com")

    assert not User.objects.exists()
    assert not ApiKey.objects.exists()


def test_it_creates_the_user_and_their_project_when_asked(db):
    lines = _issue("new@example.com", "--create-user")

    user = User.objects.get(email="new@example.com")
    assert not user.has_usable_password()
    membership = Membership.objects.get(user=user)
    assert membership.role == Membership.Role.OWNER
    assert Environment.objects.filter(project=membership.project, name="default").exists()
    assert "Created the user new@example.com" in lines[0]
    assert _works(lines[-1])["email"] == "new@example.com"


def test_it_gives_a_project_to_a_user_who_has_none(db):
    User.objects.create_superuser(email="admin@example.com", password="x-long-password")

    lines = _issue("admin@example.com")

    assert any("Created the project" in line for line in lines)
    assert _works(lines[-1])["project"]["environments"] == ["default"]


def test_it_refuses_a_deactivated_user(owner):
    owner.user.is_active = False
    owner.user.save()

    with pytest.raises(CommandError, match="deactivated"):
        _issue(owner.user.email)

    assert ApiKey.objects.count() == 1  # the fixture's


def test_it_refuses_an_empty_key_name(owner):
    with pytest.raises(CommandError, match="Give the key a name"):
        _issue(owner.user.email, "--name", " ")

    assert ApiKey.objects.count() == 1
