"""The API key lookup kept in the cache (accounts/keys.py): cheap while nothing changes, and
forgotten on the very next call when something the lookup checks changes."""

import pickle
from datetime import timedelta

import pytest
import time_machine
from django.core.cache import cache
from django.test import Client
from django.utils import timezone

from accounts import keys
from accounts.models import ApiKey, Membership, User, hash_api_key
from clusters.models import Cluster
from tests.clusters.front import credit, machine_type_with_hosts, ssh_key

ME = "/api/v1/me"


def key_of(person) -> ApiKey:
    return ApiKey.objects.get(key_hash=hash_api_key(person.key))


def warm(person) -> Client:
    """A client whose key was just found, so the next call finds it in the cache."""
    api = person.api()
    assert api.get(ME).status_code == 200
    assert isinstance(cache.get(f"apikey:{hash_api_key(person.key)}"), ApiKey)
    return api


def assert_refused(response) -> None:
    assert response.status_code == 401
    assert response.json()["error"]["code"] == "unauthenticated"


def test_it_finds_a_key_used_lately_without_a_query(owner, django_assert_num_queries):
    api = warm(owner)

    with django_assert_num_queries(1):  # the environments `me` lists; no key lookup
        response = api.get(ME)

    assert response.status_code == 200
    data = response.json()["data"]
    assert data["email"] == owner.user.email
    assert data["project"]["name"] == owner.project.name


def test_it_keeps_neither_the_key_nor_the_users_password_in_the_cache(owner):
    warm(owner)

    entry = cache.get(f"apikey:{hash_api_key(owner.key)}")
    stored = pickle.dumps(entry)
    assert owner.key.encode() not in stored
    assert owner.user.password.encode() not in stored
    assert "password" in entry.user.get_deferred_fields()


def test_it_loads_what_the_cache_does_not_hold_from_the_database(owner):
    warm(owner)
    entry = cache.get(f"apikey:{hash_api_key(owner.key)}")

    assert entry.project.created_at == owner.project.created_at  # deferred: read on use
    assert entry.user.check_password("correct-horse-battery")


# --- a change takes effect on the very next call ----------------------------------------------


def test_it_refuses_a_key_revoked_through_the_api_on_the_next_call(owner, teammate):
    api = warm(teammate)

    revoked = owner.api().delete(f"/api/v1/keys/{key_of(teammate).pk}")

    assert revoked.status_code == 204
    assert_refused(api.get(ME))


def test_it_refuses_a_key_that_revoked_itself_on_the_next_call(owner):
    api = warm(owner)

    assert api.delete(f"/api/v1/keys/{key_of(owner).pk}").status_code == 204

    assert_refused(api.get(ME))


def test_it_refuses_a_key_revoked_on_the_account_page_on_the_next_call(owner):
    api = warm(owner)

    response = owner.browser_client().post(f"/accounts/api-keys/{key_of(owner).pk}/revoke/")

    assert response.status_code == 302
    assert_refused(api.get(ME))


def test_it_refuses_a_key_revoked_by_staff_on_the_next_call(owner):
    api = warm(owner)
    staff = Client()
    staff.force_login(User.objects.create_superuser(email="staff@example.com", password="x"))

    staff.post(
        "/admin/accounts/apikey/", {"action": "revoke", "_selected_action": [key_of(owner).pk]}
    )

    assert key_of(owner).revoked_at is not None
    assert_refused(api.get(ME))


def test_it_refuses_a_deleted_key_on_the_next_call(owner):
    api = warm(owner)

    key_of(owner).delete()

    assert_refused(api.get(ME))


def test_it_refuses_the_key_of_a_user_deactivated_since_its_last_call(owner):
    api = warm(owner)

    owner.user.is_active = False
    owner.user.save()

    assert_refused(api.get(ME))


def test_it_refuses_the_keys_of_a_deleted_project_on_the_next_call(owner):
    api = warm(owner)

    owner.project.delete()

    assert_refused(api.get(ME))


def test_it_refuses_a_removed_member_whose_key_was_cached(owner, teammate):
    api = warm(teammate)

    Membership.objects.get(project=owner.project, user=teammate.user).delete()

    response = api.get(ME)
    assert response.status_code == 401
    assert "no longer a member" in response.json()["error"]["message"]


def test_it_shows_a_renamed_key_user_and_project_on_the_next_call(owner):
    api = warm(owner)

    key = key_of(owner)
    key.name = "renamed by staff"
    key.save()
    owner.user.name = "Ada"
    owner.user.save()
    owner.project.name = "Renamed"
    owner.project.save()

    data = api.get(ME).json()["data"]
    assert data["api_key"]["name"] == "renamed by staff"
    assert data["name"] == "Ada"
    assert data["project"]["name"] == "Renamed"


def test_it_keeps_a_key_in_the_cache_when_its_user_only_logs_in(owner, django_assert_num_queries):
    api = warm(owner)

    owner.user.last_login = timezone.now()
    owner.user.save(update_fields=["last_login"])

    with django_assert_num_queries(1):
        assert api.get(ME).status_code == 200


def test_it_never_puts_back_a_key_read_just_before_its_revocation(owner):
    """A call that read the key before the revocation committed, and stores it after, must not
    bring the revoked key back for the cache's 30 seconds."""
    api = owner.api()
    read_before = keys.find_api_key(owner.key, now=timezone.now())
    cache.clear()  # as if that call had not stored it yet

    keys.revoke_api_key(key=key_of(owner))
    keys._remember(read_before, now=timezone.now())

    assert_refused(api.get(ME))
    assert cache.get(f"apikey:{hash_api_key(owner.key)}") == keys.FORGOTTEN


def test_it_answers_from_the_database_while_a_key_is_forgotten(owner, django_assert_num_queries):
    api = warm(owner)
    owner.user.name = "Ada"
    owner.user.save()

    with django_assert_num_queries(2):  # the key, the environments
        assert api.get(ME).json()["data"]["name"] == "Ada"

    with time_machine.travel(timezone.now() + timedelta(seconds=keys.KEY_CACHE_SECONDS + 1)):
        api.get(ME)  # the forgotten mark has expired: this call keeps the key again
        with django_assert_num_queries(1):
            assert api.get(ME).status_code == 200


# --- the key's rules still hold from the cache -------------------------------------------------


def test_it_checks_a_cached_keys_scope(owner, django_assert_num_queries):
    _, raw = keys.issue_api_key(
        user=owner.user, project=owner.project, name="reader", scopes=["read"]
    )
    reader = Client(headers={"authorization": f"Bearer {raw}"})
    assert reader.get(ME).status_code == 200

    with django_assert_num_queries(0):
        response = reader.get("/api/v1/keys")

    assert response.status_code == 403
    assert response.json()["error"]["code"] == "scope_missing"


def test_it_holds_a_cached_key_to_its_machine_limit(owner):
    ssh_key(owner.project)
    credit(owner.project, "500.00")
    machine_type_with_hosts(free=4, slug="use2-h100x8-vm")
    _, raw = keys.issue_api_key(
        user=owner.user, project=owner.project, name="agent", max_machines_per_cluster=2
    )
    agent = Client(headers={"authorization": f"Bearer {raw}"})
    assert agent.get(ME).status_code == 200

    body = {"name": "train", "offer_id": "use2-h100x8-vm", "nodes": 3, "software": "none"}
    response = agent.post("/api/v1/clusters", body, content_type="application/json")

    assert response.status_code == 403, response.content
    assert not Cluster.objects.exists()


@pytest.mark.parametrize("every", [10, 25, 45])
def test_it_stamps_a_key_in_steady_use_to_the_minute(owner, every):
    key = key_of(owner)
    start = timezone.now()
    api = owner.api()

    for second in range(0, 301, every):
        now = start + timedelta(seconds=second)
        with time_machine.travel(now, tick=False):
            assert api.get(ME).status_code == 200
        key.refresh_from_db()
        assert timedelta(0) <= now - key.last_used_at <= keys.LAST_USED_PRECISION, second


def test_it_marks_a_revoked_key_forgotten_again_once_the_revocation_commits(
    owner, django_capture_on_commit_callbacks
):
    with django_capture_on_commit_callbacks() as committed:
        keys.revoke_api_key(key=key_of(owner))
    cache.clear()  # whatever the cache held until the commit

    for callback in committed:
        callback()

    assert cache.get(f"apikey:{hash_api_key(owner.key)}") == keys.FORGOTTEN
