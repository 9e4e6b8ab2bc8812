"""The GPU figures on the create form, and a failed cluster's alternatives: the same machine
shape first, and a plain word when an alternative's machines differ (issue 13, item 1)."""

import re
from decimal import Decimal

from django.utils import timezone

from clusters.models import Cluster, Event, Node
from offers.models import MachineType, TrackRecord
from tests.clusters.front import credit, machine_type_with_hosts
from tests.factories import ClusterFactory, GpuModelFactory, LocationFactory


def text_of(html: str) -> str:
    return " ".join(re.sub(r"<[^>]+>", " ", html).split()).replace("&#x27;", "'")


def alternative_rows(html: str) -> list[str]:
    section = html[html.index('<section class="offers-now">') :]
    section = section[: section.index("</section>")]
    return re.findall(r'<tr data-offer="([^"]+)"', section)


def row_of(html: str, slug: str) -> str:
    match = re.search(rf'<tr data-offer="{re.escape(slug)}".*?</tr>', html, re.S)
    assert match, f"no row for {slug}"
    return text_of(match.group(0))


def test_it_shows_the_gpus_memory_and_price_per_gpu_hour_on_the_create_form(owner):
    credit(owner.project)
    gpu = GpuModelFactory(slug="h100-sxm", name="H100 SXM 80GB", memory_gib=80)
    machine_type_with_hosts(free=4, gpu=gpu, slug="h100x8", price_per_hour=Decimal("20.00"))
    client = owner.browser_client()

    page = text_of(client.get("/clusters/new/?offer=h100x8&nodes=3").content.decode())
    summary = client.get(
        "/clusters/new/?offer=h100x8&nodes=2", headers={"HX-Request": "true"}
    ).content.decode()

    assert "24 GPUs · 1,920 GiB GPU memory · $2.50 per GPU-hour" in page
    assert "8× H100 SXM 80GB 80 GiB each" in page
    assert "16 GPUs · 1,280 GiB GPU memory · $2.50 per GPU-hour" in text_of(summary)


def test_it_offers_the_same_machine_shape_first_and_says_when_one_differs(owner):
    gpu = GpuModelFactory(slug="h100-sxm", name="H100 SXM 80GB", memory_gib=80)
    failed_type = machine_type_with_hosts(
        free=0, gpu=gpu, slug="gone", gpus_per_machine=8, machine_kind="bare_metal"
    )
    # Cheapest first by cluster price, but only the last has the failed cluster's shape.
    machine_type_with_hosts(
        free=3,
        gpu=gpu,
        slug="four-vm",
        gpus_per_machine=4,
        machine_kind="vm",
        price_per_hour=Decimal("9.00"),
        location=LocationFactory(code="aa-1"),
    )
    machine_type_with_hosts(
        free=3,
        gpu=gpu,
        slug="eight-vm",
        gpus_per_machine=8,
        machine_kind="vm",
        price_per_hour=Decimal("18.00"),
        location=LocationFactory(code="bb-2"),
    )
    machine_type_with_hosts(
        free=3,
        gpu=gpu,
        slug="eight-bm",
        gpus_per_machine=8,
        machine_kind="bare_metal",
        price_per_hour=Decimal("24.00"),
        location=LocationFactory(code="cc-3", name="Dublin"),
    )
    cluster = ClusterFactory(
        project=owner.project,
        machine_type=failed_type,
        size=3,
        status=Cluster.Status.FAILED,
        failure_reason=Event.Reason.BOOT_TIMEOUT,
        failure_node="node-0",
        failure_step=Node.Step.RUNNING,
        failure_message="node-0 did not come up.",
    )

    TrackRecord.objects.create(
        machine_type=MachineType.objects.get(slug="eight-bm"),
        clusters=40,
        started=39,
        ready_median_seconds=660,
        computed_at=timezone.now(),
    )

    html = owner.browser_client().get(f"/clusters/{cluster.pk}/").content.decode()

    assert alternative_rows(html) == ["eight-bm", "eight-vm", "four-vm"]
    assert "ready in about 11 min · 97% started" in row_of(html, "eight-bm")
    assert "no track record yet" in row_of(html, "eight-vm")
    same = row_of(html, "eight-bm")
    assert "Same machines as this cluster" in same
    assert "24 GPUs in all · 1,920 GiB GPU memory" in same
    assert "$72.00" in same and "$3.00 per GPU-hour" in same
    assert "Different machines: virtual machine, not bare metal" in row_of(html, "eight-vm")
    four = row_of(html, "four-vm")
    assert "Different machines: 4 GPUs per machine, not 8; virtual machine, not bare metal" in four
    assert "12 GPUs in all · 960 GiB GPU memory" in four
    assert "$2.25 per GPU-hour" in four


def test_the_create_form_shows_the_offers_track_record_beside_its_estimate(
    owner, settings, django_assert_num_queries
):
    settings.RUNCRATE_TRACK_RECORD_MIN_CLUSTERS = 5
    credit(owner.project)
    machine_type = machine_type_with_hosts(free=4, slug="h100x8")
    client = owner.browser_client()
    record = TrackRecord.objects.create(
        machine_type=machine_type,
        clusters=4,
        started=3,
        ready_median_seconds=610,
        ready_p95_seconds=1290,
        failures_by_step={"boot": 1},
        computed_at=timezone.now(),
    )

    below = text_of(client.get("/clusters/new/?offer=h100x8&nodes=2").content.decode())
    assert "In the last 30 days here" not in below  # 4 clusters: under the minimum

    record.clusters, record.started = 40, 38
    record.save()
    with django_assert_num_queries(11) as counted:
        page = text_of(client.get("/clusters/new/?offer=h100x8&nodes=2").content.decode())
    offer_queries = [q["sql"] for q in counted.captured_queries if "offers_trackrecord" in q["sql"]]
    assert len(offer_queries) == 1 and "offers_machinetype" in offer_queries[0]  # one join
    assert (
        "In the last 30 days here, 38 of 40 clusters started (95%), half of them ready within "
        "10 min and 95% within 22 min." in page
    )
