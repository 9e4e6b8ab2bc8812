"""The account pages in Chromium: sign up, then manage keys in place with htmx."""

import re

import pytest

from accounts.models import ApiKey, SshKey, User, hash_api_key
from tests.accounts.sshkeys import ed25519_line
from tests.conftest import log_in

pytestmark = [pytest.mark.browser, pytest.mark.django_db(transaction=True)]


def test_it_signs_up_and_lands_on_the_clusters_page(page):
    page.goto("/accounts/login/")
    page.click("text=Create an account")
    page.fill("input[name=email]", "browser@example.com")
    page.fill("input[name=password1]", "a-long-browser-password")
    page.fill("input[name=password2]", "a-long-browser-password")
    page.click("button[type=submit]")

    page.wait_for_url("**/clusters/")
    assert User.objects.get(email="browser@example.com").memberships.count() == 1


def test_it_creates_shows_and_revokes_an_api_key_without_a_page_load(page, owner):
    log_in(page, owner)
    page.goto("/accounts/")
    page.evaluate("window.stillTheSamePage = true")

    page.fill("input[name=name]", "notebook")
    page.click("text=Create key")
    secret = page.locator("#new-api-key")
    secret.wait_for()
    raw = secret.inner_text()
    assert re.fullmatch(r"rc_live_[\w-]{43}", raw)
    assert ApiKey.objects.get(name="notebook").key_hash == hash_api_key(raw)

    page.once("dialog", lambda dialog: dialog.accept())
    page.locator("tr", has_text="notebook").get_by_text("Revoke").click()
    page.locator("tr", has_text="notebook").locator(".badge-bad").wait_for()
    assert page.evaluate("window.stillTheSamePage") is True
    assert not ApiKey.objects.get(name="notebook").is_active
    assert page.locator("#new-api-key").count() == 0


def test_it_refuses_a_bad_ssh_key_in_place_then_adds_a_good_one(page, owner):
    log_in(page, owner)
    page.goto("/accounts/")
    page.evaluate("window.stillTheSamePage = true")

    page.fill("textarea[name=public_key]", "ssh-rsa this*is*not*a*key")
    page.click("text=Add key")
    page.get_by_text("not valid base64").wait_for()
    assert not SshKey.objects.exists()

    page.fill("textarea[name=public_key]", ed25519_line("me@laptop"))
    page.click("text=Add key")
    page.get_by_text("SSH key 'me@laptop' added.").wait_for()
    assert page.evaluate("window.stillTheSamePage") is True
    shown = page.locator("#ssh-keys code.fingerprint").inner_text()
    assert shown == SshKey.objects.get().fingerprint
