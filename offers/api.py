"""The catalog and offers API: `/api/v1/gpus`, `/api/v1/offers`, `/api/v1/quotes`."""

import json
from datetime import date

from django.http import Http404, HttpRequest, HttpResponse
from ninja import Field, Router, Schema, Status

from accounts.projects import get_for_project
from offers.models import MAX_NODES, MIN_NODES, TOO_FEW_NODES, GpuModel, QuoteRequest
from offers.offers import CACHEABLE_SLUG, Offer, cached, cards_key, gpu_cards, list_offers
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
from runcrate.api import ApiError, ErrorOut, Scope, list_envelope, money_str, needs, utc_str

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
def list_gpus(request: HttpRequest, include_community: bool = False) -> dict:
    """Every GPU model, with the lowest machine price and the GPU counts of its self-serve
    offers (community hosts included only when asked). The answer may be one tick old."""
    cards = cached(
        cards_key(include_community=include_community),
        lambda: gpu_cards(include_community=include_community),
    )
    data = [
        {
            "slug": card.gpu.slug,
            "name": card.gpu.name,
            "memory_gib": card.gpu.memory_gib,
            "lowest_machine_price_per_hour": money_str(card.lowest_machine_price),
            "gpu_counts": list(card.gpu_counts),
        }
        for card in cards
    ]
    return list_envelope(data, count=len(data), include_community=include_community)


class OfferOut(Schema):
    id: str = Field(description="The machine type's slug; pass it as `offer` to create.")
    gpu: str
    gpus_per_machine: int
    location: str
    interconnect: str
    machine_kind: str
    community: bool
    machine_price_per_hour: str
    price_per_hour: str = Field(description="The whole cluster: machine price × nodes.")
    nodes_available: int | None = Field(
        description="Free machines where the location counts them; null where it only says "
        "whether it has some."
    )
    max_nodes: int
    availability: str = Field(description="available, not_in_stock or reserved_ahead")
    software: list[str]


class OfferListMeta(Schema):
    count: int
    gpu: str
    nodes: int
    include_community: bool


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
        "nodes_available": offer.nodes_available,
        "max_nodes": offer.max_nodes,
        "availability": offer.availability.value,
        "software": offer.software,
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


def _offers_body(*, gpu: str, nodes: int, include_community: bool) -> bytes | None:
    """The answer's body, or None for an unknown GPU."""
    found = list_offers(gpu=gpu, nodes=nodes, include_community=include_community)
    if not found and not GpuModel.objects.filter(slug=gpu).exists():
        return None
    data = [offer_json(offer) for offer in found]
    meta = {"count": len(data), "gpu": gpu, "nodes": nodes, "include_community": include_community}
    return json.dumps(list_envelope(data, **meta)).encode()


@router.get(
    "/offers",
    auth=needs(Scope.READ),
    response={200: OfferList, 404: ErrorOut},
    summary="List the offers for a GPU and a size",
)
def offers(
    request: HttpRequest,
    gpu: str,
    nodes: str | None = None,
    include_community: bool = False,
) -> HttpResponse:
    """The offers that can start `nodes` machines of `gpu` now, available first, then by
    cluster price, then location. `nodes` is 2 to 64. The answer may be one tick (about 2 s)
    old; creating a cluster checks the offer again."""
    size = _parse_nodes(nodes)

    def compute() -> bytes | None:
        return _offers_body(gpu=gpu, nodes=size, include_community=include_community)

    # The hot path of the API: the body is built to OfferList's shape (a test holds it to the
    # schema), kept for a tick per GPU, size and community choice, and sent as it was kept.
    if CACHEABLE_SLUG.fullmatch(gpu):
        body = cached(f"api:{gpu}:{size}:{int(include_community)}", compute)
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
def create_quote(request: HttpRequest, payload: QuoteIn) -> Status:
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
def list_quotes(request: HttpRequest) -> dict:
    data = [quote_json(quote) for quote in quotes_for(request.project)]
    return list_envelope(data, count=len(data))


@router.get(
    "/quotes/{quote_id}",
    auth=needs(Scope.READ),
    response=QuoteCreated,
    summary="Get a quote request",
)
def get_quote(request: HttpRequest, quote_id: int) -> dict:
    try:
        quote = get_for_project(
            request, QuoteRequest.objects.select_related("gpu", "location"), pk=quote_id
        )
    except Http404:
        raise ApiError(404, "not_found", f"There is no quote request {quote_id}.") from None
    return {"data": quote_json(quote)}
