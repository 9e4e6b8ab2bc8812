"""`make bench` measures on a database of its own, over real HTTP, and leaves the operator's
database as it found it."""

from pathlib import Path

import pytest
from django.core.management import CommandError, call_command
from django.db import connection

from offers.models import GpuModel, Host, Location
from runcrate import bench


def _database_exists(name: str) -> bool:
    if connection.vendor == "sqlite":
        return Path(name).exists()
    with connection.cursor() as cursor:
        cursor.execute("SELECT 1 FROM pg_database WHERE datname = %s", [name])
        return cursor.fetchone() is not None


@pytest.mark.django_db(transaction=True)
def test_it_builds_its_inventory_in_a_throwaway_database_and_drops_it(tmp_path):
    GpuModel.objects.create(slug="operator-gpu", name="The operator's GPU", memory_gib=80)
    operator_database = connection.settings_dict["NAME"]

    with bench.throwaway_database(tmp_path) as description:
        throwaway = connection.settings_dict["NAME"]
        assert throwaway != operator_database
        assert str(throwaway) in description
        assert not GpuModel.objects.filter(slug="operator-gpu").exists()
        bench.build_inventory(hosts=400, locations=8)
        assert Host.objects.count() == 400
        assert Location.objects.count() == 8

    assert connection.settings_dict["NAME"] == operator_database
    assert not _database_exists(str(throwaway))
    assert list(GpuModel.objects.values_list("slug", flat=True)) == ["operator-gpu"]
    assert not Host.objects.exists()


@pytest.mark.django_db(transaction=True)
def test_it_spreads_the_hosts_over_every_location_and_both_capacity_modes(tmp_path):
    with bench.throwaway_database(tmp_path):
        bench.build_inventory(hosts=400, locations=8)
        modes = set(Location.objects.values_list("capacity_reporting", flat=True))
        empty = Location.objects.filter(machine_types__hosts__isnull=True)
        free = Host.objects.filter(state=Host.State.FREE).count()

        assert modes == {Location.CapacityReporting.COUNT, Location.CapacityReporting.BOOLEAN}
        assert not empty.exists()
        assert 0 < free < 400


def test_it_times_requests_over_http_to_a_server_in_a_thread():
    server = bench.HttpBench()
    try:
        status, body, seconds = server.get("/healthz")
        timings = bench._measure_rounds(server, {"bare": ("/healthz", {})}, rounds=12, warmup=2)
    finally:
        server.close()

    assert (status, body) == (200, b'{"status": "ok"}')
    assert seconds > 0
    assert len(timings["bare"].samples) == 12
    assert timings["bare"].median_ms <= timings["bare"].p90_ms


def test_it_refuses_sizes_it_cannot_build(db):
    with pytest.raises(CommandError, match="--hosts must be at least 100"):
        call_command("bench", hosts=10)
    with pytest.raises(CommandError, match="--requests must be at least 10, not 3"):
        call_command("bench", requests=3)
