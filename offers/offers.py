"""Offers: what can start now for a GPU model and a size (SPEC §1).

An offer is a machine type with its free capacity. Everything here runs in a constant number
of queries whatever the size of the inventory: one query, counting free hosts per machine type.
"""

from dataclasses import dataclass
from decimal import Decimal
from enum import StrEnum

from django.db import connection
from django.db.models import IntegerField, Min, Q
from django.db.models.expressions import RawSQL

from offers.models import (
    BOOLEAN_MAX_NODES,
    MAX_NODES,
    MIN_NODES,
    GpuModel,
    Host,
    Location,
    MachineType,
)


class Availability(StrEnum):
    AVAILABLE = "available"
    NOT_IN_STOCK = "not_in_stock"
    RESERVED_AHEAD = "reserved_ahead"


SOFTWARE_ALL = ("none", "slurm", "kubernetes", "ray")
CENT = Decimal("0.01")


@dataclass(frozen=True)
class Offer:
    machine_type: MachineType
    nodes: int
    free_hosts: int

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
    def software(self) -> list[str]:
        return [
            s for s in SOFTWARE_ALL if s != "kubernetes" or self.machine_type.supports_kubernetes
        ]


def valid_size(nodes: int) -> bool:
    return MIN_NODES <= nodes <= MAX_NODES


def _free_hosts() -> RawSQL:
    """The number of free hosts of the machine type on the row, as a correlated count.

    It reads only the (machine_type, state) index (an index-only scan of the free hosts);
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
    sql = (
        f"SELECT COUNT(*) FROM {host} "  # noqa: S608 (names from the models, quoted)
        f"WHERE {host}.{type_column} = {machine_type} AND {host}.{state} = %s"
    )
    return RawSQL(sql, (Host.State.FREE.value,), output_field=IntegerField())  # noqa: S611


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


def list_offers(*, gpu: GpuModel | str, nodes: int, include_community: bool) -> list[Offer]:
    """Every self-serve offer of `gpu` for `nodes` machines, in the picker's order.

    `gpu` is a GPU model or its slug; with a slug nothing tells an unknown GPU from one with
    no offers (both give []), which spares the API a query on its hot path.
    """
    by_gpu = {"gpu__slug": gpu} if isinstance(gpu, str) else {"gpu": gpu}
    machine_types = _with_free_hosts(
        MachineType.objects.filter(**by_gpu, interconnect__in=MachineType.SELF_SERVE_INTERCONNECTS)
    )
    if not include_community:
        machine_types = machine_types.filter(community=False)
    offers = [Offer(machine_type=mt, nodes=nodes, free_hosts=mt.free_hosts) for mt in machine_types]
    return sorted(offers, key=sort_key)


def get_offer(*, slug: str, nodes: int) -> Offer | None:
    """One offer by its id (the machine type's slug), or None for an unknown or quoted one."""
    machine_type = _with_free_hosts(
        MachineType.objects.filter(slug=slug, interconnect__in=MachineType.SELF_SERVE_INTERCONNECTS)
    ).first()
    if machine_type is None:
        return None
    return Offer(machine_type=machine_type, nodes=nodes, free_hosts=machine_type.free_hosts)


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

    @property
    def has_offers(self) -> bool:
        return self.lowest_machine_price is not None

    @property
    def listed(self) -> bool:
        """Whether the picker shows the card: it has self-serve offers of either kind."""
        return self.has_offers or self.community_only


def gpu_cards(*, include_community: bool) -> list[GpuCard]:
    """Every GPU model by name, with its lowest machine price and GPU counts, in one query.

    The query groups the self-serve machine types by GPU, GPUs per machine and community; it
    never touches the hosts, so its cost follows the catalog, not the inventory.
    """
    rows = (
        GpuModel.objects.values(
            "pk",
            "slug",
            "name",
            "memory_gib",
            "machine_types__gpus_per_machine",
            "machine_types__community",
        )
        .annotate(
            lowest=Min(
                "machine_types__price_per_hour",
                filter=Q(machine_types__interconnect__in=MachineType.SELF_SERVE_INTERCONNECTS),
            )
        )
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
            )
        )
    return cards
