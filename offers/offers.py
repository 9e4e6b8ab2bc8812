"""Offers: what can start now for a GPU model and a size (SPEC §1).

An offer is a machine type with its free capacity. Everything here runs in a constant number
of queries whatever the size of the inventory: one query, counting free hosts per machine type.
The picker and the API read their answers through `cached`, for one tick of the beat
(docs/offers.md "How fresh the offers are"): create re-reads its offer and reserves hosts
under row locks, so an answer a tick old can mislead a user for that long, never oversell.
"""

import math
import re
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from decimal import ROUND_HALF_UP, Decimal
from enum import StrEnum
from typing import TypeVar

from django.conf import settings
from django.core.cache import cache
from django.db import connection, transaction
from django.db.models import F, IntegerField, Min, Q, TextChoices
from django.db.models.expressions import RawSQL
from django.utils import timezone

from offers.models import (
    BOOLEAN_MAX_NODES,
    MAX_NODES,
    SPEC_FIELDS,
    GpuModel,
    Host,
    Location,
    MachineSpecs,
    MachineType,
)
from runcrate.durations import whole_minutes


class Availability(StrEnum):
    AVAILABLE = "available"
    NOT_IN_STOCK = "not_in_stock"
    RESERVED_AHEAD = "reserved_ahead"


SOFTWARE_ALL = ("none", "slurm", "kubernetes", "ray")
# What the self-serve Ethernet network between machines suits, and what it is not built for,
# as a plan (clusters/web/plans.py), the CLI, the MCP server and the pages (the `network_terms`
# context processor) say it.
ETHERNET_SUITS = (
    "independent jobs on every node, Slurm job arrays, Ray tasks, Kubernetes workloads, "
    "inference and LoRA fine-tuning"
)
ETHERNET_NOT_BUILT_FOR = (
    "training one large model across machines, where GPUs exchange gradients every step"
)
ETHERNET_NOT_FOR = f"{ETHERNET_NOT_BUILT_FOR}: for InfiniBand or RoCE, request a quote"
CENT = Decimal("0.01")


@dataclass(frozen=True)
class OfferLocation:
    """The location of a listed offer, as the picker and the API show it."""

    code: str
    name: str
    country: str
    capacity_reporting: str
    # A failure-drill location, listed only for those `offers.visibility.sees_drills` allows.
    drill: bool = False

    @property
    def short_name(self) -> str:
        """The city alone ("Montréal" of "Montréal, Quebec"), so the picker's location column
        stays one line wide; the full name goes in its title."""
        return self.name.split(",", 1)[0].strip() or self.name


@dataclass(frozen=True)
class OfferGpu:
    slug: str
    name: str
    memory_gib: int


@dataclass(frozen=True)
class OfferMachineType:
    """A machine type as `list_offers` reads it: plain values from one `values()` row, which
    cost a fraction of three model instances each and keep small in the cache. It answers what
    the picker, the API and the cluster page read of a `MachineType`; `get_offer` gives the
    model itself, for create."""

    pk: int
    slug: str
    gpus_per_machine: int
    machine_kind: str
    interconnect: str
    community: bool
    price_per_hour: Decimal
    location: OfferLocation
    gpu: OfferGpu
    specs: MachineSpecs = MachineSpecs()

    @property
    def supports_kubernetes(self) -> bool:
        return self.machine_kind != MachineType.Kind.CONTAINER

    @property
    def supports_volumes(self) -> bool:
        return not self.community

    def get_machine_kind_display(self) -> str:
        return MachineType.Kind(self.machine_kind).label

    def get_interconnect_display(self) -> str:
        return MachineType.Interconnect(self.interconnect).label


@dataclass(frozen=True)
class OfferTrackRecord:
    """A machine type's track record as the offers show it (docs/offers.md, "Track record"):
    read from its `TrackRecord` row in the offers' own query, only from the minimum number of
    clusters on."""

    clusters: int
    started: int
    ready_median_seconds: int | None
    ready_p95_seconds: int | None
    failures_by_step: dict[str, int]
    bandwidth_median_mbit: float | None
    computed_at: datetime

    @property
    def started_share(self) -> Decimal:
        """The share of the clusters that became ready, exact to four places (half up)."""
        return (Decimal(self.started) / self.clusters).quantize(
            Decimal("0.0001"), rounding=ROUND_HALF_UP
        )

    @property
    def started_percent(self) -> int:
        """The whole percent that started, rounded down: 199 of 200 reads 99%, never 100%."""
        return self.started * 100 // self.clusters

    @property
    def ready_minutes(self) -> int | None:
        """The median time to ready in whole minutes (half up), or None: nothing started."""
        if self.ready_median_seconds is None:
            return None
        return whole_minutes(self.ready_median_seconds)

    @property
    def ready_p95_minutes(self) -> int | None:
        if self.ready_p95_seconds is None:
            return None
        return whole_minutes(self.ready_p95_seconds)


_TRACK_RECORD_FIELDS = (
    "clusters",
    "started",
    "ready_median_seconds",
    "ready_p95_seconds",
    "failures_by_step",
    "bandwidth_median_mbit",
    "computed_at",
)


def _track_record(values: dict) -> OfferTrackRecord | None:
    """The track record from a row's values, or None without a row or below the minimum."""
    clusters = values["clusters"]
    if clusters is None or clusters < settings.RUNCRATE_TRACK_RECORD_MIN_CLUSTERS:
        return None
    return OfferTrackRecord(**values)


@dataclass(frozen=True)
class Offer:
    machine_type: MachineType | OfferMachineType
    nodes: int
    free_hosts: int
    track_record: OfferTrackRecord | None = field(default=None, compare=False)

    @property
    def id(self) -> str:
        return self.machine_type.slug

    @property
    def counts_capacity(self) -> bool:
        return self.machine_type.location.capacity_reporting == Location.CapacityReporting.COUNT

    @property
    def nodes_available(self) -> int | None:
        """Free machines where the location counts them; None where it only says yes or no."""
        return self.free_hosts if self.counts_capacity else None

    @property
    def max_nodes(self) -> int:
        if self.counts_capacity:
            return min(MAX_NODES, self.free_hosts)
        return BOOLEAN_MAX_NODES if self.free_hosts > 0 else 0

    @property
    def availability(self) -> Availability:
        if self.nodes <= self.max_nodes:
            return Availability.AVAILABLE
        if self.counts_capacity or self.nodes <= BOOLEAN_MAX_NODES:
            return Availability.NOT_IN_STOCK
        return Availability.RESERVED_AHEAD

    @property
    def is_available(self) -> bool:
        return self.availability is Availability.AVAILABLE

    @property
    def machine_price_per_hour(self) -> Decimal:
        return self.machine_type.price_per_hour

    @property
    def price_per_hour(self) -> Decimal:
        return self.machine_type.price_per_hour * self.nodes

    @property
    def gpus_total(self) -> int:
        """Every GPU of the cluster: machines × GPUs per machine."""
        return self.machine_type.gpus_per_machine * self.nodes

    @property
    def gpu_memory_total_gib(self) -> int:
        return self.machine_type.gpu.memory_gib * self.gpus_total

    @property
    def price_per_gpu_hour(self) -> Decimal:
        """One GPU for an hour, exact: the machine price over its GPUs (the same as the cluster
        price over every GPU). Sorting compares this; pages print it with `|usd`, which rounds
        half up to the cent."""
        return self.machine_type.price_per_hour / self.machine_type.gpus_per_machine

    @property
    def software(self) -> list[str]:
        return [
            s for s in SOFTWARE_ALL if s != "kubernetes" or self.machine_type.supports_kubernetes
        ]

    @property
    def features(self) -> frozenset[str]:
        """The keys of the `FEATURES` this offer has: its software and whether it takes volumes."""
        keys = {s for s in self.software if s != "none"}
        if self.machine_type.supports_volumes:
            keys.add("volumes")
        return frozenset(keys)


@dataclass(frozen=True)
class Feature:
    """What an offer runs or takes, as the picker compares offers by it."""

    key: str
    label: str
    missing_because: str  # why an offer lacks it, for its struck-through chip and the legend


FEATURES = (
    Feature("slurm", "Slurm", "Slurm runs on every machine"),
    Feature("kubernetes", "Kubernetes", "Kubernetes runs on VMs and bare metal, not containers"),
    Feature("ray", "Ray", "Ray runs on every machine"),
    Feature("volumes", "Volumes", "No volumes on community hosts"),
)


@dataclass(frozen=True)
class FeatureComparison:
    """The `FEATURES` over a list of offers: `shared` by every offer (said once, above the
    table), `differing` (some have it, some not: a chip on each row), `absent` (none has it)."""

    shared: tuple[Feature, ...]
    differing: tuple[Feature, ...]
    absent: tuple[Feature, ...]


def compare_features(offers: list[Offer]) -> FeatureComparison:
    """Which features tell `offers` apart: the picker shows a chip only where offers differ."""
    counts = {f.key: sum(f.key in o.features for o in offers) for f in FEATURES}
    return FeatureComparison(
        shared=tuple(f for f in FEATURES if offers and counts[f.key] == len(offers)),
        differing=tuple(f for f in FEATURES if 0 < counts[f.key] < len(offers)),
        absent=tuple(f for f in FEATURES if offers and counts[f.key] == 0),
    )


def same_shape_first(offers: list[Offer], *, like: MachineType | OfferMachineType) -> list[Offer]:
    """`offers` with the machines shaped like `like` first (as many GPUs per machine, the same
    kind), then those with as many GPUs of another kind, then the rest; each group keeps its
    order. What a failed cluster's page offers instead."""

    def differs(offer: Offer) -> tuple[bool, bool]:
        other = offer.machine_type
        return (
            other.gpus_per_machine != like.gpus_per_machine,
            other.machine_kind != like.machine_kind,
        )

    return sorted(offers, key=differs)


def offered_hosts():
    """The hosts anyone may rent now: free, and, for an `ssh` host, with a baseline recorded. An
    `ssh` host without one is never offered nor reserved (docs/inventory.md, "Reimage before
    reuse"): after its first tenant it could only go dirty. `_free_hosts` counts the same."""
    return Host.objects.filter(state=Host.State.FREE).filter(
        ~Q(driver=Host.Driver.SSH) | Q(baseline_at__isnull=False)
    )


def _free_hosts() -> RawSQL:
    """The number of free hosts of the machine type on the row, as a correlated count.

    It reads the (machine_type, state) index (then the free hosts' rows, for the baseline);
    joining every host and grouping instead sorts the GPU's whole inventory on each call, about
    30 times slower at 20,000 hosts. Written as SQL because Django's Subquery costs more to
    compile than the database takes to run it, on the API's hottest path. No user input
    reaches it: the names come from the models, the state is a bound parameter.
    """
    quote = connection.ops.quote_name
    host = quote(Host._meta.db_table)
    type_column = quote(Host._meta.get_field("machine_type").column)
    machine_type = f"{quote(MachineType._meta.db_table)}.{quote(MachineType._meta.pk.column)}"
    state = quote(Host._meta.get_field("state").column)
    driver = quote(Host._meta.get_field("driver").column)
    baseline_at = quote(Host._meta.get_field("baseline_at").column)
    sql = (
        f"SELECT COUNT(*) FROM {host} "  # noqa: S608 (names from the models, quoted)
        f"WHERE {host}.{type_column} = {machine_type} AND {host}.{state} = %s "
        f"AND ({host}.{driver} <> %s OR {host}.{baseline_at} IS NOT NULL)"  # offered_hosts
    )
    parameters = (Host.State.FREE.value, Host.Driver.SSH.value)
    return RawSQL(sql, parameters, output_field=IntegerField())  # noqa: S611


def _with_free_hosts(queryset):
    return queryset.select_related("location", "gpu").annotate(free_hosts=_free_hosts())


def sort_key(offer: Offer) -> tuple:
    """Available offers first, then by cluster price, then location."""
    return (
        not offer.is_available,
        offer.price_per_hour,
        offer.machine_type.location.code,
        offer.machine_type.slug,
    )


def gpu_hour_sort_key(offer: Offer) -> tuple:
    """Available offers first, then by exact price per GPU-hour, then as `sort_key`."""
    return (not offer.is_available, offer.price_per_gpu_hour, *sort_key(offer)[1:])


class SortBy(TextChoices):
    """The orders of the offers (the picker's and the API's `sort`); `price` is the default."""

    PRICE = "price", "Cluster price"
    PRICE_PER_GPU_HOUR = "price_per_gpu_hour", "Price per GPU-hour"

    @property
    def in_sentence(self) -> str:
        """The label inside a sentence ("sorted by price per GPU-hour"): only its first letter
        is lowered, so GPU stays upper case."""
        return self.label[:1].lower() + self.label[1:]


SORT_KEYS: dict[SortBy, Callable[[Offer], tuple]] = {
    SortBy.PRICE: sort_key,
    SortBy.PRICE_PER_GPU_HOUR: gpu_hour_sort_key,
}
GPUS_PER_MACHINE = (1, 2, 4, 8)


def narrow_offers(
    offers: list[Offer], *, sort: SortBy = SortBy.PRICE, gpus_per_machine: int | None = None
) -> list[Offer]:
    """`offers` (a cached list, in the default order) with only the machines of
    `gpus_per_machine` GPUs when given, in the order `sort` names. In Python, on the cached
    list: sorting and filtering cost no query and share the cache entry."""
    kept = [
        o
        for o in offers
        if gpus_per_machine is None or o.machine_type.gpus_per_machine == gpus_per_machine
    ]
    return kept if sort is SortBy.PRICE else sorted(kept, key=SORT_KEYS[sort])


_ROW = (
    "pk",
    "slug",
    "gpus_per_machine",
    "machine_kind",
    "interconnect",
    "community",
    "price_per_hour",
    "location__code",
    "location__name",
    "location__country",
    "location__capacity_reporting",
    "location__drill",
    "gpu__slug",
    "gpu__name",
    "gpu__memory_gib",
    *SPEC_FIELDS,
    # The track record rides on the same query: a left join of its one row per machine type.
    *(f"track_record__{name}" for name in _TRACK_RECORD_FIELDS),
)


def _listed(row: dict) -> OfferMachineType:
    return OfferMachineType(
        pk=row["pk"],
        slug=row["slug"],
        gpus_per_machine=row["gpus_per_machine"],
        machine_kind=row["machine_kind"],
        interconnect=row["interconnect"],
        community=row["community"],
        price_per_hour=row["price_per_hour"],
        location=OfferLocation(
            code=row["location__code"],
            name=row["location__name"],
            country=row["location__country"],
            capacity_reporting=row["location__capacity_reporting"],
            drill=row["location__drill"],
        ),
        gpu=OfferGpu(
            slug=row["gpu__slug"], name=row["gpu__name"], memory_gib=row["gpu__memory_gib"]
        ),
        specs=MachineSpecs(**{name: row[name] for name in SPEC_FIELDS}),
    )


def list_offers(
    *, gpu: GpuModel | str, nodes: int, include_community: bool, include_drills: bool = False
) -> list[Offer]:
    """Every self-serve offer of `gpu` for `nodes` machines, in the picker's order, read fresh,
    each with its machine type's track record (or None) from the same query. Failure-drill
    locations only with `include_drills` (what `offers.visibility.sees_drills` answers).

    `gpu` is a GPU model or its slug; with a slug nothing tells an unknown GPU from one with
    no offers (both give []), which spares the API a query on its hot path. The rows are read
    with `values()`: each offer's machine type is an `OfferMachineType`, not a model.
    """
    by_gpu: dict[str, object] = {"gpu__slug": gpu} if isinstance(gpu, str) else {"gpu": gpu}
    machine_types = MachineType.objects.filter(
        **by_gpu, interconnect__in=MachineType.SELF_SERVE_INTERCONNECTS
    )
    if not include_community:
        machine_types = machine_types.filter(community=False)
    if not include_drills:
        machine_types = machine_types.filter(location__drill=False)
    rows = machine_types.annotate(free_hosts=_free_hosts()).order_by().values(*_ROW, "free_hosts")
    offers = [
        Offer(
            machine_type=_listed(row),
            nodes=nodes,
            free_hosts=row["free_hosts"],
            track_record=_track_record(
                {name: row[f"track_record__{name}"] for name in _TRACK_RECORD_FIELDS}
            ),
        )
        for row in rows
    ]
    return sorted(offers, key=sort_key)


def get_offer(*, slug: str, nodes: int, include_drills: bool = False) -> Offer | None:
    """One offer by its id (the machine type's slug), or None for an unknown or quoted one, or
    one in a failure-drill location without `include_drills` (as if it did not exist)."""
    found = MachineType.objects.filter(
        slug=slug, interconnect__in=MachineType.SELF_SERVE_INTERCONNECTS
    )
    if not include_drills:
        found = found.filter(location__drill=False)
    machine_type = (
        _with_free_hosts(found)
        # its track record in the same query, as the picker showed it
        .annotate(**{f"record_{name}": F(f"track_record__{name}") for name in _TRACK_RECORD_FIELDS})
        .first()
    )
    if machine_type is None:
        return None
    record = {name: getattr(machine_type, f"record_{name}") for name in _TRACK_RECORD_FIELDS}
    return Offer(
        machine_type=machine_type,
        nodes=nodes,
        free_hosts=machine_type.free_hosts,
        track_record=_track_record(record),
    )


@dataclass(frozen=True)
class GpuCard:
    """A GPU model as the picker's card shows it: what is on offer for it, over self-serve types.

    `lowest_machine_price` and `gpu_counts` cover datacenter offers, plus community ones when
    they are included; `community_only` says every self-serve offer of it is on community hosts
    (so it has nothing to show while they are hidden).
    """

    gpu: GpuModel
    lowest_machine_price: Decimal | None
    gpu_counts: tuple[int, ...]
    community_only: bool
    lowest_price_per_gpu_hour: Decimal | None = None
    # The lowest per GPU-hour over every self-serve offer, community or not: the picker's order.
    any_price_per_gpu_hour: Decimal | None = None

    @property
    def has_offers(self) -> bool:
        return self.lowest_machine_price is not None

    @property
    def listed(self) -> bool:
        """Whether the picker shows the card: it has self-serve offers of either kind."""
        return self.has_offers or self.community_only


def gpu_cards(*, include_community: bool, include_drills: bool = False) -> list[GpuCard]:
    """Every GPU model by name, with its lowest machine price and GPU counts, in one query
    (failure-drill locations' machine types count only with `include_drills`).

    The query groups the self-serve machine types by GPU, GPUs per machine and community; it
    never touches the hosts, so its cost follows the catalog, not the inventory.
    """
    offered = Q(machine_types__interconnect__in=MachineType.SELF_SERVE_INTERCONNECTS)
    if not include_drills:
        offered &= Q(machine_types__location__drill=False)
    rows = (
        GpuModel.objects.values(
            "pk",
            "slug",
            "name",
            "memory_gib",
            "machine_types__gpus_per_machine",
            "machine_types__community",
        )
        .annotate(lowest=Min("machine_types__price_per_hour", filter=offered))
        .order_by("name", "slug", "machine_types__gpus_per_machine")
    )
    grouped: dict[int, tuple[GpuModel, list[tuple[int, bool, Decimal]]]] = {}
    for row in rows:
        gpu, options = grouped.setdefault(
            row["pk"],
            (
                GpuModel(
                    pk=row["pk"], slug=row["slug"], name=row["name"], memory_gib=row["memory_gib"]
                ),
                [],
            ),
        )
        if row["lowest"] is not None:
            # SQLite hands an aggregate of a decimal back with a float's digits: re-quantize.
            price = Decimal(row["lowest"]).quantize(CENT)
            options.append(
                (row["machine_types__gpus_per_machine"], row["machine_types__community"], price)
            )
    cards = []
    for gpu, options in grouped.values():
        shown = [o for o in options if include_community or not o[1]]
        cards.append(
            GpuCard(
                gpu=gpu,
                lowest_machine_price=min((price for _, _, price in shown), default=None),
                gpu_counts=tuple(sorted({count for count, _, _ in shown})),
                community_only=bool(options) and all(community for _, community, _ in options),
                # Grouped by GPUs per machine, so each group's lowest machine price over its
                # GPUs is that group's lowest per GPU-hour: exact, no query of its own.
                lowest_price_per_gpu_hour=min(
                    (price / count for count, _, price in shown), default=None
                ),
                any_price_per_gpu_hour=min(
                    (price / count for count, _, price in options), default=None
                ),
            )
        )
    return cards


def buyer_order(cards: list[GpuCard]) -> list[GpuCard]:
    """The picker's order of the GPU cards: what a buyer compares first, the GPU memory (which
    model fits), largest first; between GPUs with as much memory, the dearer GPU-hour first
    (the newer generation, as H100 before A100), over every self-serve offer so the order does
    not move when community hosts are shown; then by name. `gpu_cards` (and the API) keep the
    order by name."""
    return sorted(
        cards,
        key=lambda c: (-c.gpu.memory_gib, -(c.any_price_per_gpu_hour or 0), c.gpu.name),
    )


# --- one tick in the cache -----------------------------------------------------------------

# Every cached answer is stored beside the inventory version it was computed under, and read
# with it in one round trip: a change to the inventory moves the version, and every answer
# computed before it no longer matches. The version is read before the answer is computed, so
# an answer that raced a change is stored under the old version and dropped on its next read.
VERSION_KEY = "offers:version"
# A GPU slug as SlugField allows it: only these are looked up through the cache, so no input
# makes an odd or unbounded cache key (anything else names no GPU, and is answered fresh).
CACHEABLE_SLUG = re.compile(r"[-a-zA-Z0-9_]{1,40}")

T = TypeVar("T")


def cache_seconds() -> int:
    """One tick of the beat, in whole seconds (Redis keeps nothing for less than one)."""
    return max(1, math.ceil(settings.RUNCRATE_TICK_SECONDS))


def cached(name: str, compute: Callable[[], T]) -> T:
    """`compute()`'s answer as it was at most one tick ago, under the cache key `name`.

    A cache that is down reads as a miss (runcrate/cache.py): the answer is computed each time.
    """
    key = f"offers:{name}"
    found = cache.get_many([VERSION_KEY, key])
    version = found.get(VERSION_KEY)
    entry = found.get(key)
    now = timezone.now()
    # (inventory version, good until, answer): the age is judged by this clock too, not left to
    # the cache's expiry alone, which runs on the cache server's clock and in whole seconds.
    if isinstance(entry, tuple) and len(entry) == 3 and entry[0] == version and now < entry[1]:
        return entry[2]
    answer = compute()
    until = now + timedelta(seconds=settings.RUNCRATE_TICK_SECONDS)
    cache.set(key, (version, until, answer), cache_seconds())
    return answer


def inventory_changed() -> None:
    """Forget every cached offer: staff changed what is on offer (the inventory file, an admin
    edit, a host taken out of service or back).

    Now and again on commit: an answer computed while the change is uncommitted (from the
    rows as they were) is stored under the first new version and dropped by the second.
    Reservations and releases by the cluster lifecycle do not call it: their answers age out
    within the tick, and create never trusts a cached count.
    """

    def new_version() -> None:
        cache.set(VERSION_KEY, uuid.uuid4().hex, None)

    new_version()
    transaction.on_commit(new_version)


def cards_key(*, include_community: bool, include_drills: bool = False) -> str:
    """The cache key of `gpu_cards`' answer, shared by the picker and `GET /api/v1/gpus`."""
    return f"cards:{int(include_community)}:{int(include_drills)}"


def cached_offers(
    *, gpu: GpuModel | str, nodes: int, include_community: bool, include_drills: bool = False
) -> list[Offer]:
    """`list_offers`, at most one tick old."""
    slug = gpu if isinstance(gpu, str) else gpu.slug

    def compute() -> list[Offer]:
        return list_offers(
            gpu=gpu,
            nodes=nodes,
            include_community=include_community,
            include_drills=include_drills,
        )

    if not CACHEABLE_SLUG.fullmatch(slug):
        return compute()
    return cached(f"list:{slug}:{nodes}:{int(include_community)}:{int(include_drills)}", compute)
