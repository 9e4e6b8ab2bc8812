"""Invitations by email: a single-use link valid 7 days (accounts/invitations.py)."""

import re
from datetime import timedelta
from html import escape

import pytest
import time_machine
from django.core import mail
from django.test import Client
from django.utils import timezone

from accounts import invitations
from accounts.models import Invitation, Membership, User
from accounts.permissions import PermissionRefused
from tests.factories import UserFactory

OWNER, MANAGER, DEVELOPER = (
    Membership.Role.OWNER,
    Membership.Role.MANAGER,
    Membership.Role.DEVELOPER,
)
PASSWORD = "correct-horse-battery"


def invite(client: Client, email: str, role: str = DEVELOPER):
    return client.post("/accounts/members/invite/", {"email": email, "role": role})


def link_in(message) -> str:
    match = re.search(r"https?://[^/\s]+(/accounts/invitations/[^/\s]+/)", message.body)
    assert match, message.body
    return match.group(1)


def test_an_owner_invites_by_email_and_the_link_is_in_it(owner, django_capture_on_commit_callbacks):
    with django_capture_on_commit_callbacks(execute=True):
        response = invite(owner.browser_client(), "new@example.com")

    assert response.status_code == 302
    invitation = Invitation.objects.get()
    assert (invitation.project, invitation.role, invitation.invited_by) == (
        owner.project,
        DEVELOPER,
        owner.user,
    )
    assert invitation.expires_at - invitation.created_at == timedelta(days=7)
    (message,) = mail.outbox
    assert message.to == ["new@example.com"]
    token = link_in(message).split("/")[-2]
    assert token not in invitation.token_hash  # only the hash is kept
    assert owner.project.name in message.subject


def test_a_developer_joins_through_the_link_after_signing_up(
    owner, django_capture_on_commit_callbacks
):
    with django_capture_on_commit_callbacks(execute=True):
        invite(owner.browser_client(), "dev@example.com")
    link = link_in(mail.outbox[0])
    visitor = Client()

    page = visitor.get(link)
    assert page.status_code == 200
    assert f"/accounts/signup/?next={link}" in page.content.decode()

    signed_up = visitor.post(
        f"/accounts/signup/?next={link}",
        {"email": "dev@example.com", "password1": PASSWORD, "password2": PASSWORD},
    )
    assert signed_up.status_code == 302
    assert signed_up["Location"] == link
    joined = visitor.post(link)

    assert joined.status_code == 302
    dev = User.objects.get(email="dev@example.com")
    assert Membership.objects.get(project=owner.project, user=dev).role == DEVELOPER
    # The session now acts in the project joined, not the one sign-up made.
    assert visitor.get("/accounts/").context["project"] == owner.project
    assert visitor.post(link).status_code == 410  # single use


def test_an_altered_link_is_a_clear_404_page(owner, stranger):
    invitation = invitations.invite(
        project=owner.project,
        by=owner.user,
        email="x@example.com",
        role=DEVELOPER,
        now=timezone.now(),
    )
    token = "never-seen"
    assert invitation.pk
    # An altered link matches no row: a clear 404 page, not a 500.
    response = stranger.browser_client().post(f"/accounts/invitations/{token}/")
    assert response.status_code == 404
    assert "not valid" in response.content.decode()
    assert not Membership.objects.filter(project=owner.project, user=stranger.user).exists()


def test_a_wrong_account_is_told_and_nothing_changes(
    owner, stranger, django_capture_on_commit_callbacks
):
    with django_capture_on_commit_callbacks(execute=True):
        invite(owner.browser_client(), "someone@example.com")
    link = link_in(mail.outbox[0])

    response = stranger.browser_client().post(link)

    assert response.status_code == 403
    assert "This invitation is for someone@example.com" in response.content.decode()
    assert Invitation.objects.get().accepted_at is None


def test_an_expired_link_is_a_clear_page(owner, django_capture_on_commit_callbacks):
    with django_capture_on_commit_callbacks(execute=True):
        invite(owner.browser_client(), "late@example.com")
    link = link_in(mail.outbox[0])
    late = UserFactory(email="late@example.com")
    client = Client()
    client.force_login(late)

    with time_machine.travel(timezone.now() + timedelta(days=7, seconds=1)):
        response = client.post(link)

    assert response.status_code == 410
    assert "expired" in response.content.decode()
    assert not Membership.objects.filter(project=owner.project, user=late).exists()


def test_a_manager_cannot_invite_an_owner_and_a_developer_cannot_invite(owner, teammate):
    Membership.objects.filter(user=teammate.user).update(role=MANAGER)
    with pytest.raises(PermissionRefused, match="Only an owner may invite owners"):
        invitations.invite(
            project=owner.project,
            by=teammate.user,
            email="a@example.com",
            role=OWNER,
            now=timezone.now(),
        )
    invitations.invite(
        project=owner.project,
        by=teammate.user,
        email="b@example.com",
        role=MANAGER,
        now=timezone.now(),
    )

    Membership.objects.filter(user=teammate.user).update(role=DEVELOPER)
    assert invite(teammate.browser_client(), "c@example.com").status_code == 403
    assert list(Invitation.objects.values_list("email", flat=True)) == ["b@example.com"]


def test_a_bad_email_or_role_or_a_member_is_refused_on_the_page(owner, teammate):
    client = owner.browser_client()

    assert invite(client, "not-an-email").status_code == 422
    assert invite(client, "a@example.com", role="admin").status_code == 422
    response = invite(client, teammate.user.email)
    assert response.status_code == 422
    assert "already a member" in response.content.decode()
    assert not Invitation.objects.exists()


def test_withdrawing_an_invitation_stops_its_link(
    owner, stranger, django_capture_on_commit_callbacks
):
    with django_capture_on_commit_callbacks(execute=True):
        invite(owner.browser_client(), "w@example.com")
    link = link_in(mail.outbox[0])
    invitation = Invitation.objects.get()

    assert (
        stranger.browser_client().post(f"/accounts/invitations/{invitation.pk}/revoke/").status_code
        == 404
    )
    response = owner.browser_client().post(f"/accounts/invitations/{invitation.pk}/revoke/")

    assert response.status_code == 302
    assert Client().get(link).status_code == 404


def test_the_sign_up_from_an_invitation_fills_in_and_keeps_the_invited_email(
    owner, django_capture_on_commit_callbacks
):
    with django_capture_on_commit_callbacks(execute=True):
        invite(owner.browser_client(), "invited@example.com")
    link = link_in(mail.outbox[0])
    visitor = Client()

    page = visitor.get(f"/accounts/signup/?next={link}")
    email_input = re.search(r"<input[^>]*name=\"email\"[^>]*>", page.content.decode())
    assert email_input and 'value="invited@example.com"' in email_input.group(0)
    assert "disabled" in email_input.group(0)
    assert f"join {escape(owner.project.name)}" in page.content.decode()

    # A posted email other than the invited one is ignored: the invited email's account is made.
    signed_up = visitor.post(
        f"/accounts/signup/?next={link}",
        {"email": "other@example.com", "password1": PASSWORD, "password2": PASSWORD},
    )
    assert signed_up.status_code == 302
    assert signed_up["Location"] == link
    assert not User.objects.filter(email="other@example.com").exists()
    assert visitor.post(link).status_code == 302
    invited = User.objects.get(email="invited@example.com")
    assert Membership.objects.get(project=owner.project, user=invited).role == DEVELOPER


def test_the_sign_up_without_a_working_invitation_asks_for_any_email(
    owner, django_capture_on_commit_callbacks
):
    with django_capture_on_commit_callbacks(execute=True):
        invite(owner.browser_client(), "gone@example.com")
    link = link_in(mail.outbox[0])
    Invitation.objects.all().delete()  # withdrawn: its link no longer fills anything in

    for url in (f"/accounts/signup/?next={link}", "/accounts/signup/?next=/accounts/"):
        page = Client().get(url).content.decode()
        email_input = re.search(r"<input[^>]*name=\"email\"[^>]*>", page)
        assert email_input and "disabled" not in email_input.group(0)
        assert "gone@example.com" not in page
