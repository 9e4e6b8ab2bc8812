"""Every paged list takes `offset` from 0 to 10^9: 2^63 and beyond, which overflowed the
database's OFFSET (a 500), are a 422 naming the range, the same on every list."""

import pytest

from accounts.models import SshKey
from runcrate.api import MAX_OFFSET, ApiError, paginated

LISTS = [
    "/api/v1/clusters",
    "/api/v1/volumes",
    "/api/v1/ssh-keys",
    "/api/v1/keys",
    "/api/v1/billing/transactions",
    "/api/v1/billing/usage",
]


@pytest.mark.parametrize("path", LISTS)
@pytest.mark.parametrize("offset", [2**63, 2**64, MAX_OFFSET + 1, -1])
def test_it_refuses_an_offset_out_of_range_on_every_list(owner, path, offset):
    response = owner.api().get(path, {"offset": offset})

    assert response.status_code == 422
    error = response.json()["error"]
    assert error["code"] == "invalid_request"
    assert error["message"].startswith("offset: ")


@pytest.mark.parametrize("path", LISTS)
def test_it_answers_the_last_offset_with_an_empty_page(owner, path):
    response = owner.api().get(path, {"offset": MAX_OFFSET})

    assert response.status_code == 200
    body = response.json()
    assert body["data"] == [] and body["meta"]["offset"] == MAX_OFFSET


def test_the_helper_refuses_an_offset_no_operation_checked(owner):

    with pytest.raises(ApiError) as refused:
        paginated(SshKey.objects.all(), limit=10, offset=2**63)

    assert refused.value.status == 422 and refused.value.code == "invalid_request"
