"""The inventory file (SPEC §1, §9; docs/inventory.md): a checked, all-or-nothing upsert."""

import copy
import json
import socket
from decimal import Decimal
from io import StringIO

import pytest
from django.core.management import CommandError, call_command
from django.db import connection

from offers.inventory import (
    DEMO_INVENTORY,
    InventoryError,
    group_host_names,
    load_inventory,
    read_inventory_file,
)
from offers.models import GpuModel, Host, Location, MachineType
from offers.offers import Availability, list_offers
from tests.factories import HostFactory

HOST_KEY = "ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIOMqqnkVzrm0SdG6UOoqKLsabgH5C9okWi0dh2l9GKJl"


def inventory() -> dict:
    return {
        "gpu_models": [
            {"slug": "h100-sxm", "name": "H100 SXM 80GB", "memory_gib": 80},
            {"slug": "l40s", "name": "L40S 48GB", "memory_gib": 48},
        ],
        "locations": [
            {
                "code": "us-east-2",
                "name": "Columbus, Ohio",
                "country": "US",
                "capacity_reporting": "count",
                "ssh_gateway": "gw.us-east-2.runcrate.net:22",
            },
            {
                "code": "eu-north-1",
                "name": "Kajaani, Finland",
                "country": "FI",
                "capacity_reporting": "boolean",
                "ssh_gateway": None,
                "volume_price_per_gb_month": "0.06",
            },
        ],
        "machine_types": [
            {
                "slug": "use2-h100x8-bm",
                "location": "us-east-2",
                "gpu": "h100-sxm",
                "gpus_per_machine": 8,
                "machine_kind": "bare_metal",
                "interconnect": "ethernet",
                "community": False,
                "price_per_hour": "23.92",
            },
            {
                "slug": "eun1-l40sx1-ctr",
                "location": "eu-north-1",
                "gpu": "l40s",
                "gpus_per_machine": 1,
                "machine_kind": "container",
                "price_per_hour": 0.95,
                "boot_seconds": 45,
                "slow_boot": True,
            },
        ],
        "hosts": [
            {
                "name": "gpu-ssh-1",
                "machine_type": "use2-h100x8-bm",
                "driver": "ssh",
                "address": "203.0.113.10",
                "port": 2222,
                "user": "ubuntu",
                "host_key": HOST_KEY,
            },
            {"name": "drill-1", "machine_type": "eun1-l40sx1-ctr", "fault": "network"},
            {"machine_type": "use2-h100x8-bm", "count": 3, "name_prefix": "use2-bm-"},
        ],
    }


def snapshot() -> dict:
    """Every inventory row with every field, to tell whether anything at all changed."""
    return {
        model.__name__: list(model.objects.order_by("pk").values())
        for model in (GpuModel, Location, MachineType, Host)
    }


def write(tmp_path, data, name="inventory.json"):
    path = tmp_path / name
    path.write_text(data if isinstance(data, str) else json.dumps(data))
    return path


# --- a good file ------------------------------------------------------------------------------


def test_it_loads_a_good_file(db):
    report = load_inventory(inventory())

    assert (report.gpu_models.created, report.locations.created) == (2, 2)
    assert (report.machine_types.created, report.hosts.created) == (2, 5)
    h100 = MachineType.objects.select_related("location", "gpu").get(slug="use2-h100x8-bm")
    assert h100.location.code == "us-east-2"
    assert h100.gpu.slug == "h100-sxm"
    assert h100.price_per_hour == Decimal("23.92")
    assert h100.boot_seconds == 600  # bare metal's default
    assert h100.slow_boot is False
    l40s = MachineType.objects.get(slug="eun1-l40sx1-ctr")
    assert (l40s.price_per_hour, l40s.boot_seconds, l40s.slow_boot) == (Decimal("0.95"), 45, True)
    assert l40s.interconnect == "ethernet" and l40s.community is False
    kajaani = Location.objects.get(code="eu-north-1")
    assert kajaani.ssh_gateway == ""
    assert kajaani.volume_price_per_gb_month == Decimal("0.06")
    assert Location.objects.get(code="us-east-2").volume_price_per_gb_month == Decimal("0.10")
    ssh = Host.objects.get(name="gpu-ssh-1")
    assert (ssh.driver, ssh.address, ssh.port, ssh.user) == ("ssh", "203.0.113.10", 2222, "ubuntu")
    assert ssh.host_key == HOST_KEY
    assert Host.objects.get(name="drill-1").fault == "network"
    grouped = Host.objects.filter(name__startswith="use2-bm-").order_by("name")
    assert [h.name for h in grouped] == ["use2-bm-001", "use2-bm-002", "use2-bm-003"]
    assert {(h.driver, h.fault, h.state) for h in grouped} == {("simulated", "", "free")}


def test_it_gives_identical_rows_when_a_file_is_loaded_twice(db):
    load_inventory(inventory())
    before = snapshot()

    report = load_inventory(inventory())

    assert snapshot() == before
    for _, kind in report.kinds():
        assert (kind.created, kind.updated, kind.not_in_file) == (0, 0, 0)
    assert report.hosts.unchanged == 5
    assert report.machine_types.unchanged == 2


def test_it_applies_a_changed_price_and_nothing_else(db):
    load_inventory(inventory())
    before = snapshot()
    data = inventory()
    data["machine_types"][0]["price_per_hour"] = "21.50"

    report = load_inventory(data)

    assert (report.machine_types.updated, report.machine_types.unchanged) == (1, 1)
    assert report.hosts.updated == 0
    assert MachineType.objects.get(slug="use2-h100x8-bm").price_per_hour == Decimal("21.50")
    after = snapshot()
    assert after["Host"] == before["Host"]
    assert after["Location"] == before["Location"]


def test_it_takes_defaults_for_keys_an_update_leaves_out(db):
    load_inventory(inventory())
    data = inventory()
    del data["machine_types"][1]["boot_seconds"]
    del data["machine_types"][1]["slow_boot"]

    load_inventory(data)

    l40s = MachineType.objects.get(slug="eun1-l40sx1-ctr")
    assert (l40s.boot_seconds, l40s.slow_boot) == (60, False)


def test_it_takes_a_machine_types_link_speed_or_its_interconnects_default(db):
    data = inventory()
    data["machine_types"][0] |= {"interconnect": "infiniband", "link_mbit": 25_000}
    load_inventory(data)
    h100 = MachineType.objects.get(slug="use2-h100x8-bm")
    assert (h100.link_mbit, h100.expected_link_mbit) == (25_000, 25_000)
    l40s = MachineType.objects.get(slug="eun1-l40sx1-ctr")
    assert (l40s.link_mbit, l40s.expected_link_mbit) == (None, 1_000)  # Ethernet's default

    del data["machine_types"][0]["link_mbit"]  # left out again: the interconnect's default
    load_inventory(data)
    h100.refresh_from_db()
    assert (h100.link_mbit, h100.expected_link_mbit) == (None, 10_000)


def test_it_takes_how_many_measurements_a_locations_fabric_carries_at_once(db):
    data = inventory()
    data["locations"][0]["measurements_at_once"] = 2
    load_inventory(data)
    assert Location.objects.get(code="us-east-2").measurements_at_once == 2
    # Left out (or null): every pair of a round at once.
    assert Location.objects.get(code="eu-north-1").measurements_at_once is None

    data["locations"][0]["measurements_at_once"] = None
    load_inventory(data)
    assert Location.objects.get(code="us-east-2").measurements_at_once is None


def test_it_keeps_a_hosts_state_across_a_reload(db):
    load_inventory(inventory())
    Host.objects.filter(name="gpu-ssh-1").update(state=Host.State.IN_USE)
    Host.objects.filter(name="use2-bm-002").update(state=Host.State.OFFLINE)
    data = inventory()
    data["hosts"][0]["address"] = "203.0.113.99"  # a static field of a host in use may change

    report = load_inventory(data)

    assert report.hosts.updated == 1
    in_use = Host.objects.get(name="gpu-ssh-1")
    assert (in_use.state, in_use.address) == (Host.State.IN_USE, "203.0.113.99")
    assert Host.objects.get(name="use2-bm-002").state == Host.State.OFFLINE


def test_it_never_deletes_what_the_file_leaves_out(db):
    load_inventory(inventory())
    data = inventory()
    data["machine_types"] = data["machine_types"][:1]  # eun1-l40sx1-ctr left out
    data["hosts"] = [  # drill-1, use2-bm-002 and use2-bm-003 left out
        data["hosts"][0],
        {"machine_type": "use2-h100x8-bm", "count": 1, "name_prefix": "use2-bm-"},
    ]

    report = load_inventory(data)

    assert Host.objects.count() == 5
    assert MachineType.objects.filter(slug="eun1-l40sx1-ctr").exists()
    assert (report.hosts.unchanged, report.hosts.not_in_file) == (2, 3)
    assert report.machine_types.not_in_file == 1


def test_it_accepts_references_to_rows_already_in_the_database(db):
    load_inventory(inventory())

    report = load_inventory(
        {"hosts": [{"machine_type": "eun1-l40sx1-ctr", "count": 2, "name_prefix": "eun1-"}]}
    )

    assert report.hosts.created == 2
    assert Host.objects.get(name="eun1-002").machine_type.slug == "eun1-l40sx1-ctr"


def test_it_moves_a_free_host_to_another_machine_type(db):
    load_inventory(inventory())
    data = inventory()
    data["hosts"].append({"name": "use2-bm-003", "machine_type": "eun1-l40sx1-ctr"})
    data["hosts"][2]["count"] = 2

    load_inventory(data)

    assert Host.objects.get(name="use2-bm-003").machine_type.slug == "eun1-l40sx1-ctr"


def test_it_names_grouped_hosts_with_three_digits_and_keeps_them_past_999():
    assert group_host_names("gpu-", 3) == ["gpu-001", "gpu-002", "gpu-003"]
    names = group_host_names("gpu-", 1001)
    assert names[998:] == ["gpu-999", "gpu-1000", "gpu-1001"]
    assert group_host_names("gpu-", 999) == names[:999]


def test_it_accepts_a_price_given_as_a_json_number(db):
    data = inventory()
    data["machine_types"][0]["price_per_hour"] = 23.92
    data["machine_types"][1]["price_per_hour"] = 24

    load_inventory(data)

    assert MachineType.objects.get(slug="use2-h100x8-bm").price_per_hour == Decimal("23.92")
    assert MachineType.objects.get(slug="eun1-l40sx1-ctr").price_per_hour == Decimal("24.00")


class CountQueries:
    """Counts statements without recording their SQL (which on SQLite costs a query per batch)."""

    def __init__(self):
        self.count = 0

    def __call__(self, execute, sql, params, many, context):
        self.count += 1
        return execute(sql, params, many, context)


def test_it_writes_hosts_in_batches_not_one_query_each(db):
    data = inventory()
    data["hosts"] = [
        {"machine_type": "use2-h100x8-bm", "count": 2_500, "name_prefix": f"big{i}-"}
        for i in range(2)
    ]

    first, second = CountQueries(), CountQueries()
    with connection.execute_wrapper(first):
        report = load_inventory(data)
    with connection.execute_wrapper(second):
        again = load_inventory(data)

    assert report.hosts.created == Host.objects.count() == 5_000
    # Batches of up to 1,000 rows (about 90 on SQLite, whose parameters are limited).
    assert first.count < 100
    assert again.hosts.unchanged == 5_000
    assert second.count < 30


# --- bad files: refused whole, with a message naming the entry and field ------------------------


def _set(section, index, key, value):
    def change(data):
        data[section][index][key] = value

    return change


def _delete(section, index, key):
    def change(data):
        del data[section][index][key]

    return change


def _append(section, entry):
    def change(data):
        data[section].append(entry)

    return change


BAD_FILES = {
    "unknown key": (
        _set("machine_types", 0, "colour", "red"),
        "machine_types[0] (use2-h100x8-bm).colour: unknown key; allowed keys are slug, location,",
    ),
    "unknown section": (
        lambda data: data.update(regions=[]),
        "regions: unknown section; allowed are gpu_models, locations, machine_types, hosts",
    ),
    "missing key": (
        _delete("gpu_models", 1, "memory_gib"),
        "gpu_models[1] (l40s).memory_gib: is required",
    ),
    "bad capacity_reporting": (
        _set("locations", 0, "capacity_reporting", "maybe"),
        'locations[0] (us-east-2).capacity_reporting: must be "count" or "boolean", not "maybe"',
    ),
    "bad machine_kind": (
        _set("machine_types", 1, "machine_kind", "lambda"),
        "machine_types[1] (eun1-l40sx1-ctr).machine_kind: must be "
        '"vm", "bare_metal" or "container", not "lambda"',
    ),
    "bad interconnect": (
        _set("machine_types", 0, "interconnect", "nvlink"),
        "machine_types[0] (use2-h100x8-bm).interconnect: must be "
        '"ethernet", "infiniband" or "roce", not "nvlink"',
    ),
    "bad driver": (
        _set("hosts", 1, "driver", "docker"),
        'hosts[1] (drill-1).driver: must be "simulated" or "ssh", not "docker"',
    ),
    "bad fault": (
        _set("hosts", 1, "fault", "fire"),
        'hosts[1] (drill-1).fault: must be null, "boot", "crash", "agent", "network", "install" '
        'or "gpu", not "fire"',
    ),
    "negative price": (
        _set("machine_types", 0, "price_per_hour", "-1"),
        "machine_types[0] (use2-h100x8-bm).price_per_hour: must be a positive amount with at most"
        ' 2 decimals, not "-1"',
    ),
    "price with three decimals": (
        _set("machine_types", 0, "price_per_hour", "23.925"),
        "machine_types[0] (use2-h100x8-bm).price_per_hour: must be a positive amount with at most"
        ' 2 decimals, not "23.925"',
    ),
    "zero price": (
        _set("machine_types", 1, "price_per_hour", 0),
        "machine_types[1] (eun1-l40sx1-ctr).price_per_hour: must be a positive amount",
    ),
    "gpus per machine": (
        _set("machine_types", 0, "gpus_per_machine", 3),
        "machine_types[0] (use2-h100x8-bm).gpus_per_machine: must be 1, 2, 4 or 8, not 3",
    ),
    "true for a number": (
        _set("gpu_models", 0, "memory_gib", True),
        "gpu_models[0] (h100-sxm).memory_gib: must be a whole number from 1 to 10000, not true",
    ),
    "bad boot_seconds": (
        _set("machine_types", 1, "boot_seconds", 7200),
        "machine_types[1] (eun1-l40sx1-ctr).boot_seconds: must be a whole number from 1 to 3600",
    ),
    "bad link_mbit": (
        _set("machine_types", 0, "link_mbit", 0),
        "machine_types[0] (use2-h100x8-bm).link_mbit: must be a whole number from 1 to 1000000",
    ),
    "string for a boolean": (
        _set("machine_types", 0, "community", "no"),
        'machine_types[0] (use2-h100x8-bm).community: must be true or false, not "no"',
    ),
    "bad country": (
        _set("locations", 1, "country", "Finland"),
        "locations[1] (eu-north-1).country: must be a two-letter country code in capitals",
    ),
    "bad slug": (
        _set("gpu_models", 0, "slug", "H100 SXM"),
        "gpu_models[0] (H100 SXM).slug: must be lowercase letters and digits joined by hyphens",
    ),
    "gateway port out of range": (
        _set("locations", 0, "ssh_gateway", "gw.us-east-2.runcrate.net:99999"),
        'locations[0] (us-east-2).ssh_gateway: must be null or "host:port" with a port from 1 to'
        ' 65535, not "gw.us-east-2.runcrate.net:99999"',
    ),
    "gateway without a port": (
        _set("locations", 0, "ssh_gateway", "gw.us-east-2.runcrate.net"),
        'locations[0] (us-east-2).ssh_gateway: must be null or "host:port"',
    ),
    "missing gpu reference": (
        _set("machine_types", 1, "gpu", "b300"),
        'machine_types[1] (eun1-l40sx1-ctr).gpu: no GPU model "b300" in the file or the database',
    ),
    "missing location reference": (
        _set("machine_types", 0, "location", "mars-1"),
        'machine_types[0] (use2-h100x8-bm).location: no location "mars-1" in the file or the'
        " database",
    ),
    "missing machine type reference": (
        _set("hosts", 2, "machine_type", "use2-h100x8-xx"),
        'hosts[2] (use2-bm-001…use2-bm-003).machine_type: no machine type "use2-h100x8-xx" in the'
        " file or the database",
    ),
    "duplicate host name": (
        _append("hosts", {"name": "use2-bm-002", "machine_type": "use2-h100x8-bm"}),
        'hosts[3] (use2-bm-002).name: "use2-bm-002" is already used by hosts[2]'
        " (use2-bm-001…use2-bm-003)",
    ),
    "group overlapping a host": (
        _append("hosts", {"machine_type": "use2-h100x8-bm", "count": 2, "name_prefix": "use2-bm-"}),
        "hosts[3] (use2-bm-001…use2-bm-002).name_prefix: makes names already used in the file:"
        ' "use2-bm-001" (hosts[2] (use2-bm-001…use2-bm-003)), "use2-bm-002"',
    ),
    "duplicate slug": (
        _append("gpu_models", {"slug": "l40s", "name": "L40S again", "memory_gib": 48}),
        'gpu_models[2] (l40s).slug: "l40s" is already used by gpu_models[1] (l40s)',
    ),
    "count of zero": (
        _set("hosts", 2, "count", 0),
        "hosts[2].count: must be a whole number from 1 to 10000, not 0",
    ),
    "count too large": (
        _set("hosts", 2, "count", 10_001),
        "hosts[2].count: must be a whole number from 1 to 10000, not 10001",
    ),
    "unknown key in a group": (
        _set("hosts", 2, "driver", "ssh"),
        "hosts[2] (use2-bm-001…use2-bm-003).driver: unknown key; allowed keys are machine_type,"
        " count, name_prefix",
    ),
    "fault on an ssh host": (
        _set("hosts", 0, "fault", "boot"),
        "hosts[0] (gpu-ssh-1).fault: only simulated hosts take a fault;"
        ' this host\'s driver is "ssh"',
    ),
    "ssh host without an address": (
        _delete("hosts", 0, "address"),
        "hosts[0] (gpu-ssh-1).address: is required for the ssh driver",
    ),
    "ssh host without a host key": (
        _delete("hosts", 0, "host_key"),
        "hosts[0] (gpu-ssh-1).host_key: is required for the ssh driver: the host key is pinned,"
        " never trusted",
    ),
    "apt mirror that is not a URL": (
        _set("locations", 0, "apt_mirror", "ftp://mirror"),
        'locations[0] (us-east-2).apt_mirror: must be an http:// or https:// URL, not "ftp://mirror"',
    ),
    "storage host without its host key": (
        _set("locations", 0, "storage_host", "10.0.0.9:22"),
        "locations[0] (us-east-2).storage_host_key: is required with a storage_host: its host key"
        " is pinned, never trusted",
    ),
    "storage path that is not absolute": (
        _set("locations", 0, "storage_path", "volumes/../etc"),
        "locations[0] (us-east-2).storage_path: must be an absolute path like"
        " /srv/runcrate/volumes",
    ),
    "reimage command on two lines": (
        _set("locations", 0, "reimage", "ipmitool chassis power cycle\nrm -rf /"),
        "locations[0] (us-east-2).reimage: must be one line, without control characters",
    ),
    "reimage command that is not a string": (
        _set("hosts", 0, "reimage", ["reset"]),
        "hosts[0] (gpu-ssh-1).reimage: must be a shell command of at most 1000 characters",
    ),
    "bad host key": (
        _set("hosts", 0, "host_key", "not a key"),
        'hosts[0] (gpu-ssh-1).host_key: must be "<key type> <base64 key>"',
    ),
    "no measurements at once": (
        _set("locations", 0, "measurements_at_once", 0),
        "locations[0] (us-east-2).measurements_at_once: must be a whole number from 1 to 1000, "
        "not 0",
    ),
    "measurements at once not a number": (
        _set("locations", 1, "measurements_at_once", "2"),
        "locations[1] (eu-north-1).measurements_at_once: must be a whole number from 1 to 1000, "
        'not "2"',
    ),
    "entry that is not an object": (
        _append("hosts", "use2-bm-004"),
        "hosts[3]: must be an object, not a string",
    ),
    "section that is not a list": (
        lambda data: data.update(gpu_models={"slug": "h100-sxm"}),
        "gpu_models: must be a list, not an object",
    ),
}


@pytest.mark.parametrize("change, message", BAD_FILES.values(), ids=BAD_FILES.keys())
def test_it_refuses_a_bad_file_and_changes_nothing(db, change, message):
    load_inventory(inventory())
    data = inventory()
    change(data)
    # Good changes beside the bad one: none of them may be written either.
    if isinstance(data["gpu_models"], list):
        data["gpu_models"].append({"slug": "b200", "name": "B200 180GB", "memory_gib": 180})
    data["locations"][1]["name"] = "Kajaani"
    data["hosts"].append({"machine_type": "eun1-l40sx1-ctr", "count": 4, "name_prefix": "zz-"})
    before = snapshot()

    with pytest.raises(InventoryError) as refused:
        load_inventory(data)

    assert any(error.startswith(message) for error in refused.value.errors), refused.value.errors
    assert snapshot() == before


def test_it_refuses_a_document_that_is_not_an_object(db):
    with pytest.raises(InventoryError) as refused:
        load_inventory([inventory()])

    assert refused.value.errors == [
        "the inventory must be a JSON object with the lists gpu_models, locations,"
        " machine_types, hosts, not a list"
    ]
    assert snapshot() == {"GpuModel": [], "Location": [], "MachineType": [], "Host": []}


def test_it_reports_every_problem_of_a_file_at_once(db):
    data = inventory()
    data["locations"][0]["country"] = "usa"
    data["machine_types"][0]["price_per_hour"] = "free"
    data["hosts"][1]["machine_type"] = "nowhere"

    with pytest.raises(InventoryError) as refused:
        load_inventory(data)

    fields = [error.split(":")[0] for error in refused.value.errors]
    # The hosts of the refused machine type are not reported again as pointing at nothing.
    assert fields == [
        "locations[0] (us-east-2).country",
        "machine_types[0] (use2-h100x8-bm).price_per_hour",
        "hosts[1] (drill-1).machine_type",
    ]
    assert GpuModel.objects.count() == 0


@pytest.mark.parametrize("state", [Host.State.RESERVED, Host.State.IN_USE, Host.State.CLEANING])
def test_it_refuses_to_move_a_held_host_to_another_machine_type(db, state):
    load_inventory(inventory())
    Host.objects.filter(name="drill-1").update(state=state)
    data = inventory()
    data["hosts"][1]["machine_type"] = "use2-h100x8-bm"
    before = snapshot()

    with pytest.raises(InventoryError) as refused:
        load_inventory(data)

    assert refused.value.errors == [
        f"hosts[1] (drill-1).machine_type: drill-1 ({state.replace('_', ' ')}) cannot move to"
        " another machine type or driver; a host moves only when it is free or offline"
    ]
    assert snapshot() == before


def test_it_refuses_to_change_the_gpu_of_a_machine_type_with_hosts_in_use(db):
    load_inventory(inventory())
    Host.objects.filter(name="use2-bm-002").update(state=Host.State.IN_USE)
    data = inventory()
    data["machine_types"][0]["gpu"] = "l40s"
    before = snapshot()

    with pytest.raises(InventoryError) as refused:
        load_inventory(data)

    assert refused.value.errors[0].startswith(
        "machine_types[0] (use2-h100x8-bm).gpu: cannot change while use2-bm-002 is reserved,"
        " in use or cleaning"
    )
    assert snapshot() == before


def test_it_changes_the_gpu_of_a_machine_type_whose_hosts_are_free(db):
    load_inventory(inventory())
    data = inventory()
    data["machine_types"][0]["gpu"] = "l40s"

    load_inventory(data)

    assert MachineType.objects.get(slug="use2-h100x8-bm").gpu.slug == "l40s"


# --- the command ------------------------------------------------------------------------------


def closed_port() -> int:
    """A port on 127.0.0.1 that nothing listens on: a connection there is refused at once."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def unreachable(data: dict) -> dict:
    """The inventory with its ssh host on 127.0.0.1 where nothing answers (the command reads
    every new ssh host for its baseline; a test never sends a packet elsewhere)."""
    data["hosts"][0].update(address="127.0.0.1", port=closed_port())
    return data


def test_the_command_prints_the_report(db, tmp_path):
    out = StringIO()

    call_command("load_inventory", str(write(tmp_path, unreachable(inventory()))), stdout=out)

    lines = out.getvalue().splitlines()
    assert " ".join(lines[0].split()) == (
        "GPU models: 2 created 0 updated 0 unchanged 0 not in the file (kept)"
    )
    assert lines[3].split()[:3] == ["Hosts:", "5", "created"]
    assert Host.objects.count() == 5


def test_the_command_checks_without_writing(db, tmp_path):
    out = StringIO()

    call_command("load_inventory", str(write(tmp_path, inventory())), "--check", stdout=out)

    assert out.getvalue().startswith("Checked only, nothing written (--check):")
    assert "5 created" in out.getvalue()
    assert snapshot() == {"GpuModel": [], "Location": [], "MachineType": [], "Host": []}


def test_the_command_lists_the_problems_of_a_bad_file(db, tmp_path):
    load_inventory(inventory())
    before = snapshot()
    data = inventory()
    data["machine_types"][0]["price_per_hour"] = "-1"
    data["hosts"][0]["fault"] = "boot"
    path = write(tmp_path, data)

    with pytest.raises(CommandError) as refused:
        call_command("load_inventory", str(path))

    assert str(refused.value) == (
        f"Refused {path}, nothing was loaded (2 problems):\n"
        "  - machine_types[0] (use2-h100x8-bm).price_per_hour: must be a positive amount with at"
        ' most 2 decimals, not "-1"\n'
        "  - hosts[0] (gpu-ssh-1).fault: only simulated hosts take a fault; this host's driver"
        ' is "ssh"'
    )
    assert snapshot() == before


def test_the_command_names_the_line_and_column_of_invalid_json(db, tmp_path):
    load_inventory(inventory())
    before = snapshot()
    text = json.dumps(inventory(), indent=2).replace('"memory_gib": 48', '"memory_gib": 48,', 1)
    path = write(tmp_path, text)
    line = text[: text.index('"memory_gib": 48,')].count("\n") + 2

    with pytest.raises(CommandError) as refused:
        call_command("load_inventory", str(path))

    assert f"  - line {line}, column 5: invalid JSON (Expecting property name" in str(refused.value)
    assert snapshot() == before


def test_the_command_refuses_a_key_given_twice_in_an_entry(db, tmp_path):
    text = json.dumps(inventory()).replace('"memory_gib": 48', '"memory_gib": 48, "memory_gib": 4')

    with pytest.raises(CommandError) as refused:
        call_command("load_inventory", str(write(tmp_path, text)))

    assert "gpu_models[1] (l40s).memory_gib: appears twice in this entry" in str(refused.value)
    assert GpuModel.objects.count() == 0


def test_the_command_refuses_nan(db, tmp_path):
    text = json.dumps(inventory()).replace('"memory_gib": 48', '"memory_gib": NaN')

    with pytest.raises(CommandError) as refused:
        call_command("load_inventory", str(write(tmp_path, text)))

    assert "invalid JSON (NaN is not a number JSON allows)" in str(refused.value)


def test_the_command_refuses_a_document_nested_past_pythons_stack(db, tmp_path):
    text = json.dumps(inventory())[:-1] + ', "notes": ' + "[" * 100_000 + "]" * 100_000 + "}"

    with pytest.raises(CommandError) as refused:
        call_command("load_inventory", str(write(tmp_path, text)))

    assert "the document nests objects and lists more than 32 levels deep" in str(refused.value)
    assert GpuModel.objects.count() == 0


def test_the_command_refuses_a_nul_anywhere_and_loads_nothing(db, tmp_path):
    data = inventory()
    data["locations"][0]["name"] = "Columbus\x00, Ohio"

    with pytest.raises(CommandError) as refused:
        call_command("load_inventory", str(write(tmp_path, data)))

    assert "locations[0].name holds the control character U+0000" in str(refused.value)
    assert snapshot() == {"GpuModel": [], "Location": [], "MachineType": [], "Host": []}


def test_it_refuses_a_price_too_long_for_decimal_arithmetic(db):
    data = inventory()
    data["machine_types"][0]["price_per_hour"] = "9" * 40 + ".5"

    with pytest.raises(InventoryError) as refused:
        load_inventory(data)

    [error] = refused.value.errors
    assert error.startswith("machine_types[0] (use2-h100x8-bm).price_per_hour: must be below")


def test_the_command_says_when_the_file_is_missing(db, tmp_path):
    with pytest.raises(CommandError) as refused:
        call_command("load_inventory", str(tmp_path / "nowhere.json"))

    assert str(refused.value) == (
        f"Refused {tmp_path / 'nowhere.json'}, nothing was loaded (1 problem):\n  - no such file"
    )


# --- the demo inventory -----------------------------------------------------------------------


def test_the_demo_inventory_loads(db):
    report = load_inventory(read_inventory_file(DEMO_INVENTORY))

    assert report.hosts.created == Host.objects.count() >= 200
    assert set(MachineType.objects.values_list("machine_kind", flat=True)) == {
        "vm",
        "bare_metal",
        "container",
    }
    assert set(Location.objects.values_list("capacity_reporting", flat=True)) == {
        "count",
        "boolean",
    }
    assert Location.objects.exclude(ssh_gateway="").exists()
    assert Location.objects.filter(ssh_gateway="").exists()
    assert MachineType.objects.filter(community=True, gpu__slug="rtx-4090").exists()
    assert MachineType.objects.filter(interconnect="infiniband").exists()
    assert set(MachineType.objects.values_list("gpus_per_machine", flat=True)) == {1, 2, 4, 8}
    assert {"h100-sxm", "h200", "a100-sxm", "l40s", "rtx-4090"} <= set(
        GpuModel.objects.values_list("slug", flat=True)
    )


def test_the_demo_inventory_keeps_its_faults_in_the_drill_location(db):
    load_inventory(read_inventory_file(DEMO_INVENTORY))

    faulty = Host.objects.exclude(fault="")
    assert faulty.exists()
    assert set(faulty.values_list("machine_type__location__code", flat=True)) == {"drill-1"}
    assert "fails on purpose" in Location.objects.get(code="drill-1").name


@pytest.mark.parametrize("gpu", ["h100-sxm", "h200", "a100-sxm", "l40s", "rtx-4090"])
def test_the_demo_inventory_offers_every_main_gpu_at_every_size(db, gpu):
    load_inventory(read_inventory_file(DEMO_INVENTORY))
    model = GpuModel.objects.get(slug=gpu)

    def available(nodes):
        offers = list_offers(gpu=model, nodes=nodes, include_community=True)
        return [o for o in offers if o.availability is Availability.AVAILABLE]

    assert len(available(2)) >= 3
    assert len(available(16)) >= 1
    assert len(available(32)) >= 1
    assert len(available(64)) >= 1


def test_the_demo_inventory_prices_per_gpu_like_todays_market(db):
    load_inventory(read_inventory_file(DEMO_INVENTORY))
    per_gpu = {
        "h100-sxm": (Decimal("2.00"), Decimal("3.50")),
        "h200": (Decimal("3.00"), Decimal("4.00")),
        "a100-sxm": (Decimal("1.20"), Decimal("1.80")),
        "l40s": (Decimal("0.75"), Decimal("1.05")),
        "rtx-4090": (Decimal("0.35"), Decimal("0.60")),
    }
    for machine_type in MachineType.objects.select_related("gpu"):
        if machine_type.gpu.slug in per_gpu:
            low, high = per_gpu[machine_type.gpu.slug]
            price = machine_type.price_per_hour / machine_type.gpus_per_machine
            assert low <= price <= high, machine_type.slug


def test_a_copy_of_the_good_file_is_not_changed_by_loading(db):
    data = inventory()
    original = copy.deepcopy(data)

    load_inventory(data)

    assert data == original


def test_it_leaves_a_host_factory_row_alone_when_not_in_the_file(db):
    outsider = HostFactory(name="handmade-1", state=Host.State.RESERVED)

    load_inventory(inventory())

    outsider.refresh_from_db()
    assert outsider.state == Host.State.RESERVED


def test_it_loads_a_locations_storage_host_for_volumes(db):
    data = inventory()
    data["locations"][0] |= {
        "storage_host": "store.use2.example:2222",
        "storage_host_key": f"{HOST_KEY} root@store",
        "storage_path": "/data/volumes",
    }
    load_inventory(data)
    location = Location.objects.get(code="us-east-2")
    assert (location.storage_host, location.storage_host_key, location.storage_path) == (
        "store.use2.example:2222",
        HOST_KEY,  # the comment dropped
        "/data/volumes",
    )
    # Without one, volumes are not synced anywhere (the simulated data center).
    assert Location.objects.get(code=data["locations"][1]["code"]).storage_host == ""


def test_it_loads_a_locations_and_a_hosts_reimage_command_and_the_host_wins(db):
    data = inventory()
    data["locations"][0]["reimage"] = '/opt/ops/rebuild --host "$RUNCRATE_HOST_NAME"'
    data["hosts"][0]["reimage"] = "bmc-reimage $RUNCRATE_HOST_ADDRESS"
    load_inventory(data)

    own = Host.objects.select_related("machine_type__location").get(name="gpu-ssh-1")
    assert own.reimage_command == "bmc-reimage $RUNCRATE_HOST_ADDRESS"
    grouped = Host.objects.select_related("machine_type__location").get(name="use2-bm-001")
    assert grouped.reimage_command == '/opt/ops/rebuild --host "$RUNCRATE_HOST_NAME"'


def test_the_command_records_no_baseline_it_cannot_read_and_says_why(db, tmp_path):
    out = StringIO()
    data = unreachable(inventory())
    port = data["hosts"][0]["port"]

    call_command("load_inventory", str(write(tmp_path, data)), stdout=out)

    [line] = [line for line in out.getvalue().splitlines() if line.startswith("gpu-ssh-1:")]
    assert line == (
        f"gpu-ssh-1: no baseline recorded: could not connect to 127.0.0.1:{port}: connection "
        "refused; offered to no one until it is recorded "
        "(manage.py record_baselines, or the host admin's Record baseline)"
    )
    assert Host.objects.get(name="gpu-ssh-1").baseline_at is None
    # The file itself was loaded: a host that cannot be read yet refuses nothing else.
    assert Host.objects.count() == 5


def test_the_command_without_baselines_names_each_ssh_host_waiting_for_one(db, tmp_path):
    out = StringIO()

    # --no-baselines connects nowhere: the host's address is the file's own (TEST-NET-3).
    call_command("load_inventory", str(write(tmp_path, inventory())), "--no-baselines", stdout=out)

    waiting = [line for line in out.getvalue().splitlines() if line.startswith("gpu-ssh-1:")]
    assert waiting == [
        "gpu-ssh-1: waiting for a baseline, offered to no one until it is recorded "
        "(manage.py record_baselines, or the host admin's Record baseline)"
    ]
