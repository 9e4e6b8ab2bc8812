"""At 80 columns (`COLUMNS=80`, an 80-column terminal) the tables never cut what a person
copies or compares: every offer id, cluster name, status and price appears whole on a line."""

from decimal import Decimal

import pytest

from tests.cli.kit import assert_no_traceback, run_cli_tty
from tests.clusters.lifecycle_kit import create
from tests.factories import HostFactory, LocationFactory, MachineTypeFactory

pytestmark = pytest.mark.django_db(transaction=True)

OFFERS = {
    # slug: (price per machine, GPUs per machine)
    "use2-h100x8-bm": ("23.92", 8),
    "euw1-h100x8-vm-spot-capacity": ("1234.56", 8),
    "apne1-h100x4-community-operator-with-a-long-slug-name-60c": ("3.11", 4),
}


@pytest.fixture
def catalog():
    location = LocationFactory(code="us-east-2")
    types = {}
    for slug, (price, gpus) in OFFERS.items():
        types[slug] = MachineTypeFactory(
            slug=slug,
            location=location,
            price_per_hour=Decimal(price),
            gpus_per_machine=gpus,
            community="community" in slug,
        )
        HostFactory.create_batch(4, machine_type=types[slug])
    return types


def lines_of(result) -> list[str]:
    return result.stdout.splitlines()


def assert_whole(result, values) -> None:
    lines = lines_of(result)
    for value in values:
        assert any(value in line for line in lines), f"{value!r} is cut: {result.stdout}"
    assert max(len(line.rstrip()) for line in lines) <= 80


def test_offers_show_every_id_and_price_whole(env, tmp_path, account, catalog):
    args = ("offers", "--gpu", "h100-sxm", "--nodes", "2")
    table = run_cli_tty(*args, env=env, tmp_path=tmp_path, columns=80)
    every = run_cli_tty(*args, "--include-community", env=env, tmp_path=tmp_path, columns=80)

    offers = account.api_data("/offers?gpu=h100-sxm&nodes=2&include_community=true")
    assert {offer["id"] for offer in offers} == set(OFFERS)
    for result, shown in ((table, [o for o in offers if not o["community"]]), (every, offers)):
        assert result.code == 0, result.stderr
        assert_whole(result, [offer["id"] for offer in shown])
        for offer in shown:
            assert_whole(
                result,
                [
                    f"${offer['price_per_hour']}/h",
                    f"${offer['machine_price_per_hour']}/h each",
                    f"${offer['price_per_gpu_hour']}/GPU-h",
                ],
            )
        assert_no_traceback(result)
    assert "┃ offer" in table.stdout  # ids of 28 characters still fit a table at 80 columns
    assert "apne1-h100x4-community-operator-with-a-long-slug-name-60c" not in table.stdout


def test_clusters_list_shows_every_name_status_and_price_whole(env, tmp_path, account, catalog):
    names = [
        "train",
        "llama-70b-finetune-with-a-long-name-2026-03-01",
        "a-dns-label-of-sixty-three-characters-which-is-the-longest-ok-x",
    ]
    offers = list(catalog.values())
    for name, offer in zip(names, offers, strict=True):
        create(account.project, offer, name=name)

    result = run_cli_tty("clusters", "list", env=env, tmp_path=tmp_path, columns=80)

    assert result.code == 0, result.stderr
    assert_whole(result, names)
    assert_whole(result, ["provisioning", "$47.84/h", "$2469.12/h", "$6.22/h"])
