"""`runcrate gpus` and `runcrate offers` against a live server: the same answer as the API."""

import pytest

from tests.cli.kit import assert_no_traceback, run_cli
from tests.factories import GpuModelFactory, HostFactory, LocationFactory, MachineTypeFactory

pytestmark = pytest.mark.django_db(transaction=True)


@pytest.fixture
def catalog(account):
    """Two offers of H100s for 2 machines: a datacenter one and a community one."""
    gpu = GpuModelFactory(slug="h100-sxm")
    datacenter = MachineTypeFactory(
        slug="use2-h100x8-vm", gpu=gpu, location=LocationFactory(code="us-east-2")
    )
    community = MachineTypeFactory(
        slug="comm-h100x8", gpu=gpu, community=True, location=LocationFactory(code="comm-1")
    )
    for machine_type in (datacenter, community):
        for _ in range(3):
            HostFactory(machine_type=machine_type)
    return datacenter, community


def test_it_prints_the_apis_offers_with_community_hosts_as_json(env, tmp_path, account, catalog):
    result = run_cli(
        "offers",
        "--gpu",
        "h100-sxm",
        "--nodes",
        "2",
        "--include-community",
        "--json",
        env=env,
        tmp_path=tmp_path,
    )

    assert result.code == 0, result.stderr
    expected = account.api_data("/offers?gpu=h100-sxm&nodes=2&include_community=true")
    assert result.json() == expected
    assert {offer["id"] for offer in result.json()} == {"use2-h100x8-vm", "comm-h100x8"}


def test_it_leaves_community_offers_out_unless_asked(env, tmp_path, account, catalog):
    result = run_cli("offers", "--gpu", "h100-sxm", "--nodes", "2", env=env, tmp_path=tmp_path)

    assert result.code == 0, result.stderr
    # stdout is a file, not a terminal: JSON without --json
    assert [offer["id"] for offer in result.json()] == ["use2-h100x8-vm"]
    assert result.json() == account.api_data("/offers?gpu=h100-sxm&nodes=2")


def test_it_prints_the_gpus_as_the_api_gives_them(env, tmp_path, account, catalog):
    result = run_cli("gpus", "--json", env=env, tmp_path=tmp_path)

    assert result.code == 0, result.stderr
    assert result.json() == account.api_data("/gpus")
    assert result.json()[0]["slug"] == "h100-sxm"


def test_it_prints_the_apis_refusal_for_a_size_out_of_range(env, tmp_path, account, catalog):
    result = run_cli("offers", "--gpu", "h100-sxm", "--nodes", "65", env=env, tmp_path=tmp_path)

    api = account.api().get("/api/v1/offers?gpu=h100-sxm&nodes=65").json()["error"]
    assert result.code == 1
    assert result.json() == {"error": {**api, "status": 422}}  # the API's own words
    # On stderr the API call it cites is the command that makes it.
    assert "(POST /api/v1/quotes)" in api["message"]
    assert api["message"].replace("POST /api/v1/quotes", "`runcrate quote request`") in (
        result.stderr
    )
    assert_no_traceback(result)
