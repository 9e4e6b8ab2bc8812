"""A machine type's specs (docs/inventory.md, "Machine specs"): vCPUs, memory, local NVMe, the
GPU link inside the machine, the OS image, the driver and CUDA versions. Loaded and checked by
the inventory file and the admin form alike, worded once (`MachineSpecs`)."""

import pytest
from django.urls import reverse

from accounts.models import User
from offers.inventory import DEMO_INVENTORY, InventoryError, load_inventory, read_inventory_file
from offers.models import MachineSpecs, MachineType, size_words
from tests.factories import MachineTypeFactory

SPECS = {
    "vcpus": 208,
    "memory_gib": 1800,
    "nvme_gib": 2048,
    "gpu_link": "nvlink",
    "os_image": "Ubuntu 22.04",
    "driver_version": "570",
    "cuda_version": "12.8",
}
WORDS = "208 vCPUs · 1.8 TiB RAM · 2 TiB NVMe · NVLink · Ubuntu 22.04 · driver 570 · CUDA 12.8"


def document(**specs) -> dict:
    return {
        "gpu_models": [{"slug": "h100-sxm", "name": "H100 SXM 80GB", "memory_gib": 80}],
        "locations": [
            {
                "code": "us-east-2",
                "name": "Columbus",
                "country": "US",
                "capacity_reporting": "count",
            }
        ],
        "machine_types": [
            {
                "slug": "use2-h100x8-bm",
                "location": "us-east-2",
                "gpu": "h100-sxm",
                "gpus_per_machine": 8,
                "machine_kind": "bare_metal",
                "price_per_hour": "23.92",
                **specs,
            }
        ],
    }


def test_it_loads_every_spec_and_words_them_as_a_gpu_cloud_does(db):
    load_inventory(document(**SPECS))

    machine_type = MachineType.objects.get(slug="use2-h100x8-bm")
    assert {name: getattr(machine_type, name) for name in SPECS} == SPECS
    assert machine_type.specs.summary == WORDS
    assert machine_type.specs.as_dict() == {**SPECS, "summary": WORDS}


def test_a_spec_left_out_or_null_is_not_stated_and_not_shown(db):
    load_inventory(document(vcpus=None, gpu_link=None, cuda_version="12.8"))

    specs = MachineType.objects.get(slug="use2-h100x8-bm").specs
    assert specs == MachineSpecs(cuda_version="12.8")
    assert specs.summary == "CUDA 12.8"
    assert specs.as_dict()["vcpus"] is None and specs.as_dict()["gpu_link"] is None


def test_a_reload_without_the_specs_clears_them(db):
    load_inventory(document(**SPECS))

    report = load_inventory(document())

    assert report.machine_types.updated == 1
    assert MachineType.objects.get(slug="use2-h100x8-bm").specs.summary == ""


BAD = {
    "vcpus": (0, "must be a whole number from 1 to 4096, not 0"),
    "memory_gib": ("1.8 TiB", 'must be a whole number from 1 to 65536, not "1.8 TiB"'),
    "nvme_gib": (-1, "must be a whole number from 0 to 1048576, not -1"),
    "gpu_link": ("infinity-fabric", 'must be "nvlink", "nvswitch" or "pcie", not'),
    "os_image": ("Ubuntu; rm -rf /", "must name the OS image in at most 60 letters"),
    "driver_version": ("latest", "must be an NVIDIA driver version as nvidia-smi prints it"),
    "cuda_version": (12.8, 'must be a CUDA version like "12.8" (major.minor, as a string), not'),
}


@pytest.mark.parametrize(("key", "bad"), BAD.items(), ids=BAD.keys())
def test_it_refuses_a_bad_spec_naming_the_entry_and_field_and_loads_nothing(db, key, bad):
    value, problem = bad

    with pytest.raises(InventoryError) as refused:
        load_inventory(document(**{**SPECS, key: value}))

    [error] = refused.value.errors
    assert error.startswith(f"machine_types[0] (use2-h100x8-bm).{key}: {problem}"), error
    assert not MachineType.objects.exists()


@pytest.mark.parametrize(
    ("gib", "words"),
    [(512, "512 GiB"), (1023, "1023 GiB"), (1024, "1 TiB"), (1800, "1.8 TiB"), (2048, "2 TiB"),
     (2900, "2.8 TiB"), (28672, "28 TiB")],
)  # fmt: skip
def test_sizes_read_in_gib_then_tib(gib, words):
    assert size_words(gib) == words


def test_words_leave_out_what_is_not_stated_and_say_no_nvme():
    assert MachineSpecs(vcpus=1, nvme_gib=0, gpu_link="pcie").words() == [
        "1 vCPU",
        "no local NVMe",
        "PCIe",
    ]
    assert MachineSpecs().summary == ""


# --- the demo --------------------------------------------------------------------------------


def test_every_demo_machine_type_states_every_spec(db):
    load_inventory(read_inventory_file(DEMO_INVENTORY))

    for machine_type in MachineType.objects.select_related("gpu"):
        specs = machine_type.specs
        link_optional = machine_type.gpus_per_machine == 1  # one GPU has no link to another
        missing = [
            name
            for name, value in specs.as_dict().items()
            if value in (None, "") and not (name == "gpu_link" and link_optional)
        ]
        assert missing == [], machine_type.slug
        if "sxm" in machine_type.gpu.slug and not link_optional:
            assert specs.gpu_link in ("nvlink", "nvswitch"), machine_type.slug
        if machine_type.gpu.slug in ("l40s", "rtx-6000-ada", "rtx-4090") and not link_optional:
            assert specs.gpu_link == "pcie", machine_type.slug
    h100 = MachineType.objects.get(slug="use2-h100x8-bm").specs
    assert (h100.vcpus, h100.memory_gib, h100.gpu_link) == (208, 1800, "nvswitch")


# --- admin -----------------------------------------------------------------------------------


@pytest.fixture
def staff_client(client, db):
    client.force_login(User.objects.create_superuser("staff@example.com", password=None))
    return client


def _form(machine_type: MachineType, **changes) -> dict:
    fields = {
        "slug": machine_type.slug,
        "location": machine_type.location_id,
        "gpu": machine_type.gpu_id,
        "gpus_per_machine": machine_type.gpus_per_machine,
        "machine_kind": machine_type.machine_kind,
        "interconnect": machine_type.interconnect,
        "price_per_hour": machine_type.price_per_hour,
        "boot_seconds": machine_type.boot_seconds,
        "link_mbit": "",
        **{name: "" for name in SPECS},
    }
    return fields | changes


def test_the_admin_form_checks_the_specs_like_the_file(staff_client):
    machine_type = MachineTypeFactory()
    url = reverse("admin:offers_machinetype_change", args=[machine_type.pk])

    response = staff_client.post(
        url,
        _form(
            machine_type,
            vcpus="0",
            driver_version="latest",
            cuda_version="12",
            os_image="Ubuntu; rm -rf /",
            gpu_link="infinity",
        ),
    )

    assert response.status_code == 200
    errors = response.context["adminform"].form.errors
    assert errors["driver_version"] == [
        'Must be an NVIDIA driver version as nvidia-smi prints it, like "570" or "570.124.06".'
    ]
    assert errors["cuda_version"] == [
        'Must be a CUDA version like "12.8" (major.minor, as a string).'
    ]
    assert errors["os_image"][0].startswith("Must name the OS image in at most 60 letters")
    assert "vcpus" in errors and "gpu_link" in errors
    machine_type.refresh_from_db()
    assert machine_type.specs == MachineSpecs()


def test_staff_state_the_specs_in_admin_and_see_them_in_the_list(staff_client):
    machine_type = MachineTypeFactory()
    url = reverse("admin:offers_machinetype_change", args=[machine_type.pk])

    response = staff_client.post(url, _form(machine_type, **SPECS))

    assert response.status_code == 302, response.context["adminform"].form.errors
    machine_type.refresh_from_db()
    assert machine_type.specs.summary == WORDS
    listing = staff_client.get(reverse("admin:offers_machinetype_changelist"))
    assert WORDS in listing.content.decode()
