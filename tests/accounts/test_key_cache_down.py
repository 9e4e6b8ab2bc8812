"""Revocation, removal and deactivation take effect on the next call even when the cache does
not answer (accounts/keys.py, "fail closed"; issue 19 item 4).

The cache is a throwaway redis-server of the test's own (tests/runcrate/throwaway_redis.py),
paused with SIGSTOP while the change is made and resumed after: the key's cached copy is still
in it then, and must not be served."""

from datetime import timedelta

import pytest
from django.core.cache import cache
from django.utils import timezone

from accounts import keys
from accounts.models import ApiKey, Membership, UnforgottenKey, hash_api_key

ME = "/api/v1/me"

pytestmark = [pytest.mark.procs, pytest.mark.usefixtures("cache_on_throwaway")]  # redis-server


def key_of(person) -> ApiKey:
    return ApiKey.objects.get(key_hash=hash_api_key(person.key))


def cached(person):
    entry = cache.get(f"apikey:{hash_api_key(person.key)}")
    return entry[0] if entry is not None else None


def still_used(api) -> None:
    """A call with the key while the cache is paused: answered from the database, and it
    leaves the cache's connection broken, so the change's forget must connect afresh (a paused
    server takes the connection but never answers it: the forget is lost, not queued)."""
    assert api.get(ME).status_code == 200


def warm(person):
    api = person.api()
    assert api.get(ME).status_code == 200
    assert isinstance(cached(person), ApiKey)  # the copy that must not come back
    return api


def assert_refused(response) -> None:
    assert response.status_code == 401, response.content
    assert response.json()["error"]["code"] == "unauthenticated"


def test_it_refuses_a_key_revoked_while_the_cache_is_paused_then_and_after(
    owner, teammate, cache_on_throwaway
):
    api = warm(teammate)

    with cache_on_throwaway.paused():
        still_used(api)
        revoked = owner.api().delete(f"/api/v1/keys/{key_of(teammate).pk}")
        assert revoked.status_code == 204
        assert UnforgottenKey.objects.filter(key_hash=key_of(teammate).key_hash).exists()
        assert_refused(api.get(ME))  # the cache read fails: the database decides

    # Resumed: the cache still holds the key's copy, and must not serve it.
    assert isinstance(cached(teammate), ApiKey)
    assert_refused(api.get(ME))
    assert_refused(api.get(ME))
    # The next working key's lookup forgets it for good and trusts the cache again.
    assert owner.api().get(ME).status_code == 200
    assert cached(teammate) == keys.FORGOTTEN
    assert not UnforgottenKey.objects.exists()
    assert_refused(api.get(ME))


def test_it_refuses_a_key_revoked_on_the_account_page_while_the_cache_is_paused(
    owner, cache_on_throwaway
):
    api = warm(owner)

    with cache_on_throwaway.paused():
        still_used(api)
        response = owner.browser_client().post(f"/accounts/api-keys/{key_of(owner).pk}/revoke/")
        assert response.status_code == 302

    assert_refused(api.get(ME))


def test_it_refuses_a_deactivated_users_key_after_a_pause(owner, cache_on_throwaway):
    api = warm(owner)

    with cache_on_throwaway.paused():
        still_used(api)
        owner.user.is_active = False
        owner.user.save()

    assert_refused(api.get(ME))


def test_it_refuses_a_removed_members_key_after_a_pause(owner, teammate, cache_on_throwaway):
    api = warm(teammate)

    with cache_on_throwaway.paused():
        still_used(api)
        Membership.objects.get(project=owner.project, user=teammate.user).delete()

    response = api.get(ME)
    assert response.status_code == 401
    assert "no longer a member" in response.json()["error"]["message"]


def test_a_key_untouched_by_the_outage_is_served_from_the_cache_again(
    owner, teammate, cache_on_throwaway, django_assert_num_queries
):
    """Failing closed costs the database a look, once the cache answers again: then the trust
    is renewed and a working key is answered from the cache as before."""
    api = warm(owner)
    with cache_on_throwaway.paused():
        keys.revoke_api_key(key=key_of(teammate))

    assert api.get(ME).status_code == 200  # read from the database: the cache was untrusted

    with django_assert_num_queries(1):  # the environments `me` lists; no key lookup
        assert api.get(ME).status_code == 200


def test_it_never_serves_a_cached_key_while_the_forgets_cannot_be_settled(
    owner, teammate, cache_on_throwaway, django_assert_num_queries
):
    """A failed forget recorded, and the cache still not taking the marks: every call reads the
    database, whatever the cache holds."""
    api = warm(owner)
    UnforgottenKey.objects.create(key_hash=key_of(teammate).key_hash)
    cache.delete(keys.TRUST)

    assert keys.settle_failed_forgets(now=timezone.now()) is True  # the cache answers: settled
    assert not UnforgottenKey.objects.exists()
    with django_assert_num_queries(1):
        assert api.get(ME).status_code == 200


def test_it_trusts_the_cache_no_longer_than_its_socket_timeouts(settings):
    options = settings.CACHES["default"]["OPTIONS"]
    assert keys.trust_seconds() == min(options["socket_connect_timeout"], options["socket_timeout"])


def test_the_trust_runs_out_by_the_clock_of_the_call(owner, django_assert_num_queries):
    api = warm(owner)
    later = timezone.now() + timedelta(seconds=keys.trust_seconds() + 0.5)

    found = keys.find_api_key(owner.key, now=later)  # a hit, but the trust has run out

    assert found is not None
    assert cache.get(keys.TRUST) > later  # renewed by that look at the database
    assert api.get(ME).status_code == 200
