import re

from django.contrib.auth import get_user
from django.core import mail

from accounts.signup import sign_up


def _reset_link(message) -> str:
    match = re.search(r"https?://[^/\s]+(/accounts/password-reset/[^\s]+/)", message.body)
    assert match, message.body
    return match.group(1)


def test_it_emails_a_link_that_sets_a_new_password(client, owner):
    response = client.post("/accounts/password-reset/", {"email": "OWNER@example.com"})

    assert response["Location"] == "/accounts/password-reset/sent/"
    assert len(mail.outbox) == 1
    message = mail.outbox[0]
    assert message.to == ["owner@example.com"]
    assert message.subject == "Reset your Runcrate password"
    html, mimetype = message.alternatives[0]
    assert mimetype == "text/html"
    link = _reset_link(message)
    assert link in html

    form_page = client.get(link, follow=True)
    assert "Choose a new password" in form_page.content.decode()
    response = client.post(
        form_page.redirect_chain[-1][0],
        {"new_password1": "a-fresh-passphrase", "new_password2": "a-fresh-passphrase"},
    )
    assert response["Location"] == "/accounts/password-reset/complete/"

    client.post(
        "/accounts/login/", {"username": owner.user.email, "password": "a-fresh-passphrase"}
    )
    assert get_user(client) == owner.user


def test_it_refuses_the_link_a_second_time(client, owner):
    client.post("/accounts/password-reset/", {"email": owner.user.email})
    link = _reset_link(mail.outbox[0])
    form_page = client.get(link, follow=True)
    client.post(
        form_page.redirect_chain[-1][0],
        {"new_password1": "a-fresh-passphrase", "new_password2": "a-fresh-passphrase"},
    )

    again = client.get(link, follow=True)

    assert "This link no longer works" in again.content.decode()


def test_it_says_the_same_for_an_unknown_email_and_sends_nothing(client, db):
    response = client.post("/accounts/password-reset/", {"email": "nobody@example.com"})

    assert response["Location"] == "/accounts/password-reset/sent/"
    assert mail.outbox == []


def test_it_lets_a_user_made_without_a_password_set_one(client, db):
    user = sign_up(email="api-only@example.com", password=None)
    assert not user.has_usable_password()

    client.post("/accounts/password-reset/", {"email": user.email})

    assert len(mail.outbox) == 1
    form_page = client.get(_reset_link(mail.outbox[0]), follow=True)
    client.post(
        form_page.redirect_chain[-1][0],
        {"new_password1": "a-fresh-passphrase", "new_password2": "a-fresh-passphrase"},
    )
    user.refresh_from_db()
    assert user.check_password("a-fresh-passphrase")


def test_it_sends_nothing_to_a_deactivated_user(client, owner):
    owner.user.is_active = False
    owner.user.save()

    client.post("/accounts/password-reset/", {"email": owner.user.email})

    assert mail.outbox == []


def test_it_builds_the_link_from_site_url_never_from_the_requests_host(client, owner, settings):
    settings.SITE_URL = "https://clusters.runcrate.example"
    settings.ALLOWED_HOSTS = ["*"]  # a host check that lets any Host through

    client.post(
        "/accounts/password-reset/", {"email": owner.user.email}, HTTP_HOST="attacker.example"
    )

    message = mail.outbox[0]
    html, _ = message.alternatives[0]
    assert "https://clusters.runcrate.example/accounts/password-reset/" in message.body
    assert "attacker.example" not in message.body and "attacker.example" not in html
    assert "https://clusters.runcrate.example/accounts/password-reset/" in html
