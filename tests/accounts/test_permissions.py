"""The permission table (accounts/permissions.py): one home for who may do what (SPEC §5)."""

import pytest

from accounts import permissions
from accounts.models import Membership
from billing.access import BILLING_ROLES, can_manage_billing

OWNER, MANAGER, DEVELOPER = (
    Membership.Role.OWNER,
    Membership.Role.MANAGER,
    Membership.Role.DEVELOPER,
)


@pytest.mark.parametrize(
    ("role", "action", "expected"),
    [
        (OWNER, "project.delete", True),
        (MANAGER, "project.delete", False),
        (MANAGER, "team.invite_developer", True),
        (MANAGER, "team.invite_manager", True),
        (MANAGER, "team.invite_owner", False),
        (DEVELOPER, "team.invite_developer", False),
        (DEVELOPER, "team.view", False),
        (DEVELOPER, "billing.view", False),
        (DEVELOPER, "budgets.manage", False),
        (DEVELOPER, "clusters.manage", True),
        (DEVELOPER, "keys.own", True),
        (None, "clusters.manage", False),
    ],
)
def test_the_table_answers_for_each_role(role, action, expected):
    assert permissions.allowed(role, action) is expected


def test_an_action_not_in_the_table_fails_loudly():
    with pytest.raises(KeyError):
        permissions.allowed(OWNER, "team.everything")


def test_the_refusal_names_the_roles_needed():
    refusal = permissions.refusal("team.invite_developer", DEVELOPER)

    assert refusal.code == "role_forbidden"
    assert refusal.status == 403
    assert refusal.message.startswith("Only an owner or a manager may invite members.")
    assert "developer" in refusal.message


def test_billing_reads_the_table(owner, teammate):
    assert tuple(BILLING_ROLES) == permissions.roles_for("billing.manage")
    assert can_manage_billing(user=owner.user, project=owner.project)
    assert not can_manage_billing(user=teammate.user, project=owner.project)
    Membership.objects.filter(user=teammate.user).update(role=MANAGER)
    assert can_manage_billing(user=teammate.user, project=owner.project)


def test_role_of_reads_the_current_row(owner, teammate, stranger, django_assert_num_queries):
    with django_assert_num_queries(1):
        assert permissions.role_of(teammate.user, owner.project) == DEVELOPER
    assert permissions.role_of(stranger.user, owner.project) is None
    Membership.objects.filter(user=teammate.user).update(role=MANAGER)
    assert permissions.role_of(teammate.user, owner.project) == MANAGER


def test_every_may_a_template_asks_names_an_action_of_the_table():
    """A template's `may.x_y` that is not in the table would read as false, silently: a link
    hidden from everyone. Every one asked is an action."""
    import re
    from pathlib import Path

    from django.conf import settings

    asked = set()
    for folder in [*settings.TEMPLATES[0]["DIRS"], *Path(settings.BASE_DIR).glob("*/templates")]:
        for template in Path(folder).rglob("*.html"):
            asked |= set(re.findall(r"\bmay\.(\w+)", template.read_text()))

    assert {"billing_view", "audit_view", "team_view"} <= asked
    unknown = {key for key in asked if key.replace("_", ".", 1) not in permissions.TABLE}
    assert unknown == set()


def test_abilities_read_the_role_once_and_refuse_an_unknown_action(
    owner, teammate, django_assert_num_queries
):
    from django.utils.functional import SimpleLazyObject

    from accounts.projects import context_for

    # As the middleware hands it over: the request's lazy context, read at the first question.
    may = permissions.Abilities(SimpleLazyObject(lambda: context_for(teammate.user)))

    with django_assert_num_queries(1):
        assert not may["billing_view"]
        assert may["clusters_manage"]
        assert not may["keys_remove_others"]
    with pytest.raises(KeyError, match="no.such"):
        may["no_such"]
    assert not permissions.Abilities(None)["clusters_manage"]


def test_the_request_role_is_read_with_the_project_and_an_api_call_reads_the_row(
    owner, teammate, django_assert_num_queries
):
    from types import SimpleNamespace

    from accounts.projects import context_for

    context = context_for(teammate.user, owner.project.pk)
    page = SimpleNamespace(user=teammate.user, project=context.project, project_context=context)
    with django_assert_num_queries(0):
        assert permissions.request_role(page) == DEVELOPER

    api_call = SimpleNamespace(user=teammate.user, project=owner.project, project_context=None)
    Membership.objects.filter(user=teammate.user).update(role=MANAGER)
    with django_assert_num_queries(1):
        assert permissions.request_role(api_call) == MANAGER


def test_the_legend_says_what_each_role_may_do_owner_first():
    legend = dict(permissions.legend())

    assert list(legend) == ["Owner", "Manager", "Developer"]
    assert legend["Developer"] == [
        "manage clusters",
        "manage volumes",
        "keep their own SSH and API keys",
    ]
    assert "delete the project" in legend["Owner"] and "delete the project" not in legend["Manager"]
