from django.contrib.auth import get_user


def test_it_logs_in_with_email_and_password(client, owner):
    response = client.post(
        "/accounts/login/", {"username": owner.user.email, "password": "correct-horse-battery"}
    )

    assert response.status_code == 302
    assert response["Location"] == "/clusters/"
    assert get_user(client) == owner.user


def test_it_matches_the_email_whatever_its_case(client, owner):
    client.post(
        "/accounts/login/", {"username": " Owner@Example.COM ", "password": "correct-horse-battery"}
    )

    assert get_user(client) == owner.user


def test_it_refuses_a_wrong_password_with_a_message(client, owner):
    response = client.post("/accounts/login/", {"username": owner.user.email, "password": "nope"})

    assert response.status_code == 200
    assert "That email and password do not match an account." in response.content.decode()
    assert not get_user(client).is_authenticated


def test_it_returns_to_the_page_asked_for_after_logging_in(client, owner):
    response = client.get("/accounts/")
    assert response["Location"] == "/accounts/login/?next=/accounts/"

    response = client.post(
        "/accounts/login/?next=/accounts/",
        {"username": owner.user.email, "password": "correct-horse-battery", "next": "/accounts/"},
    )

    assert response["Location"] == "/accounts/"


def test_it_links_to_sign_up_and_to_password_reset(client, db):
    content = client.get("/accounts/login/").content.decode()

    assert 'href="/accounts/signup/"' in content
    assert 'href="/accounts/password-reset/"' in content
    assert 'name="username"' in content
    assert 'name="password"' in content


def test_it_logs_out_on_post_only(owner):
    client = owner.browser_client()

    assert client.get("/accounts/logout/").status_code == 405
    assert get_user(client).is_authenticated

    response = client.post("/accounts/logout/")

    assert response.status_code == 302
    assert response["Location"] == "/accounts/login/"
    assert not get_user(client).is_authenticated
    assert client.get("/accounts/").status_code == 302


def test_it_changes_the_password_from_the_account_page(owner):
    client = owner.browser_client()
    assert 'href="/accounts/password/"' in client.get("/accounts/").content.decode()

    response = client.post(
        "/accounts/password/",
        {
            "old_password": "correct-horse-battery",
            "new_password1": "a-brand-new-secret",
            "new_password2": "a-brand-new-secret",
        },
    )

    assert response["Location"] == "/accounts/password/done/"
    owner.user.refresh_from_db()
    assert owner.user.check_password("a-brand-new-secret")
