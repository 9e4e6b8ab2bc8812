from django.contrib.auth import get_user

from accounts.models import Environment, Membership, Project, User


def _sign_up(client, email="new@example.com", password="a-long-new-password", again=None):
    return client.post(
        "/accounts/signup/",
        {"email": email, "password1": password, "password2": again or password},
    )


def test_it_creates_the_user_a_project_a_default_environment_and_ownership(client, db):
    response = _sign_up(client, email="Ada.Lovelace@Example.com")

    assert response.status_code == 302
    assert response["Location"] == "/clusters/"
    user = User.objects.get()
    assert user.email == "ada.lovelace@example.com"
    assert user.check_password("a-long-new-password")
    membership = Membership.objects.get(user=user)
    assert membership.role == Membership.Role.OWNER
    assert membership.project.name == "ada.lovelace's project"
    environments = Environment.objects.filter(project=membership.project)
    assert [environment.name for environment in environments] == ["default"]


def test_it_logs_the_new_user_in(client, db):
    _sign_up(client)

    assert get_user(client).email == "new@example.com"
    assert client.get("/clusters/").status_code == 200


def test_it_links_to_log_in_from_the_sign_up_page(client, db):
    response = client.get("/accounts/signup/")

    assert response.status_code == 200
    assert b'href="/accounts/login/"' in response.content


def test_it_refuses_passwords_that_differ_and_creates_nothing(client, db):
    response = _sign_up(client, password="a-long-new-password", again="another-long-password")

    assert response.status_code == 200
    assert "The two passwords differ." in response.content.decode()
    assert not User.objects.exists()
    assert not Project.objects.exists()


def test_it_applies_django_password_validators(client, db):
    response = _sign_up(client, password="12345678")

    content = response.content.decode()
    assert "This password is too common." in content
    assert "This password is entirely numeric." in content
    assert not User.objects.exists()


def test_it_refuses_a_password_too_like_the_email(client, db):
    response = _sign_up(
        client, email="marguerite.yourcenar@example.com", password="marguerite.yourcenar"
    )

    assert "too similar to the email address" in response.content.decode()
    assert not User.objects.exists()


def test_it_refuses_an_email_already_signed_up_whatever_its_case(client, owner):
    response = _sign_up(client, email="OWNER@example.com")

    assert "An account with this email already exists" in response.content.decode()
    assert User.objects.count() == 1
    assert Project.objects.count() == 1


def test_it_refuses_an_invalid_email(client, db):
    response = _sign_up(client, email="not-an-email")

    assert "Enter a valid email address." in response.content.decode()
    assert not User.objects.exists()


def test_it_sends_a_logged_in_user_on_to_their_clusters(owner):
    response = owner.browser_client().get("/accounts/signup/")

    assert response.status_code == 302
    assert response["Location"] == "/clusters/"
