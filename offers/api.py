"""The catalog and offers API: `/api/v1/gpus`, `/api/v1/offers`, `/api/v1/quotes`."""

import json
from datetime import date

from django.http import Http404, HttpResponse
from ninja import Field, Router, Schema, Status

from accounts.api_auth import Scope, needs
from accounts.projects import get_for_project
from accounts.requests import ApiRequest
from offers.models import MAX_NODES, MIN_NODES, TOO_FEW_NODES, GpuModel, QuoteRequest
from offers.offers import (
    CACHEABLE_SLUG,
    GPUS_PER_MACHINE,
    Offer,
    OfferTrackRecord,
    SortBy,
    cached,
    cards_key,
    gpu_cards,
    list_offers,
    narrow_offers,
)
from offers.quotes import (
    NAME_MAX_LENGTH,
    NOTES_MAX_LENGTH,
    QUOTE_MAX_NODES,
    QUOTE_MAX_WEEKS,
    QUOTE_MIN_NODES,
    QUOTE_MIN_WEEKS,
    quotes_for,
    request_quote,
)
from offers.visibility import sees_drills
from runcrate import outages
from runcrate.api import (
    ApiError,
    ErrorOut,
    exact_money_str,
    list_envelope,
    money_str,
    utc_str,
)

router = Router(tags=["offers"])


# --- GPUs and offers ----------------------------------------------------------------------


class GpuOut(Schema):
    slug: str
    name: str
    memory_gib: int
    lowest_machine_price_per_hour: str | None = Field(
        description="The lowest self-serve price of one machine, USD per hour; null when none."
    )
    gpu_counts: list[int] = Field(description="GPUs per machine on offer, ascending.")
    lowest_price_per_gpu_hour: str | None = Field(
        description="The lowest self-serve price of one GPU, USD per GPU-hour (a machine's "
        "price over its GPUs), exact: at least 2 decimals, up to 5; null when none."
    )


class GpuListMeta(Schema):
    count: int
    include_community: bool


class GpuList(Schema):
    data: list[GpuOut]
    meta: GpuListMeta


@router.get(
    "/gpus",
    auth=needs(Scope.READ),
    response=GpuList,
    summary="List GPU models and what is on offer",
)
def list_gpus(request: ApiRequest, include_community: bool = False) -> dict:
    """Every GPU model, with the lowest machine price and the GPU counts of its self-serve
    offers (community hosts included only when asked). The answer may be one tick old."""
    drills = sees_drills(user=request.user, project=request.project)
    cards = cached(
        cards_key(include_community=include_community, include_drills=drills),
        lambda: gpu_cards(include_community=include_community, include_drills=drills),
    )
    data = [
        {
            "slug": card.gpu.slug,
            "name": card.gpu.name,
            "memory_gib": card.gpu.memory_gib,
            "lowest_machine_price_per_hour": money_str(card.lowest_machine_price),
            "gpu_counts": list(card.gpu_counts),
            "lowest_price_per_gpu_hour": exact_money_str(card.lowest_price_per_gpu_hour),
        }
        for card in cards
    ]
    return list_envelope(data, count=len(data), include_community=include_community)


class TrackRecordOut(Schema):
    clusters: int = Field(
        description="Clusters of this machine type created in the last 30 days that became "
        "ready or failed before ready (those terminated or stopped before either, and those "
        "still starting, are not counted)."
    )
    started: int = Field(description="Of those, the ones that became ready.")
    started_share: float = Field(description="started / clusters, 0 to 1, to four places.")
    ready_median_seconds: int | None = Field(
        description="The median time from create to ready, whole seconds; null if none started."
    )
    ready_p95_seconds: int | None = Field(
        description="The 95th percentile (nearest rank) of the time to ready, whole seconds."
    )
    ready_median_minutes: int | None = Field(
        description="ready_median_seconds in whole minutes, half up, as the offers page shows "
        "it (0: under a minute); null if none started."
    )
    ready_p95_minutes: int | None = Field(
        description="ready_p95_seconds in whole minutes, half up; null if none started."
    )
    failures_by_step: dict[str, int] = Field(
        description="Clusters that failed before ready, by the step they failed at (running, "
        "agent, network, install)."
    )
    bandwidth_median_mbit: float | None = Field(
        description="The median bandwidth between machines (each machine to node-0) in the "
        "clusters' acceptance reports, Mbit/s; null until there are any."
    )
    computed_at: str


class MachineSpecsOut(Schema):
    """What one machine is sold with (docs/inventory.md, "Machine specs"); each figure null
    where the inventory does not state it."""

    vcpus: int | None = Field(description="vCPUs per machine.")
    memory_gib: int | None = Field(description="Memory (RAM) per machine, GiB.")
    nvme_gib: int | None = Field(description="Local NVMe per machine, GiB (0: none).")
    gpu_link: str | None = Field(
        description="The GPU link inside the machine: nvlink, nvswitch or pcie."
    )
    os_image: str | None = Field(description='The OS image, e.g. "Ubuntu 22.04".')
    driver_version: str | None = Field(
        description="The NVIDIA driver: every node has this version or a newer one (acceptance "
        "fails a node with an older one)."
    )
    cuda_version: str | None = Field(description='The CUDA version of the image, e.g. "12.8".')
    summary: str = Field(
        description='The figures as the dashboard shows them: "208 vCPUs · 1.8 TiB RAM · 2 TiB '
        'NVMe · NVLink · Ubuntu 22.04 · driver 570 · CUDA 12.8" ("" when none is stated).'
    )


class OfferOut(Schema):
    id: str = Field(description="The machine type's slug; pass it as `offer` to create.")
    gpu: str
    gpus_per_machine: int
    location: str
    interconnect: str
    machine_kind: str
    community: bool
    machine_price_per_hour: str
    price_per_hour: str = Field(
        description="The whole cluster: machine price × machines (`nodes`)."
    )
    gpus_total: int = Field(description="Every GPU of the cluster: nodes × gpus_per_machine.")
    gpu_memory_total_gib: int = Field(description="GPU memory in all: gpus_total × the GPU's GiB.")
    price_per_gpu_hour: str = Field(
        description="One GPU for an hour: machine_price_per_hour / gpus_per_machine, USD, exact "
        "(at least 2 decimals, up to 5, e.g. 0.31125); pages show it rounded half up to the cent."
    )
    nodes_available: int | None = Field(
        description="Free machines where the location counts them; null where it only says "
        "whether it has some."
    )
    max_nodes: int
    availability: str = Field(description="available, not_in_stock or reserved_ahead")
    software: list[str]
    specs: MachineSpecsOut = Field(description="What each machine is sold with.")
    track_record: TrackRecordOut | None = Field(
        description="How this machine type's clusters started over the last 30 days; null "
        "below RUNCRATE_TRACK_RECORD_MIN_CLUSTERS clusters (5 by default)."
    )


class OfferListMeta(Schema):
    count: int
    gpu: str
    nodes: int
    include_community: bool
    sort: str
    gpus_per_machine: int | None


class OfferList(Schema):
    data: list[OfferOut]
    meta: OfferListMeta


def offer_json(offer: Offer) -> dict:
    """An offer as the API shows it, everywhere offers appear (also used by other apps)."""
    machine_type = offer.machine_type
    return {
        "id": machine_type.slug,
        "gpu": machine_type.gpu.slug,
        "gpus_per_machine": machine_type.gpus_per_machine,
        "location": machine_type.location.code,
        "interconnect": machine_type.interconnect,
        "machine_kind": machine_type.machine_kind,
        "community": machine_type.community,
        "machine_price_per_hour": money_str(offer.machine_price_per_hour),
        "price_per_hour": money_str(offer.price_per_hour),
        "gpus_total": offer.gpus_total,
        "gpu_memory_total_gib": offer.gpu_memory_total_gib,
        "price_per_gpu_hour": exact_money_str(offer.price_per_gpu_hour),
        "nodes_available": offer.nodes_available,
        "max_nodes": offer.max_nodes,
        "availability": offer.availability.value,
        "software": offer.software,
        "specs": machine_type.specs.as_dict(),
        "track_record": track_record_json(offer.track_record),
    }


def track_record_json(record: OfferTrackRecord | None) -> dict | None:
    if record is None:
        return None
    return {
        "clusters": record.clusters,
        "started": record.started,
        "started_share": float(record.started_share),
        "ready_median_seconds": record.ready_median_seconds,
        "ready_p95_seconds": record.ready_p95_seconds,
        "ready_median_minutes": record.ready_minutes,
        "ready_p95_minutes": record.ready_p95_minutes,
        "failures_by_step": record.failures_by_step,
        "bandwidth_median_mbit": record.bandwidth_median_mbit,
        "computed_at": utc_str(record.computed_at),
    }


def _parse_nodes(raw: str | None) -> int:
    message = f"nodes must be a whole number from {MIN_NODES} to {MAX_NODES}"
    if raw is None or not raw.strip():
        raise ApiError(422, "invalid_nodes", f"Say how many machines: {message}.")
    try:
        nodes = int(raw)
    except ValueError:
        raise ApiError(422, "invalid_nodes", f"{message}; got '{raw}'.") from None
    if nodes < MIN_NODES:
        raise ApiError(422, "invalid_nodes", f"{message}; got {nodes}. {TOO_FEW_NODES}")
    if not MIN_NODES <= nodes <= MAX_NODES:
        raise ApiError(
            422,
            "invalid_nodes",
            f"{message}; got {nodes}. For a bigger cluster, request a quote (POST /api/v1/quotes).",
        )
    return nodes


def _parse_sort(raw: str | None) -> SortBy:
    if raw is None or not raw.strip():
        return SortBy.PRICE
    if raw.strip() not in SortBy.values:
        raise ApiError(
            422,
            "invalid_sort",
            f"sort must be {' or '.join(SortBy.values)}; got '{raw[:40]}'.",
        )
    return SortBy(raw.strip())


def _parse_gpus_per_machine(raw: str | None) -> int | None:
    if raw is None or not raw.strip():
        return None
    if raw.strip() not in {str(n) for n in GPUS_PER_MACHINE}:
        raise ApiError(
            422,
            "invalid_gpus_per_machine",
            f"gpus_per_machine must be 1, 2, 4 or 8; got '{raw[:40]}'.",
        )
    return int(raw)


def _offers_body(
    *,
    gpu: str,
    nodes: int,
    include_community: bool,
    include_drills: bool,
    sort: SortBy,
    gpus_per_machine: int | None,
) -> bytes | None:
    """The answer's body, or None for an unknown GPU."""
    every = list_offers(
        gpu=gpu, nodes=nodes, include_community=include_community, include_drills=include_drills
    )
    if not every and not GpuModel.objects.filter(slug=gpu).exists():
        return None
    found = narrow_offers(every, sort=sort, gpus_per_machine=gpus_per_machine)
    data = [offer_json(offer) for offer in found]
    meta = {
        "count": len(data),
        "gpu": gpu,
        "nodes": nodes,
        "include_community": include_community,
        "sort": sort.value,
        "gpus_per_machine": gpus_per_machine,
    }
    return json.dumps(list_envelope(data, **meta)).encode()


@router.get(
    "/offers",
    auth=needs(Scope.READ),
    response={200: OfferList, 404: ErrorOut},
    summary="List the offers for a GPU and a size",
)
def offers(
    request: ApiRequest,
    gpu: str,
    nodes: str | None = None,
    include_community: bool = False,
    sort: str | None = None,
    gpus_per_machine: str | None = None,
) -> HttpResponse:
    """The offers that can start `nodes` machines of `gpu` now, available first, then by
    cluster price (`sort=price`, the default) or by price per GPU-hour
    (`sort=price_per_gpu_hour`), then location; `gpus_per_machine` (1, 2, 4 or 8) keeps only
    those machines. `nodes` is 2 to 64. The answer may be one tick (about 2 s) old; creating a
    cluster checks the offer again."""
    size = _parse_nodes(nodes)
    order = _parse_sort(sort)
    gpus = _parse_gpus_per_machine(gpus_per_machine)
    drills = sees_drills(user=request.user, project=request.project)

    def compute() -> bytes | None:
        return _offers_body(
            gpu=gpu,
            nodes=size,
            include_community=include_community,
            include_drills=drills,
            sort=order,
            gpus_per_machine=gpus,
        )

    # The hot path of the API: the body is built to OfferList's shape (a test holds it to the
    # schema), kept for a tick per GPU, size, community choice, order and filter, and sent as
    # it was kept.
    if CACHEABLE_SLUG.fullmatch(gpu):
        key = f"api:{gpu}:{size}:{int(include_community)}:{int(drills)}:{order}:{gpus or 0}"
        body = cached(key, compute)
    else:
        body = compute()
    if body is None:
        raise ApiError(404, "unknown_gpu", f"There is no GPU model '{gpu}': see GET /api/v1/gpus.")
    return HttpResponse(body, content_type="application/json")


# --- quotes -------------------------------------------------------------------------------


class QuoteIn(Schema):
    # The limits are documented here and refused by request_quote (422 invalid_request).
    gpu: str = Field(description="A GPU model's slug, from GET /api/v1/gpus.")
    nodes: int = Field(json_schema_extra={"minimum": QUOTE_MIN_NODES, "maximum": QUOTE_MAX_NODES})
    interconnect: str = Field("ethernet", description="ethernet, infiniband or roce")
    location: str | None = Field(None, description="A location's code; leave out for any.")
    start_date: date
    duration_weeks: int = Field(
        json_schema_extra={"minimum": QUOTE_MIN_WEEKS, "maximum": QUOTE_MAX_WEEKS}
    )
    contact_name: str = Field(json_schema_extra={"maxLength": NAME_MAX_LENGTH})
    contact_email: str
    notes: str = Field("", json_schema_extra={"maxLength": NOTES_MAX_LENGTH})


class QuoteOut(Schema):
    id: int
    status: str
    gpu: str
    nodes: int
    interconnect: str
    location: str | None
    start_date: date
    duration_weeks: int
    contact_name: str
    contact_email: str
    notes: str
    created_at: str


class QuoteCreated(Schema):
    data: QuoteOut


class QuoteListMeta(Schema):
    count: int


class QuoteList(Schema):
    data: list[QuoteOut]
    meta: QuoteListMeta


def quote_json(quote: QuoteRequest) -> dict:
    return {
        "id": quote.pk,
        "status": quote.status,
        "gpu": quote.gpu.slug,
        "nodes": quote.nodes,
        "interconnect": quote.interconnect,
        "location": quote.location.code if quote.location else None,
        "start_date": quote.start_date,
        "duration_weeks": quote.duration_weeks,
        "contact_name": quote.contact_name,
        "contact_email": quote.contact_email,
        "notes": quote.notes,
        "created_at": utc_str(quote.created_at),
    }


@router.post(
    "/quotes",
    auth=needs(Scope.CREATE),
    response={201: QuoteCreated, 429: ErrorOut},
    summary="Request a quote",
)
@outages.committing
def create_quote(request: ApiRequest, payload: QuoteIn) -> Status:
    """Ask for reserved capacity, more than 64 machines or InfiniBand/RoCE. The requester
    and the sales team get an email. At most a few requests per project per hour (429)."""
    quote = request_quote(project=request.project, user=request.user, **payload.dict())
    return Status(201, {"data": quote_json(quote)})


@router.get(
    "/quotes",
    auth=needs(Scope.READ),
    response=QuoteList,
    summary="List the project's quote requests",
)
def list_quotes(request: ApiRequest) -> dict:
    data = [quote_json(quote) for quote in quotes_for(request.project)]
    return list_envelope(data, count=len(data))


@router.get(
    "/quotes/{quote_id}",
    auth=needs(Scope.READ),
    response=QuoteCreated,
    summary="Get a quote request",
)
def get_quote(request: ApiRequest, quote_id: int) -> dict:
    try:
        quote = get_for_project(
            request, QuoteRequest.objects.select_related("gpu", "location"), pk=quote_id
        )
    except Http404:
        raise ApiError(404, "not_found", f"There is no quote request {quote_id}.") from None
    return {"data": quote_json(quote)}
