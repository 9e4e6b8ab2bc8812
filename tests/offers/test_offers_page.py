"""The offer picker page (SPEC §1): GPU cards, size, community hosts, the offers table."""

import re

import pytest

from offers.models import Location, MachineType
from offers.offers import ETHERNET_NOT_BUILT_FOR, ETHERNET_SUITS
from tests.factories import GpuModelFactory, HostFactory, MachineTypeFactory
from tests.offers.catalog import add_hosts, cell, offer_row, offer_rows, offer_type, text

BOOLEAN = Location.CapacityReporting.BOOLEAN
PICKER = "/offers/"


def get(person, query: str = "", **headers) -> str:
    response = person.browser_client().get(f"{PICKER}?{query}", headers=headers)
    assert response.status_code == 200
    return response.content.decode()


# --- SPEC §1's table -----------------------------------------------------------------------


def test_it_sells_a_count_location_up_to_its_free_machines(owner, h100):
    offer_type(gpu=h100, slug="use2-vm", free=5, busy=3)

    html = get(owner, "gpu=h100-sxm&nodes=5")

    assert offer_rows(html) == [("use2-vm", "available")]
    row = offer_row(html, "use2-vm")
    assert '<span class="free-count">5</span>' in row
    assert 'href="/clusters/new/?offer=use2-vm&amp;nodes=5"' in row


def test_it_reads_not_in_stock_above_a_count_locations_free_machines(owner, h100):
    offer_type(gpu=h100, slug="use2-vm", free=5, busy=3)

    html = get(owner, "gpu=h100-sxm&nodes=6")

    assert offer_rows(html) == [("use2-vm", "not_in_stock")]
    row = offer_row(html, "use2-vm")
    assert "Not in stock" in row
    assert "/clusters/new/" not in row
    assert "Cannot take 6 machines now" in html


def test_it_caps_a_count_location_at_64_machines(owner, h100):
    offer_type(gpu=h100, slug="use2-vm", free=70)

    assert offer_rows(get(owner, "gpu=h100-sxm&nodes=64")) == [("use2-vm", "available")]
    # 65 is past every self-serve size: the page refuses the size itself.
    assert "A self-serve cluster has 2 to 64 machines" in get(owner, "gpu=h100-sxm&nodes=65")


def test_it_sells_a_boolean_location_with_machines_up_to_8(owner, h100):
    offer_type(gpu=h100, slug="usw1-bm", location="us-west-1", reporting=BOOLEAN, free=2)

    html = get(owner, "gpu=h100-sxm&nodes=8")

    assert offer_rows(html) == [("usw1-bm", "available")]
    row = offer_row(html, "usw1-bm")
    assert '<span class="avail">available</span>' in row
    assert "free-count" not in row  # a boolean location never shows a count
    assert 'href="/clusters/new/?offer=usw1-bm&amp;nodes=8"' in row


def test_it_reserves_a_boolean_location_ahead_above_8(owner, h100):
    offer_type(gpu=h100, slug="usw1-bm", location="us-west-1", reporting=BOOLEAN, free=20)

    html = get(owner, "gpu=h100-sxm&nodes=9")

    assert offer_rows(html) == [("usw1-bm", "reserved_ahead")]
    row = offer_row(html, "usw1-bm")
    assert "Reserved ahead" in row
    assert "/clusters/new/" not in row
    assert 'href="/offers/quote/?gpu=h100-sxm&amp;nodes=9&amp;location=us-west-1"' in row


@pytest.mark.parametrize(
    ("nodes", "reads", "label"),
    [(2, "not_in_stock", "Not in stock"), (8, "not_in_stock", "Not in stock"),
     (9, "reserved_ahead", "Reserved ahead"), (64, "reserved_ahead", "Reserved ahead")],
)  # fmt: skip
def test_it_shows_a_boolean_location_without_machines_as_unavailable(
    owner, h100, nodes, reads, label
):
    offer_type(gpu=h100, slug="usw1-bm", location="us-west-1", reporting=BOOLEAN, free=0, busy=4)

    html = get(owner, f"gpu=h100-sxm&nodes={nodes}")

    assert offer_rows(html) == [("usw1-bm", reads)]
    row = offer_row(html, "usw1-bm")
    assert label in row
    assert "none free" in row


# --- filters and rules ---------------------------------------------------------------------


def test_it_hides_community_hosts_unless_asked(owner, h100):
    offer_type(gpu=h100, slug="dc-vm", price="3.00")
    offer_type(gpu=h100, slug="cm-ctr", location="cm-us", price="1.00", community=True)

    hidden = get(owner, "gpu=h100-sxm&nodes=2")
    shown = get(owner, "gpu=h100-sxm&nodes=2&community=1")

    assert [slug for slug, _ in offer_rows(hidden)] == ["dc-vm"]
    assert "keep secrets off it" not in hidden
    assert [slug for slug, _ in offer_rows(shown)] == ["cm-ctr", "dc-vm"]
    assert "Community" in offer_row(shown, "cm-ctr")
    assert "Community" not in offer_row(shown, "dc-vm")
    assert "Run by an independent operator: keep secrets off it." in text(shown)
    assert 'name="community" value="1" checked' in shown


def test_it_offers_kubernetes_only_on_vms_and_bare_metal(owner, h100):
    offer_type(gpu=h100, slug="a-ctr", machine_kind=MachineType.Kind.CONTAINER)
    offer_type(gpu=h100, slug="b-vm", location="eu-central-1", machine_kind=MachineType.Kind.VM)
    offer_type(gpu=h100, slug="c-bm", location="us-west-1", machine_kind="bare_metal")

    html = get(owner, "gpu=h100-sxm&nodes=2")

    container = offer_row(html, "a-ctr")
    assert '<span class="soft" aria-disabled="true" title="Kubernetes runs on VMs' in container
    assert "Kubernetes runs on VMs and bare metal, not containers" in text(container)
    assert "Container" in container
    for slug in ("b-vm", "c-bm"):
        row = offer_row(html, slug)
        assert '<span class="soft">Kubernetes</span>' in row
        assert "not containers" not in row


def test_it_shows_volumes_as_unavailable_on_community_hosts(owner, h100):
    offer_type(gpu=h100, slug="dc-vm")
    offer_type(gpu=h100, slug="cm-vm", location="cm-us", community=True)

    html = get(owner, "gpu=h100-sxm&nodes=2&community=1")

    community = offer_row(html, "cm-vm")
    assert 'aria-disabled="true" title="No volumes on community hosts">Volumes' in community
    assert "No volumes on community hosts" in text(community)
    datacenter = offer_row(html, "dc-vm")
    assert '<span class="soft">Volumes</span>' in datacenter
    assert "No volumes" not in datacenter


def test_it_prices_the_whole_cluster_large_and_the_machine_under_it(owner, h100):
    offer_type(gpu=h100, slug="cheap", price="2.49", free=10)
    offer_type(gpu=h100, slug="big", location="eu-central-1", price="23.92", free=70)

    three = get(owner, "gpu=h100-sxm&nodes=3")
    sixty_four = get(owner, "gpu=h100-sxm&nodes=64")

    row = offer_row(three, "cheap")
    assert '<div class="price-main">$7.47<span class="per">/h</span></div>' in row
    assert '<div class="price-sub">$2.49/h per machine</div>' in row
    row = offer_row(sixty_four, "big")
    assert '<div class="price-main">$1,530.88<span class="per">/h</span></div>' in row
    assert '<div class="price-sub">$23.92/h per machine</div>' in row


def test_it_sorts_available_first_then_by_cluster_price_then_location(owner, h100):
    offer_type(gpu=h100, slug="x-later-loc", location="zz-west", price="3.00", free=4)
    offer_type(gpu=h100, slug="x-earlier-loc", location="aa-east", price="3.00", free=4)
    offer_type(gpu=h100, slug="x-cheapest", location="mm-mid", price="2.00", free=4)
    offer_type(gpu=h100, slug="x-short", location="bb-low", price="1.00", free=1)
    offer_type(gpu=h100, slug="x-dear-short", location="ab-low", price="9.00", free=0)

    html = get(owner, "gpu=h100-sxm&nodes=4")

    assert offer_rows(html) == [
        ("x-cheapest", "available"),
        ("x-earlier-loc", "available"),
        ("x-later-loc", "available"),
        ("x-short", "not_in_stock"),
        ("x-dear-short", "not_in_stock"),
    ]
    # The unavailable ones sit under their own heading, after every available row.
    assert html.index("Cannot take 4 machines now") < html.index('data-offer="x-short"')
    assert html.index('data-offer="x-later-loc"') < html.index("Cannot take 4 machines now")


def test_it_leaves_out_quoted_interconnects(owner, h100):
    offer_type(gpu=h100, slug="eth")
    offer_type(gpu=h100, slug="ib", location="eu-central-1", interconnect="infiniband")

    assert [slug for slug, _ in offer_rows(get(owner, "gpu=h100-sxm&nodes=2"))] == ["eth"]


def test_it_shows_each_rows_location_interconnect_kind_and_gpus(owner, h100):
    offer_type(
        gpu=h100, slug="x", location="us-east-2", gpus_per_machine=8, machine_kind="bare_metal"
    )

    html = get(owner, "gpu=h100-sxm&nodes=2")
    row = offer_row(html, "x")

    assert cell(row, "loc") == "Site us-east-2 us-east-2 · US"
    assert cell(row, "machine") == "8 GPUs per machine Bare metal · Ethernet"
    assert cell(row, "gpus-total") == "16 1,280 GiB"
    # One offer has what every offer has: said once above the table, no chip on the row.
    assert "Every offer: Slurm Kubernetes Ray Volumes" in text(html)
    assert "soft" not in row


# --- built for comparison (issue 21) -------------------------------------------------------


def test_it_heads_the_table_with_machines_times_the_gpu(owner, h100):
    offer_type(gpu=h100, slug="x", gpus_per_machine=8)

    page = text(get(owner, "gpu=h100-sxm&nodes=4"))

    assert "3 4 machines × H100 SXM 80GB" in page  # 4 machines, not 4 GPUs: 32 GPUs in all
    assert "4 × H100" not in page


def test_it_says_the_software_every_offer_shares_once_and_chips_only_what_differs(owner, h100):
    offer_type(gpu=h100, slug="a-ctr", machine_kind=MachineType.Kind.CONTAINER)
    offer_type(gpu=h100, slug="b-vm", location="eu-central-1", machine_kind=MachineType.Kind.VM)

    html = get(owner, "gpu=h100-sxm&nodes=2")

    assert "Every offer: Slurm Ray Volumes" in text(html)
    assert html.count('<span class="soft">Slurm</span>') == 1  # above the table, not per row
    assert cell(offer_row(html, "a-ctr"), "machine").endswith(
        "Kubernetes: Kubernetes runs on VMs and bare metal, not containers"
    )
    assert cell(offer_row(html, "b-vm"), "machine").endswith(
        "Virtual machine · Ethernet Kubernetes"
    )


def test_it_names_what_no_offer_has_above_the_table(owner, h100):
    offer_type(gpu=h100, slug="cm-ctr", location="cm-us", community=True, machine_kind="container")

    html = get(owner, "gpu=h100-sxm&nodes=2&community=1")

    assert (
        "Every offer: Slurm Ray No offer here: Kubernetes: Kubernetes runs on VMs and bare metal, "
        "not containers Volumes: No volumes on community hosts" in text(html)
    )
    assert "soft" not in offer_row(html, "cm-ctr")


def test_it_shows_the_city_and_keeps_the_full_location_name_in_its_title(owner, h100):
    offer_type(gpu=h100, slug="x", location="ca-central-1")
    Location.objects.filter(code="ca-central-1").update(name="Montréal, Quebec")

    row = offer_row(get(owner, "gpu=h100-sxm&nodes=2"), "x")

    assert '<div class="loc-name" title="Montréal, Quebec">Montréal</div>' in row


def test_it_names_the_offers_and_their_table_apart(owner, h100):
    offer_type(gpu=h100, slug="x")

    html = get(owner, "gpu=h100-sxm&nodes=4")

    # axe landmark-unique: the live section and the scrolling region inside it differ.
    assert '<section id="offers" class="offers" aria-live="polite" aria-label="Offers">' in html
    assert 'role="region" tabindex="0" aria-label="Offers for 4 machines × H100 SXM 80GB"' in html


def test_it_says_the_order_with_gpu_in_capitals(owner, h100):
    offer_type(gpu=h100, slug="x")

    assert "sorted by cluster price" in text(get(owner, "gpu=h100-sxm&nodes=2"))
    by_gpu = text(get(owner, "gpu=h100-sxm&nodes=2&sort=price_per_gpu_hour"))
    assert "sorted by price per GPU-hour" in by_gpu
    assert "gpu-hour" not in by_gpu


def test_it_orders_the_gpu_cards_by_memory_then_the_dearer_gpu_hour(owner):
    """Not by name: the largest memory first; as much memory, the dearer GPU-hour (the newer
    generation) first, judged over community offers too so showing them moves no card."""
    cheap_80 = GpuModelFactory(slug="a100", name="A100 80GB", memory_gib=80)
    dear_80 = GpuModelFactory(slug="h100", name="H100 80GB", memory_gib=80)
    small = GpuModelFactory(slug="l4", name="L4 24GB", memory_gib=24)
    big = GpuModelFactory(slug="b200", name="B200 180GB", memory_gib=180)
    offer_type(gpu=cheap_80, slug="a", price="1.39", gpus_per_machine=1)
    offer_type(gpu=dear_80, slug="h", location="eu-1", price="2.39", gpus_per_machine=1)
    # community only, dearer per GPU-hour than every other: still ordered by memory first
    offer_type(gpu=small, slug="l", location="cm-us", price="9.00", gpus_per_machine=1,
               community=True)  # fmt: skip
    offer_type(gpu=big, slug="b", location="us-west-1", price="45.52", gpus_per_machine=8)

    def order(html: str) -> list[str]:
        return re.findall(r'<input type="radio" name="gpu" value="([^"]+)"', html)

    assert order(get(owner)) == ["b200", "h100", "a100", "l4"]
    assert order(get(owner, "community=1")) == ["b200", "h100", "a100", "l4"]
    assert 'value="b200" checked' in get(owner)  # the first card with offers is the default


# --- the cards and the controls ------------------------------------------------------------


def test_it_shows_gpu_cards_with_memory_lowest_price_and_gpu_counts(owner, h100):
    offer_type(gpu=h100, slug="a", price="2.39", gpus_per_machine=1)
    offer_type(gpu=h100, slug="b", location="eu-central-1", price="23.12", gpus_per_machine=8)
    offer_type(
        gpu=h100, slug="c", location="cm-us", price="1.10", gpus_per_machine=4, community=True
    )
    GpuModelFactory(slug="nothing-sold", name="Unsold GPU", memory_gib=16)

    datacenter = text(get(owner))
    with_community = text(get(owner, "community=1"))

    # The lowest per GPU-hour and the lowest per machine may come from different machines.
    assert (
        "H100 SXM 80GB 80 GiB memory from $2.39 per GPU-hour from $2.39/h per machine "
        "1, 8 GPUs per machine" in datacenter
    )
    assert (
        "from $0.28 per GPU-hour from $1.10/h per machine 1, 4, 8 GPUs per machine"
        in with_community
    )
    assert "Unsold GPU" not in datacenter


def test_it_defaults_to_the_first_gpu_with_offers_and_two_machines(owner):
    a100 = GpuModelFactory(slug="a100", name="A100 80GB", memory_gib=80)
    b200 = GpuModelFactory(slug="b200", name="B200 180GB", memory_gib=180)
    offer_type(gpu=b200, slug="b200-vm")
    offer_type(gpu=a100, slug="a100-cm", location="cm-us", community=True)

    html = get(owner)

    assert 'value="b200" checked' in html
    assert 'value="a100" checked' not in html
    assert 'name="nodes" min="2" max="64"' in html
    assert 'value="2" aria-describedby' in html
    assert offer_rows(html) == [("b200-vm", "available")]
    assert 'href="/clusters/new/?offer=b200-vm&amp;nodes=2"' in html


def test_it_says_when_a_gpu_runs_on_community_hosts_only(owner):
    gpu = GpuModelFactory(slug="rtx-4090", name="RTX 4090 24GB", memory_gib=24)
    offer_type(gpu=gpu, slug="cm-4090", location="cm-us", community=True)

    html = text(get(owner, "gpu=rtx-4090&nodes=2"))

    assert "Community hosts only" in html
    assert "RTX 4090 24GB runs on community hosts only." in html


@pytest.mark.parametrize(
    ("nodes", "said"),
    [
        ("1", "A cluster has at least 2 machines"),
        ("65", "2 to 64"),
        ("abc", "2 to 64"),
        ("-3", "A cluster has at least 2 machines"),
        ("2.5", "2 to 64"),
    ],
)
def test_it_explains_a_bad_size_beside_the_control_and_shows_no_table(owner, h100, nodes, said):
    offer_type(gpu=h100, slug="x")

    html = get(owner, f"gpu=h100-sxm&nodes={nodes}")

    assert '<p id="nodes-error" class="field-error" role="alert">' in html
    error = html.split('<p id="nodes-error" class="field-error" role="alert">')[1].split("</p>")[0]
    assert said in error
    assert "<table" not in html
    assert 'aria-invalid="true"' in html


def test_it_names_an_unknown_gpu_and_keeps_the_cards(owner, h100):
    offer_type(gpu=h100, slug="x")

    html = get(owner, "gpu=h999&nodes=2")
    odd = get(owner, "gpu=%3Cb%3EH+100%3C%2Fb%3E&nodes=2")

    assert "Unknown GPU &#x27;h999&#x27;" in html
    assert "Unknown GPU &#x27;&lt;b&gt;H 100&lt;/b&gt;&#x27;" in odd
    assert "<table" not in odd
    assert 'name="gpu" value="h100-sxm"' in html
    assert "<table" not in html


def test_it_links_request_a_quote_under_the_sizes_and_in_the_ethernet_note(owner, h100):
    offer_type(gpu=h100, slug="x")

    html = get(owner, "gpu=h100-sxm&nodes=16")

    help_text = html.split('id="nodes-help"')[1].split("</p>")[0]
    assert 'href="/offers/quote/?gpu=h100-sxm&amp;nodes=16">Request a quote</a>' in help_text
    assert (
        "Self-serve clusters run on Ethernet with an encrypted private network (10.77.0.0/24) at "
        f"about 1-2 Gbit/s between machines. That suits {ETHERNET_SUITS}; it is not built for "
        f"{ETHERNET_NOT_BUILT_FOR}. Need InfiniBand or RoCE? Request a quote."
    ) in text(html)


def test_it_reads_a_quick_pick_without_javascript(owner, h100):
    offer_type(gpu=h100, slug="x", free=20)

    # The number input still says 2 (prev); the radio clicked says 16.
    picked = get(owner, "gpu=h100-sxm&prev=2&nodes=2&nodes=16")
    typed = get(owner, "gpu=h100-sxm&prev=2&nodes=12")
    typed_over_old_pick = get(owner, "gpu=h100-sxm&prev=16&nodes=12&nodes=16")

    assert 'href="/clusters/new/?offer=x&amp;nodes=16"' in picked
    assert 'href="/clusters/new/?offer=x&amp;nodes=12"' in typed
    assert 'href="/clusters/new/?offer=x&amp;nodes=12"' in typed_over_old_pick


def test_it_works_as_a_plain_get_form(owner, h100):
    offer_type(gpu=h100, slug="x")

    html = get(owner)

    assert '<form id="picker" class="picker card" method="get" action="/offers/"' in html
    assert 'hx-get="/offers/" hx-trigger="change, submit" hx-target="#offers"' in html
    assert 'hx-push-url="true"' in html
    assert '<button type="submit" class="btn btn-primary">Show offers</button>' in html


def test_it_swaps_only_the_offers_region_for_htmx(owner, h100):
    offer_type(gpu=h100, slug="x", free=3)

    html = get(owner, "gpu=h100-sxm&nodes=4", HX_Request="true")

    assert html.lstrip().startswith('<section id="offers"')
    assert "<form" not in html and "<html" not in html
    assert offer_rows(html) == [("x", "not_in_stock")]
    # The controls outside the region are updated out of band.
    assert '<p id="nodes-error" class="field-error" role="alert" hx-swap-oob="true"></p>' in html
    assert 'id="gpu-facts-h100-sxm" class="gpu-facts" hx-swap-oob="true"' in html


def test_it_sends_a_bad_size_to_htmx_out_of_band(owner, h100):
    offer_type(gpu=h100, slug="x")

    html = get(owner, "gpu=h100-sxm&nodes=65", HX_Request="true")

    assert "<table" not in html
    assert (
        'id="nodes-error" class="field-error" role="alert" hx-swap-oob="true">A self-serve' in html
    )


def test_it_renders_the_whole_page_for_an_htmx_history_restore(owner, h100):
    offer_type(gpu=h100, slug="x")

    html = get(owner, "gpu=h100-sxm", HX_Request="true", HX_History_Restore_Request="true")

    assert "<form" in html


def test_it_asks_anonymous_visitors_to_log_in(client, db):
    response = client.get(PICKER)
    assert response.status_code == 302
    assert "/accounts/login/" in response["Location"]


# --- a constant number of queries ------------------------------------------------------------


def _inventory(gpu, hosts: int) -> None:
    """`hosts` hosts over six machine types in four locations, both capacity modes, community."""
    types = [
        offer_type(gpu=gpu, slug="q-a", location="q-1", free=0),
        offer_type(gpu=gpu, slug="q-b", location="q-2", free=0, machine_kind="container"),
        offer_type(gpu=gpu, slug="q-c", location="q-3", reporting=BOOLEAN, free=0),
        offer_type(gpu=gpu, slug="q-d", location="q-4", free=0, community=True),
        offer_type(gpu=gpu, slug="q-e", location="q-1", free=0, gpus_per_machine=4),
        offer_type(gpu=gpu, slug="q-f", location="q-2", free=0, interconnect="infiniband"),
    ]
    for index, machine_type in enumerate(types):
        share = hosts // len(types) + (1 if index < hosts % len(types) else 0)
        add_hosts(machine_type, free=share * 3 // 4, busy=share - share * 3 // 4)


@pytest.mark.parametrize("hosts", [10, 5000])
@pytest.mark.parametrize(("htmx", "queries"), [(False, 6), (True, 5)])
def test_it_runs_the_same_queries_for_10_and_5000_hosts(
    owner, h100, django_assert_num_queries, hosts, htmx, queries
):
    _inventory(h100, hosts)
    GpuModelFactory(slug="l40s", name="L40S 48GB", memory_gib=48)
    MachineTypeFactory(gpu__slug="l40s", slug="l40s-vm")
    client = owner.browser_client()
    headers = {"HX-Request": "true"} if htmx else {}

    url = f"{PICKER}?gpu=h100-sxm&nodes=8&community=1"

    # session, user, the project (whether it is flagged for drills, offers/visibility.py), GPU
    # cards, offers (+ for a full page the top bar's burn rate, billing/context_processors.py;
    # the layout names the same project)
    with django_assert_num_queries(queries):
        response = client.get(url, headers=headers)
    # within the tick the GPU cards and the offers come from the cache
    with django_assert_num_queries(queries - 2):
        again = client.get(url, headers=headers)

    assert response.status_code == 200
    assert len(offer_rows(response.content.decode())) == 5
    assert offer_rows(again.content.decode()) == offer_rows(response.content.decode())


def test_it_counts_only_free_hosts(owner, h100):
    machine_type = offer_type(gpu=h100, slug="x", free=2)
    for state in ("reserved", "in_use", "cleaning", "offline"):
        HostFactory(machine_type=machine_type, state=state)

    assert offer_rows(get(owner, "gpu=h100-sxm&nodes=3")) == [("x", "not_in_stock")]
