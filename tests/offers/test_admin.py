"""Django admin for the catalog, the hosts and quote requests (staff only)."""

import datetime

import pytest
from django.urls import reverse

from accounts.models import User
from clusters.models import Event
from offers.inventory import return_hosts_to_service, take_hosts_offline
from offers.models import Host, Location, MachineType, QuoteRequest
from tests.factories import (
    ClusterFactory,
    GpuModelFactory,
    HostFactory,
    LocationFactory,
    MachineTypeFactory,
    ProjectFactory,
)


@pytest.fixture
def staff_client(client, db):
    # No password: hashing one costs more than everything else these tests do.
    client.force_login(User.objects.create_superuser("staff@example.com", password=None))
    return client


def _quote(machine_type: MachineType, **fields) -> QuoteRequest:
    return QuoteRequest.objects.create(
        project=fields.pop("project", None) or ProjectFactory(),
        gpu=machine_type.gpu,
        location=machine_type.location,
        nodes=16,
        interconnect="infiniband",
        start_date=datetime.date(2027, 1, 4),
        duration_weeks=4,
        contact_name="Ada",
        contact_email="ada@example.com",
        **fields,
    )


def _hosts(count: int, machine_type: MachineType, state: str = Host.State.FREE) -> list[Host]:
    return [HostFactory(machine_type=machine_type, state=state) for _ in range(count)]


@pytest.mark.parametrize("name", ["gpumodel", "location", "machinetype", "host", "quoterequest"])
def test_it_lists_each_model_in_a_constant_number_of_queries(
    staff_client, django_assert_max_num_queries, name
):
    def fill(count: int) -> None:
        for _ in range(count):
            machine_type = MachineTypeFactory()
            _hosts(2, machine_type)
            _quote(machine_type)

    url = reverse(f"admin:offers_{name}_changelist")
    fill(2)
    with django_assert_max_num_queries(40) as few:
        assert staff_client.get(url).status_code == 200
    fill(10)
    with django_assert_max_num_queries(len(few.captured_queries)):
        assert staff_client.get(url).status_code == 200


def test_it_shows_free_and_total_hosts_per_machine_type(staff_client):
    machine_type = MachineTypeFactory(slug="use2-h100x8-bm")
    _hosts(3, machine_type)
    _hosts(2, machine_type, state=Host.State.IN_USE)

    response = staff_client.get(reverse("admin:offers_machinetype_changelist"))

    row = response.context["cl"].result_list.get(pk=machine_type.pk)
    assert (row.free_hosts, row.host_count) == (3, 5)


def test_it_takes_only_free_hosts_offline(db):
    free, reserved = HostFactory(), HostFactory(state=Host.State.RESERVED)

    assert take_hosts_offline(host_ids=[free.pk, reserved.pk]) == 1

    free.refresh_from_db()
    reserved.refresh_from_db()
    assert (free.state, reserved.state) == (Host.State.OFFLINE, Host.State.RESERVED)


def test_it_returns_only_offline_hosts_to_service(db):
    offline, cleaning = (
        HostFactory(state=Host.State.OFFLINE),
        HostFactory(state=Host.State.CLEANING),
    )

    assert return_hosts_to_service(host_ids=[offline.pk, cleaning.pk]) == 1

    offline.refresh_from_db()
    cleaning.refresh_from_db()
    assert (offline.state, cleaning.state) == (Host.State.FREE, Host.State.CLEANING)


@pytest.mark.parametrize("state", [Host.State.OFFLINE, Host.State.DIRTY])
def test_an_ssh_host_goes_back_to_service_only_once_verified(db, state):
    """S3: an offline host is exactly one that could not be wiped; a dirty one served a tenant."""
    host = HostFactory(
        driver="ssh", address="203.0.113.7", host_key="ssh-ed25519 AAAA", state=state
    )

    assert return_hosts_to_service(host_ids=[host.pk]) == 0
    host.refresh_from_db()
    assert host.state == state

    assert return_hosts_to_service(host_ids=[host.pk], verified=[host.pk]) == 1
    host.refresh_from_db()
    assert host.state == Host.State.FREE


def test_the_admin_actions_say_what_they_left_alone(staff_client):
    free, in_use = HostFactory(), HostFactory(state=Host.State.IN_USE)

    response = staff_client.post(
        reverse("admin:offers_host_changelist"),
        {"action": "mark_offline", "_selected_action": [free.pk, in_use.pk]},
        follow=True,
    )

    messages = [str(m) for m in response.context["messages"]]
    assert messages == ["1 host taken offline.", "1 left as they were: they were not free."]
    in_use.refresh_from_db()
    assert in_use.state == Host.State.IN_USE


def test_the_host_form_refuses_a_fault_on_an_ssh_host(staff_client):
    host = HostFactory()
    url = reverse("admin:offers_host_change", args=[host.pk])

    response = staff_client.post(
        url,
        {
            "name": host.name,
            "machine_type": host.machine_type.pk,
            "driver": "ssh",
            "address": "",
            "port": 22,
            "user": "root",
            "host_key": "",
            "fault": "boot",
        },
    )

    assert response.status_code == 200
    errors = response.context["adminform"].form.errors
    assert errors["fault"] == ['Only simulated hosts take a fault; this host\'s driver is "ssh".']
    assert errors["address"] == ["This field is required for the ssh driver."]
    host.refresh_from_db()
    assert (host.driver, host.fault) == ("simulated", "")


def test_the_host_form_checks_the_ssh_fields_like_the_file(staff_client):
    host = HostFactory()

    response = staff_client.post(
        reverse("admin:offers_host_change", args=[host.pk]),
        {
            "name": host.name,
            "machine_type": host.machine_type.pk,
            "driver": "ssh",
            "address": "not an address",
            "port": 22,
            "user": "Root User",
            "host_key": "AAAA-not-a-key",
            "fault": "",
        },
    )

    errors = response.context["adminform"].form.errors
    assert errors["address"] == ["Must be a host name or an IP address."]
    assert errors["user"] == ["Must be a Unix user name (lowercase, at most 32 characters)."]
    assert errors["host_key"] == ['Must be "<key type> <base64 key>", e.g. "ssh-ed25519 AAAAC3…".']
    host.refresh_from_db()
    assert host.driver == "simulated"


def test_the_host_form_keeps_a_held_host_on_its_machine_type(staff_client):
    host = HostFactory(state=Host.State.IN_USE)
    other = MachineTypeFactory()

    response = staff_client.post(
        reverse("admin:offers_host_change", args=[host.pk]),
        {
            "name": host.name,
            "machine_type": other.pk,
            "driver": "simulated",
            "address": "",
            "port": 22,
            "user": "root",
            "host_key": "",
            "fault": "",
        },
    )

    errors = response.context["adminform"].form.errors
    assert errors["machine_type"] == [
        "The host is in use: it keeps its machine type until it is free or offline."
    ]
    host.refresh_from_db()
    assert host.machine_type_id != other.pk


def test_staff_change_a_quote_requests_status_from_the_list(staff_client):
    quote = _quote(MachineTypeFactory())

    response = staff_client.post(
        reverse("admin:offers_quoterequest_changelist"),
        {"action": "mark_won", "_selected_action": [quote.pk]},
        follow=True,
    )

    assert response.status_code == 200
    quote.refresh_from_db()
    assert quote.status == QuoteRequest.Status.WON


def test_the_location_form_checks_the_gateway_like_the_file(staff_client):
    response = staff_client.post(
        reverse("admin:offers_location_add"),
        {
            "code": "us-east-9",
            "name": "Somewhere",
            "country": "US",
            "capacity_reporting": "count",
            "ssh_gateway": "gw.example.net:0",
            "volume_price_per_gb_month": "0.10",
        },
    )

    errors = response.context["adminform"].form.errors
    assert errors["ssh_gateway"] == ['Must be empty or "host:port" with a port from 1 to 65535.']
    assert not Location.objects.filter(code="us-east-9").exists()


def test_the_location_form_takes_measurements_at_once_from_one_up_or_none(staff_client):
    fields = {
        "code": "us-east-9",
        "name": "Somewhere",
        "country": "US",
        "capacity_reporting": "count",
        "ssh_gateway": "",
        "volume_price_per_gb_month": "0.10",
    }
    response = staff_client.post(
        reverse("admin:offers_location_add"), fields | {"measurements_at_once": "0"}
    )
    errors = response.context["adminform"].form.errors
    assert errors["measurements_at_once"] == ["Ensure this value is greater than or equal to 1."]
    assert not Location.objects.filter(code="us-east-9").exists()

    response = staff_client.post(
        reverse("admin:offers_location_add"), fields | {"measurements_at_once": "2"}
    )
    assert response.status_code == 302
    assert Location.objects.get(code="us-east-9").measurements_at_once == 2
    # Left empty: every pair of a round at once.
    location = Location.objects.get(code="us-east-9")
    fields |= {"code": "us-east-9", "measurements_at_once": ""}
    response = staff_client.post(
        reverse("admin:offers_location_change", args=[location.pk]), fields
    )
    assert response.status_code == 302
    location.refresh_from_db()
    assert location.measurements_at_once is None


def test_staff_see_the_key_a_host_offered_instead_of_its_pinned_one(staff_client):
    host = HostFactory(driver="ssh", address="203.0.113.7", host_key="ssh-ed25519 AAAA")
    cluster = ClusterFactory(machines=True)
    node = cluster.nodes.first()
    node.host = host
    node.save()
    Event.objects.create(
        cluster=cluster,
        node=node,
        reason="host_key_mismatch",
        message="gpu-7 offered host key SHA256:abc, not the pinned SHA256:def.",
        output="offered: ssh-ed25519 AAAAoffered<script>",
    )

    page = staff_client.get(reverse("admin:offers_host_change", args=[host.pk])).content.decode()
    assert "What went wrong lately" in page
    assert "offered: ssh-ed25519 AAAAoffered&lt;script&gt;" in page  # escaped, never markup
    assert "<code>host_key_mismatch</code>: gpu-7 offered host key SHA256:abc" in page
    quiet = HostFactory()
    assert (
        "Nothing."
        in staff_client.get(reverse("admin:offers_host_change", args=[quiet.pk])).content.decode()
    )


def _machine_type_form(machine_type: MachineType, **changes) -> dict:
    from django.forms.models import model_to_dict

    data = {**model_to_dict(machine_type), **changes}
    # An unticked checkbox is not sent at all.
    return {name: value for name, value in data.items() if value is not None and value is not False}


@pytest.mark.parametrize(
    ("field", "value"),
    [
        ("gpus_per_machine", 4),
        ("machine_kind", "container"),
        ("gpu", lambda: GpuModelFactory(slug="l40s", name="L40S 48GB").pk),
        ("location", lambda: LocationFactory().pk),
    ],
)
def test_the_machine_type_form_keeps_what_serving_hosts_depend_on(staff_client, field, value):
    machine_type = MachineTypeFactory(gpus_per_machine=8, machine_kind="vm")
    _hosts(1, machine_type, state=Host.State.IN_USE)
    if callable(value):
        value = value()
    before = MachineType.objects.filter(pk=machine_type.pk).values().get()

    response = staff_client.post(
        reverse("admin:offers_machinetype_change", args=[machine_type.pk]),
        _machine_type_form(machine_type, **{field: value}),
    )

    assert response.status_code == 200
    [error] = response.context["adminform"].form.errors[field]
    assert "cannot change while" in error and "is reserved, in use or cleaning" in error
    assert MachineType.objects.filter(pk=machine_type.pk).values().get() == before


def test_the_machine_type_form_changes_the_price_of_serving_hosts_and_all_of_a_free_type(
    staff_client,
):
    serving = MachineTypeFactory(gpus_per_machine=8)
    _hosts(1, serving, state=Host.State.RESERVED)
    idle = MachineTypeFactory(gpus_per_machine=8)
    _hosts(2, idle)

    priced = staff_client.post(
        reverse("admin:offers_machinetype_change", args=[serving.pk]),
        _machine_type_form(serving, price_per_hour="9.99"),
    )
    resized = staff_client.post(
        reverse("admin:offers_machinetype_change", args=[idle.pk]),
        _machine_type_form(idle, gpus_per_machine=4),
    )

    assert priced.status_code == resized.status_code == 302
    serving.refresh_from_db()
    idle.refresh_from_db()
    assert str(serving.price_per_hour) == "9.99"
    assert idle.gpus_per_machine == 4


def test_load_inventory_and_the_admin_refuse_with_one_rule(db):
    from offers.inventory import why_fixed_while_serving

    machine_type = MachineTypeFactory()
    [host] = _hosts(1, machine_type, state=Host.State.CLEANING)

    assert why_fixed_while_serving(machine_type).startswith(f"cannot change while {host.name}")
    Host.objects.filter(pk=host.pk).update(state=Host.State.OFFLINE)
    assert why_fixed_while_serving(machine_type) == ""


def test_it_lists_the_track_records_read_only(staff_client):
    from datetime import UTC, datetime

    from offers.models import TrackRecord

    machine_type = MachineTypeFactory(slug="use2-h100x8-bm")
    record = TrackRecord.objects.create(
        machine_type=machine_type,
        clusters=12,
        started=11,
        ready_median_seconds=640,
        failures_by_step={"agent": 1},
        computed_at=datetime(2026, 6, 30, tzinfo=UTC),
    )

    listing = staff_client.get(reverse("admin:offers_trackrecord_changelist"))
    change = staff_client.get(reverse("admin:offers_trackrecord_change", args=[record.pk]))
    delete = staff_client.post(
        reverse("admin:offers_trackrecord_delete", args=[record.pk]), {"post": "yes"}
    )

    assert listing.status_code == 200
    assert "use2-h100x8-bm" in listing.content.decode()
    assert "Save" not in change.content.decode()
    assert delete.status_code == 403
    assert TrackRecord.objects.filter(pk=record.pk).exists()


def test_the_hosts_list_shows_the_ssh_hosts_waiting_for_a_baseline(staff_client):
    from django.utils import timezone

    waiting = HostFactory(name="gpu-waiting", driver=Host.Driver.SSH)
    HostFactory(name="gpu-recorded", driver=Host.Driver.SSH, baseline_at=timezone.now())
    HostFactory(name="sim-host")

    listing = staff_client.get(reverse("admin:offers_host_changelist"), {"baseline": "waiting"})

    assert [h.name for h in listing.context["cl"].result_list] == [waiting.name]
    assert "waiting: not offered" in listing.content.decode()
