import pytest
from django.test import Client

from accounts.keys import add_ssh_key
from accounts.models import ApiKey, Environment, Membership, User
from tests.accounts.sshkeys import ed25519_line


@pytest.fixture
def staff(db) -> Client:
    admin = User.objects.create_superuser(email="staff@example.com", password="x-long-password")
    client = Client()
    client.force_login(admin)
    return client


def test_it_renders_every_accounts_admin_page(staff, owner, teammate):
    ssh_key = add_ssh_key(
        project=owner.project, user=owner.user, name="box", public_key=ed25519_line()
    )
    api_key = ApiKey.objects.filter(project=owner.project).first()
    pages = [
        "/admin/accounts/user/",
        "/admin/accounts/user/add/",
        f"/admin/accounts/user/{owner.user.pk}/change/",
        "/admin/accounts/project/",
        f"/admin/accounts/project/{owner.project.pk}/change/",
        "/admin/accounts/apikey/",
        f"/admin/accounts/apikey/{api_key.pk}/change/",
        "/admin/accounts/sshkey/",
        f"/admin/accounts/sshkey/{ssh_key.pk}/change/",
    ]
    for page in pages:
        assert staff.get(page).status_code == 200, page


def test_it_shows_the_project_with_its_members_and_environments(staff, owner, teammate):
    content = staff.get(f"/admin/accounts/project/{owner.project.pk}/change/").content.decode()

    assert "owner@example.com" in content
    assert "teammate@example.com" in content
    assert 'value="default"' in content


def test_it_creates_a_user_by_email_with_a_project_of_their_own(staff):
    response = staff.post(
        "/admin/accounts/user/add/",
        {
            "email": "Added@Example.com",
            "usable_password": "true",
            "password1": "a-long-admin-set-password",
            "password2": "a-long-admin-set-password",
        },
    )

    assert response.status_code == 302, response.content.decode()[:2000]
    user = User.objects.get(email="added@example.com")
    assert user.check_password("a-long-admin-set-password")
    project = Membership.objects.get(user=user, role=Membership.Role.OWNER).project
    assert Environment.objects.filter(project=project, name="default").exists()


def test_it_refuses_a_second_user_with_the_same_email_in_another_case(staff, owner):
    response = staff.post(
        "/admin/accounts/user/add/",
        {"email": "OWNER@example.com", "usable_password": "false"},
    )

    assert "A user with this email already exists." in response.content.decode()
    assert User.objects.filter(email__iexact="owner@example.com").count() == 1


def test_it_shows_an_api_keys_hash_but_never_lets_staff_add_or_edit_it(staff, owner):
    key = ApiKey.objects.get(project=owner.project)

    assert staff.get("/admin/accounts/apikey/add/").status_code == 403
    content = staff.get(f"/admin/accounts/apikey/{key.pk}/change/").content.decode()
    assert key.key_hash in content
    assert 'name="key_hash"' not in content


def test_it_revokes_keys_from_the_admin_list(staff, owner, stranger):
    key = ApiKey.objects.get(project=owner.project)

    staff.post(
        "/admin/accounts/apikey/",
        {"action": "revoke", "_selected_action": [key.pk]},
    )

    key.refresh_from_db()
    assert not key.is_active
    assert ApiKey.objects.get(project=stranger.project).is_active
    assert owner.api().get("/api/v1/me").status_code == 401
