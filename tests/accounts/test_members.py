"""A project always keeps an owner, and a user who still has live clusters is not deleted
(accounts/members.py; issue 19 item 6): the admin's delete screens and membership forms refuse
with the reason, and what may go still goes."""

import pytest
from django.contrib import admin
from django.test import Client, RequestFactory

from accounts import members
from accounts.admin import MembershipInline, ProjectMembershipInline
from accounts.models import Membership, Project, User
from clusters.models import Cluster
from tests.factories import ClusterFactory

OWNER, DEVELOPER = Membership.Role.OWNER, Membership.Role.DEVELOPER


@pytest.fixture
def staff_user(db) -> User:
    return User.objects.create_superuser(email="staff@example.com", password="x")


@pytest.fixture
def staff(staff_user) -> Client:
    client = Client()
    client.force_login(staff_user)
    return client


def live_cluster(person, name: str = "train") -> Cluster:
    return ClusterFactory(
        project=person.project, created_by=person.user, name=name, status=Cluster.Status.READY
    )


def delete_user(staff: Client, user: User):
    return staff.post(f"/admin/accounts/user/{user.pk}/delete/", {"post": "yes"})


# --- deleting a user -------------------------------------------------------------------------


def test_it_refuses_to_delete_a_user_who_still_has_live_clusters(staff, owner, teammate):
    live_cluster(teammate, "teammates-run")

    response = delete_user(staff, teammate.user)

    assert response.status_code == 200  # the screen again, with the reason, nothing deleted
    html = response.content.decode()
    assert "teammate@example.com still has live clusters in the project" in html
    assert "teammates-run" in html
    assert User.objects.filter(pk=teammate.user.pk).exists()


def test_it_refuses_to_delete_a_projects_only_owner(staff, owner, teammate):
    response = delete_user(staff, owner.user)

    assert "owner@example.com is the only owner of the project" in response.content.decode()
    assert User.objects.filter(pk=owner.user.pk).exists()
    assert owner.project.memberships.filter(role=OWNER).exists()


def test_it_refuses_to_delete_a_projects_only_member_and_says_to_deactivate(staff, stranger):
    response = delete_user(staff, stranger.user)

    html = response.content.decode()
    assert "is the only member of the project" in html
    assert "deactivate the user instead" in html
    assert User.objects.filter(pk=stranger.user.pk).exists()


def test_it_deletes_a_member_with_nothing_running(staff, owner, teammate):
    ClusterFactory(
        project=owner.project, created_by=teammate.user, status=Cluster.Status.TERMINATED
    )

    response = delete_user(staff, teammate.user)

    assert response.status_code == 302
    assert not User.objects.filter(pk=teammate.user.pk).exists()
    assert owner.project.memberships.filter(user=owner.user, role=OWNER).exists()


def test_it_deletes_an_owner_when_the_project_keeps_another(staff, owner, teammate):
    Membership.objects.filter(user=teammate.user).update(role=OWNER)

    assert delete_user(staff, owner.user).status_code == 302

    assert not User.objects.filter(pk=owner.user.pk).exists()
    assert list(owner.project.memberships.values_list("user", "role")) == [
        (teammate.user.pk, OWNER)
    ]


def test_the_bulk_delete_action_refuses_as_well(staff, owner, teammate):
    live_cluster(teammate)

    response = staff.post(
        "/admin/accounts/user/",
        {"action": "delete_selected", "_selected_action": [teammate.user.pk], "post": "yes"},
    )

    assert "still has live clusters" in response.content.decode()
    assert User.objects.filter(pk=teammate.user.pk).exists()


def test_the_rule_refuses_outside_the_admin_too(owner, teammate):
    live_cluster(teammate)

    with pytest.raises(members.MembershipRefused) as refused:
        members.delete_users([teammate.user])

    assert refused.value.code == "live_clusters"
    assert refused.value.status == 409
    assert User.objects.filter(pk=teammate.user.pk).exists()


# --- a project keeps an owner ------------------------------------------------------------------


def formset(inline_class, parent, staff_user, rows: list[dict]):
    """The admin's inline formset for `parent`, bound to `rows` as its page would post them."""
    request = RequestFactory().post("/")
    request.user = staff_user
    form_set = inline_class(type(parent), admin.site).get_formset(request, parent)
    prefix = form_set.get_default_prefix()
    data = {
        f"{prefix}-TOTAL_FORMS": str(len(rows)),
        f"{prefix}-INITIAL_FORMS": str(sum(1 for row in rows if row.get("id"))),
        f"{prefix}-MIN_NUM_FORMS": "0",
        f"{prefix}-MAX_NUM_FORMS": "1000",
    }
    for number, row in enumerate(rows):
        for field, value in row.items():
            data[f"{prefix}-{number}-{field}"] = value
    return form_set(data, instance=parent, prefix=prefix)


def row(membership: Membership, **changes) -> dict:
    values = {
        "id": membership.pk,
        "user": membership.user_id,
        "project": membership.project_id,
        "role": membership.role,
        "created_at_0": membership.created_at.strftime("%Y-%m-%d"),
        "created_at_1": membership.created_at.strftime("%H:%M:%S"),
    }
    return {**values, **changes}


def errors(form_set) -> str:
    return " ".join(form_set.non_form_errors())


def test_the_project_page_refuses_to_demote_its_only_owner(owner, teammate, staff_user):
    mine = Membership.objects.get(user=owner.user)
    theirs = Membership.objects.get(user=teammate.user)

    demoted = formset(
        ProjectMembershipInline, owner.project, staff_user, [row(mine, role=DEVELOPER), row(theirs)]
    )

    assert not demoted.is_valid()
    assert "needs an owner" in errors(demoted)


def test_the_project_page_refuses_to_remove_its_only_owner(owner, teammate, staff_user):
    mine = Membership.objects.get(user=owner.user)
    theirs = Membership.objects.get(user=teammate.user)

    removed = formset(
        ProjectMembershipInline, owner.project, staff_user, [row(mine, DELETE="on"), row(theirs)]
    )

    assert not removed.is_valid()
    assert "needs an owner" in errors(removed)


def test_the_project_page_hands_ownership_over_in_one_change(owner, teammate, staff_user):
    mine = Membership.objects.get(user=owner.user)
    theirs = Membership.objects.get(user=teammate.user)

    handed_over = formset(
        ProjectMembershipInline,
        owner.project,
        staff_user,
        [row(mine, role=DEVELOPER), row(theirs, role=OWNER)],
    )

    assert handed_over.is_valid(), handed_over.errors
    handed_over.save()
    assert list(owner.project.memberships.filter(role=OWNER).values_list("user", flat=True)) == [
        teammate.user.pk
    ]


def test_a_new_project_needs_an_owner(staff_user):
    empty = formset(ProjectMembershipInline, Project(name="nobody's"), staff_user, [])

    assert not empty.is_valid()
    assert "needs an owner" in errors(empty)


def test_the_user_page_refuses_to_drop_their_only_ownership(owner, teammate, staff_user):
    mine = Membership.objects.get(user=owner.user)

    for change in ({"DELETE": "on"}, {"role": DEVELOPER}):
        dropped = formset(MembershipInline, owner.user, staff_user, [row(mine, **change)])
        assert not dropped.is_valid(), change
        assert "needs an owner" in errors(dropped)


def test_the_user_page_lets_an_owner_go_when_another_stays(owner, teammate, staff_user):
    Membership.objects.filter(user=teammate.user).update(role=OWNER)
    mine = Membership.objects.get(user=owner.user)

    dropped = formset(MembershipInline, owner.user, staff_user, [row(mine, DELETE="on")])

    assert dropped.is_valid(), dropped.errors


# --- deleting a project ------------------------------------------------------------------------


def test_a_project_with_clusters_cannot_be_deleted_either(staff, owner):
    """Clusters are the lifecycle's rows, which staff may not delete (clusters/admin.py): a
    project holding any cannot go, so its owner rule never meets an orphaned cluster."""
    live_cluster(owner, "still-up")

    response = staff.post(f"/admin/accounts/project/{owner.project.pk}/delete/", {"post": "yes"})

    assert "Cannot delete project" in response.content.decode()
    assert Project.objects.filter(pk=owner.project.pk).exists()


# --- the members page, roles and removal (issue 24 item 1) ---------------------------------------

MANAGER = Membership.Role.MANAGER


def make(person, role: str) -> None:
    Membership.objects.filter(project=person.project, user=person.user).update(role=role)


def membership_of(person, project: Project) -> Membership:
    return Membership.objects.get(project=project, user=person.user)


def test_the_page_lists_members_with_their_role_and_last_activity(
    owner, teammate, django_assert_max_num_queries
):
    from django.utils import timezone

    used = timezone.now().replace(microsecond=0)
    teammate.user.api_keys.update(last_used_at=used)
    client = owner.browser_client()

    with django_assert_max_num_queries(12):
        response = client.get("/accounts/members/")

    assert response.status_code == 200
    rows = {row.membership.user.email: row for row in response.context["members"]}
    assert rows["teammate@example.com"].membership.role == DEVELOPER
    assert rows["teammate@example.com"].last_activity == used
    assert rows["owner@example.com"].membership.role == OWNER


def test_a_developer_gets_no_team_billing_or_budget_page(owner, teammate):
    client = teammate.browser_client()

    assert client.get("/accounts/members/").status_code == 403
    assert client.get("/billing/").status_code == 403
    assert client.post("/billing/environments/default/budget/", {"amount": "5"}).status_code == 403
    assert client.post("/accounts/members/invite/", {"email": "a@example.com"}).status_code == 403


def test_a_developer_gets_role_forbidden_from_the_billing_api(owner, teammate):
    response = teammate.api().get("/api/v1/billing/balance")

    assert response.status_code == 403
    error = response.json()["error"]
    assert error["code"] == "role_forbidden"
    assert "Only an owner or a manager" in error["message"]


def test_a_stranger_cannot_reach_another_projects_member(owner, teammate, stranger):
    make(stranger, OWNER)
    target = membership_of(teammate, owner.project)
    client = stranger.browser_client()

    assert client.post(f"/accounts/members/{target.pk}/role/", {"role": OWNER}).status_code == 404
    assert client.post(f"/accounts/members/{target.pk}/remove/").status_code == 404
    assert Membership.objects.get(pk=target.pk).role == DEVELOPER


def test_an_owner_changes_a_role_and_a_key_acts_with_the_new_one(owner, teammate):
    target = membership_of(teammate, owner.project)
    api = teammate.api()
    assert api.get("/api/v1/billing/balance").status_code == 403

    response = owner.browser_client().post(
        f"/accounts/members/{target.pk}/role/", {"role": MANAGER}
    )
    assert response.status_code == 302
    assert api.get("/api/v1/billing/balance").status_code == 200

    owner.browser_client().post(f"/accounts/members/{target.pk}/role/", {"role": DEVELOPER})
    assert api.get("/api/v1/billing/balance").status_code == 403  # demoted: its key too


def test_a_manager_cannot_make_an_owner_nor_touch_one(owner, teammate):
    make(teammate, MANAGER)
    client = teammate.browser_client()
    mine = membership_of(teammate, owner.project)
    theirs = membership_of(owner, owner.project)

    assert client.post(f"/accounts/members/{mine.pk}/role/", {"role": OWNER}).status_code == 403
    assert client.post(f"/accounts/members/{theirs.pk}/role/", {"role": MANAGER}).status_code == 403
    assert client.post(f"/accounts/members/{theirs.pk}/remove/").status_code == 403
    assert Membership.objects.get(pk=theirs.pk).role == OWNER
    assert Membership.objects.get(pk=mine.pk).role == MANAGER


def test_the_last_owner_can_neither_leave_nor_be_demoted(owner, teammate):
    client = owner.browser_client()
    mine = membership_of(owner, owner.project)

    demoted = client.post(f"/accounts/members/{mine.pk}/role/", {"role": DEVELOPER})
    left = client.post(f"/accounts/members/{mine.pk}/remove/")

    assert demoted.status_code == 422
    assert "needs an owner" in demoted.content.decode()
    assert left.status_code == 422
    assert Membership.objects.get(pk=mine.pk).role == OWNER


def test_an_owner_may_step_down_once_another_owner_exists(owner, teammate):
    make(teammate, OWNER)
    mine = membership_of(owner, owner.project)

    response = owner.browser_client().post(f"/accounts/members/{mine.pk}/role/", {"role": MANAGER})

    assert response.status_code == 302
    assert Membership.objects.get(pk=mine.pk).role == MANAGER


def test_a_removed_members_session_and_key_stop_at_the_next_request(owner, teammate):
    cluster = live_cluster(teammate, "stays")
    browser, api = teammate.browser_client(), teammate.api()
    assert browser.get("/accounts/").context["project"] == owner.project
    assert api.get("/api/v1/me").status_code == 200  # cached now
    assert browser.get(f"/clusters/{cluster.pk}/").status_code == 200
    target = membership_of(teammate, owner.project)

    response = owner.browser_client().post(f"/accounts/members/{target.pk}/remove/")

    assert response.status_code == 302
    assert not Membership.objects.filter(pk=target.pk).exists()
    assert api.get("/api/v1/me").status_code == 401
    assert browser.get(f"/clusters/{cluster.pk}/").status_code == 404
    assert not browser.get("/accounts/").context["project"]
    cluster.refresh_from_db()
    assert cluster.project == owner.project  # the clusters stay with the project


def test_a_developer_may_leave(owner, teammate):
    mine = membership_of(teammate, owner.project)

    response = teammate.browser_client().post(f"/accounts/members/{mine.pk}/remove/")

    assert response.status_code == 302
    assert not Membership.objects.filter(pk=mine.pk).exists()


def test_the_forms_need_csrf(owner, teammate):
    client = Client(enforce_csrf_checks=True)
    client.force_login(owner.user)
    target = membership_of(teammate, owner.project)

    assert client.post(f"/accounts/members/{target.pk}/remove/").status_code == 403
    assert Membership.objects.filter(pk=target.pk).exists()


# --- switching projects (the top bar) -----------------------------------------------------------


def test_a_member_of_two_projects_switches_from_the_top_bar(owner, stranger):
    Membership.objects.create(project=stranger.project, user=owner.user, role=DEVELOPER)
    client = owner.browser_client()
    page = client.get("/accounts/").content.decode()
    assert 'action="/accounts/project/"' in page
    assert stranger.project.name.replace("'", "&#x27;") in page

    response = client.post("/accounts/project/", {"project": stranger.project.pk})

    assert response.status_code == 302
    assert client.get("/accounts/").context["project"] == stranger.project
    # Leaving that project falls back to the first one.
    Membership.objects.filter(project=stranger.project, user=owner.user).delete()
    assert client.get("/accounts/").context["project"] == owner.project


def test_one_cannot_switch_into_a_project_one_is_not_in(owner, stranger):
    client = owner.browser_client()

    assert client.post("/accounts/project/", {"project": stranger.project.pk}).status_code == 404
    assert client.post("/accounts/project/", {"project": "x"}).status_code == 404
    assert client.get("/accounts/").context["project"] == owner.project


def test_a_user_in_one_project_sees_no_switcher(owner):
    assert (
        'action="/accounts/project/"'
        not in owner.browser_client().get("/accounts/").content.decode()
    )


# --- the API: /api/v1/members -------------------------------------------------------------------


def test_the_api_lists_members_for_an_owner_and_refuses_a_developer(owner, teammate):
    listed = owner.api().get("/api/v1/members")

    assert listed.status_code == 200
    emails = {row["email"]: row["role"] for row in listed.json()["data"]}
    assert emails == {"owner@example.com": OWNER, "teammate@example.com": DEVELOPER}
    refused = teammate.api().get("/api/v1/members")
    assert refused.status_code == 403
    assert refused.json()["error"]["code"] == "role_forbidden"


def test_the_api_invites_and_a_developer_cannot(
    owner, teammate, django_capture_on_commit_callbacks
):
    from django.core import mail

    with django_capture_on_commit_callbacks(execute=True):
        created = owner.api().post(
            "/api/v1/members",
            {"email": "Api@Example.com", "role": DEVELOPER},
            content_type="application/json",
        )

    assert created.status_code == 201
    assert created.json()["data"]["email"] == "api@example.com"
    assert mail.outbox[0].to == ["api@example.com"]
    refused = teammate.api().post(
        "/api/v1/members",
        {"email": "b@example.com", "role": DEVELOPER},
        content_type="application/json",
    )
    assert refused.status_code == 403
    assert refused.json()["error"]["message"].startswith("Only an owner or a manager may invite")
    bad = owner.api().post(
        "/api/v1/members",
        {"email": "b@example.com", "role": "root"},
        content_type="application/json",
    )
    assert (bad.status_code, bad.json()["error"]["code"]) == (422, "invalid_role")


def test_the_api_changes_a_role_and_removes_a_member(owner, teammate, stranger):
    target = membership_of(teammate, owner.project)
    api = owner.api()

    changed = api.patch(
        f"/api/v1/members/{target.pk}", {"role": MANAGER}, content_type="application/json"
    )
    assert changed.status_code == 200
    assert changed.json()["data"]["role"] == MANAGER
    assert stranger.api().delete(f"/api/v1/members/{target.pk}").status_code == 404

    assert api.delete(f"/api/v1/members/{target.pk}").status_code == 204
    assert teammate.api().get("/api/v1/me").status_code == 401


def test_the_api_keeps_the_last_owner(owner, teammate):
    mine = membership_of(owner, owner.project)

    demoted = owner.api().patch(
        f"/api/v1/members/{mine.pk}", {"role": DEVELOPER}, content_type="application/json"
    )

    assert (demoted.status_code, demoted.json()["error"]["code"]) == (422, "no_owner")
    assert owner.api().delete(f"/api/v1/members/{mine.pk}").status_code == 422
    assert Membership.objects.get(pk=mine.pk).role == OWNER


def test_a_demoted_managers_key_is_demoted_too(owner, teammate):
    make(teammate, MANAGER)
    api = teammate.api()
    assert api.get("/api/v1/members").status_code == 200

    make(teammate, DEVELOPER)

    assert api.get("/api/v1/members").status_code == 403


def test_the_account_page_links_the_team_for_whoever_may_see_it(owner, teammate):
    link = b'href="/accounts/members/">Members and invitations</a>'

    assert link in owner.browser_client().get("/accounts/").content
    assert link not in teammate.browser_client().get("/accounts/").content  # a developer
