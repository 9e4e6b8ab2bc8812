"""Who sees the audit log and how: owners and managers on /audit/ (filters, a CSV export) and
`GET /api/v1/audit`; a developer gets no page and 403; a stranger sees nothing of another
project."""

import csv
import io
from datetime import UTC, datetime

import pytest

from audit.models import Entry

DAY_ONE = datetime(2026, 3, 1, 9, 0, tzinfo=UTC)
DAY_TWO = datetime(2026, 3, 2, 9, 0, tzinfo=UTC)


def _entry(project, **fields) -> Entry:
    defaults = {
        "actor": "user",
        "channel": "dashboard",
        "action": "clusters:terminate",
        "at": DAY_ONE,
        "user_email": "owner@example.com",
    }
    return Entry.objects.create(project=project, **{**defaults, **fields})


@pytest.fixture
def entries(owner, stranger):
    return {
        "terminate": _entry(owner.project, object_type="cluster", object_id="7"),
        "budget": _entry(
            owner.project,
            action="billing:set_budget",
            at=DAY_TWO,
            changes={"monthly_budget": {"before": "500.00", "after": "50.00"}},
        ),
        "key": _entry(
            owner.project,
            actor="api_key",
            channel="cli",
            api_key_name="=ci-robot",
            action="clusters_api_create_cluster",
            at=DAY_TWO,
        ),
        "theirs": _entry(stranger.project, user_email="stranger@example.com"),
    }


def test_an_owner_sees_the_projects_entries_newest_first(owner, entries, django_assert_num_queries):
    client = owner.browser_client()
    client.get("/audit/")  # warm the session

    # Session, user, the project with the user's role (read once for the page's check and the
    # top bar's link), count, the page, which of its clusters still exist (one query per kind
    # of object linked), the top bar's balance.
    with django_assert_num_queries(7):
        response = client.get("/audit/")
    for _ in range(20):
        _entry(owner.project, at=DAY_ONE, object_type="cluster", object_id="8")
    with django_assert_num_queries(7):  # not one more for more rows
        client.get("/audit/")

    assert response.status_code == 200
    rows = [entry.pk for entry in response.context["page"].object_list][:3]
    assert rows == [entries["key"].pk, entries["budget"].pk, entries["terminate"].pk]
    body = response.content.decode()
    assert "500.00 → 50.00" in body
    assert "stranger@example.com" not in body
    assert 'href="/audit/"' in body  # the top bar links it for an owner


def test_the_filters_narrow_by_who_what_cluster_and_time(owner, entries):
    client = owner.browser_client()

    def shown(query: str) -> set[int]:
        return {entry.pk for entry in client.get("/audit/?" + query).context["page"].object_list}

    assert shown("who=ci-robot") == {entries["key"].pk}
    assert shown("action=set_budget") == {entries["budget"].pk}
    assert shown("cluster=7") == {entries["terminate"].pk}
    assert shown("since=2026-03-02T00:00") == {entries["key"].pk, entries["budget"].pk}
    assert shown("until=2026-03-02T00:00") == {entries["terminate"].pk}


def test_a_bad_filter_is_an_error_on_the_page_never_a_500(owner, entries):
    response = owner.browser_client().get("/audit/?cluster=abc&since=yesterday")

    assert response.status_code == 200
    assert response.context["form"].errors.keys() == {"cluster", "since"}


def test_the_csv_export_has_the_filtered_entries_and_no_formula(owner, entries):
    response = owner.browser_client().get("/audit/export.csv?who=ci-robot")

    assert response["Content-Type"].startswith("text/csv")
    rows = list(csv.DictReader(io.StringIO(response.content.decode())))
    assert len(rows) == 1
    assert rows[0]["who"] == "API key '=ci-robot' (owner@example.com)"
    assert rows[0]["channel"] == "cli"
    assert rows[0]["action"] == "clusters_api_create_cluster"


def test_the_csv_of_a_filtered_view_says_who_what_which_object_and_the_changes(owner, entries):
    _entry(
        owner.project,
        actor="api_key",
        api_key_name="ci",
        action="accounts_api_revoke_key",
        summary="revoked API key `ci`",
        object_type="api_key",
        object_id="9",
        object_name="ci",
        changes={"revoked": {"before": False, "after": True}},
        outcome="done",
        at=DAY_TWO,
    )
    page = owner.browser_client().get("/audit/?action=revoked").content.decode()
    assert 'href="/audit/export.csv?action=revoked"' in page  # the page's link keeps its filter

    response = owner.browser_client().get("/audit/export.csv?action=revoked")

    assert response["Content-Disposition"] == 'attachment; filename="audit.csv"'
    (row,) = csv.DictReader(io.StringIO(response.content.decode()))
    assert (row["who"], row["what"], row["object_type"], row["object_name"]) == (
        "API key 'ci' (owner@example.com)",
        "revoked API key `ci`",
        "api_key",
        "ci",
    )
    assert row["changes"] == '{"revoked": {"after": true, "before": false}}'
    assert row["outcome"] == "done"


def test_an_entry_from_before_words_reads_from_its_action_and_answer(owner, entries):
    """Entries written before 0002 have no words, object name or outcome: they still read."""
    _entry(owner.project, method="POST", status_code=409, at=DAY_TWO)

    listed = owner.api().get("/api/v1/audit?limit=1").json()["data"][0]

    assert (listed["summary"], listed["outcome"]) == ("POST clusters:terminate (409)", "refused")
    (row, *_) = csv.DictReader(
        io.StringIO(owner.browser_client().get("/audit/export.csv").content.decode())
    )
    assert (row["what"], row["outcome"]) == ("POST clusters:terminate (409)", "refused")
    page = owner.browser_client().get("/audit/").content.decode()
    assert "cluster 7" in page  # the terminate's object, named by its kind and id


def test_the_csv_keeps_a_formula_out_of_the_first_character(owner):
    _entry(owner.project, user_email="=HYPERLINK()@example.com")

    response = owner.browser_client().get("/audit/export.csv")

    (row,) = csv.DictReader(io.StringIO(response.content.decode()))
    assert row["who"] == "'=HYPERLINK()@example.com"


def test_the_api_lists_the_projects_entries_paginated_with_filters(owner, entries):
    response = owner.api().get("/api/v1/audit?limit=1&action=clusters")

    body = response.json()
    assert response.status_code == 200
    assert body["meta"] == {"total": 2, "limit": 1, "offset": 0}
    assert body["data"][0]["action"] == "clusters_api_create_cluster"
    assert body["data"][0]["api_key"] == "=ci-robot"
    assert body["data"][0]["channel"] == "cli"

    budget = owner.api().get("/api/v1/audit?action=set_budget").json()["data"][0]
    assert budget["changes"] == {"monthly_budget": {"before": "500.00", "after": "50.00"}}
    assert budget["at"] == "2026-03-02T09:00:00Z"


def test_a_bad_api_filter_is_a_422(owner, entries):
    response = owner.api().get("/api/v1/audit?cluster=abc")

    assert response.status_code == 422
    assert not Entry.objects.filter(action="audit").exists()


def test_a_time_with_an_offset_the_database_cannot_hold_is_read_in_utc(owner, entries):
    """Python allows offsets up to ±23:59, PostgreSQL ±15:59: the filter compares in UTC."""
    api = owner.api().get("/api/v1/audit?since=2026-03-02T19:28:00%2B19:28")
    page = owner.browser_client().get("/audit/?since=2026-03-02T19:28:00%2B19:28")

    assert api.status_code == 200
    assert {entry["id"] for entry in api.json()["data"]} == {
        entries["key"].pk,
        entries["budget"].pk,
    }
    assert {entry.pk for entry in page.context["page"].object_list} == {
        entries["key"].pk,
        entries["budget"].pk,
    }


def test_a_time_utc_cannot_hold_is_refused_with_words(owner, entries):
    api = owner.api().get("/api/v1/audit?until=0001-01-01T00:00:00%2B05:00")
    page = owner.browser_client().get("/audit/?until=0001-01-01T00:00:00%2B05:00")

    assert api.status_code == 422
    assert "until: 0001-01-01T00:00:00+05:00 is out of range" in api.json()["error"]["message"]
    assert page.status_code == 200
    assert page.context["form"].errors.keys() == {"until"}


def test_a_developer_gets_no_page_no_link_and_a_403(teammate, entries):
    client = teammate.browser_client()

    page = client.get("/audit/")
    assert page.status_code == 403
    assert "Only an owner or a manager may see the audit log." in page.content.decode()
    assert "owner@example.com" not in page.content.decode()
    assert client.get("/audit/export.csv").status_code == 403
    assert 'href="/audit/"' not in client.get("/clusters/").content.decode()
    response = teammate.api().get("/api/v1/audit")
    assert response.status_code == 403
    assert response.json()["error"]["code"] == "role_forbidden"


def test_a_stranger_sees_nothing_of_another_project(stranger, entries):
    page = stranger.browser_client().get("/audit/")
    api = stranger.api().get("/api/v1/audit").json()

    assert [entry.pk for entry in page.context["page"].object_list] == [entries["theirs"].pk]
    assert [entry["id"] for entry in api["data"]] == [entries["theirs"].pk]
    assert "owner@example.com" not in page.content.decode()


def test_entries_cannot_be_added_changed_or_deleted_in_admin(owner, entries):
    from accounts.models import User

    staff = User.objects.create_superuser(email="staff@example.com", password="x-long-password")
    client = owner.browser_client()
    client.force_login(staff)
    pk = entries["terminate"].pk

    assert client.get(f"/admin/audit/entry/{pk}/change/").status_code == 200  # view only
    assert client.get("/admin/audit/entry/add/").status_code == 403
    assert client.post(f"/admin/audit/entry/{pk}/delete/", {"post": "yes"}).status_code == 403
    assert Entry.objects.filter(pk=pk).exists()
