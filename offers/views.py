from django.contrib import messages
from django.contrib.auth.decorators import login_required
from django.http import HttpResponse
from django.shortcuts import redirect, render

from accounts.projects import require_project
from accounts.requests import ProjectRequest
from offers.forms import SIZE_QUICK_PICKS, PickerForm, QuoteForm, quote_initial
from offers.models import TOO_FEW_NODES
from offers.offers import (
    GPUS_PER_MACHINE,
    GpuCard,
    SortBy,
    buyer_order,
    cached,
    cached_offers,
    cards_key,
    compare_features,
    gpu_cards,
    narrow_offers,
)
from offers.quotes import QuoteInvalid, QuoteRateLimited, quotes_for, request_quote
from offers.visibility import sees_drills


def _swaps_region(request: ProjectRequest) -> bool:
    # A history restore asks for the whole page even though htmx sends it.
    return bool(request.htmx) and not request.htmx.history_restore_request


def _choose_card(cards: list[GpuCard], slug: str) -> tuple[GpuCard | None, str]:
    """The card the picker shows offers for, and the message when `slug` names none."""
    if slug:
        for card in cards:
            if card.gpu.slug == slug:
                return card, ""
        return None, f"Unknown GPU '{slug}': pick one of the GPUs below."
    first = next((c for c in cards if c.has_offers), None) or next(iter(cards), None)
    return first, ""


def _too_few(form: PickerForm) -> str:
    """The message for a size below the minimum (not "request a quote"), or ""."""
    errors = form.errors.as_data().get("nodes", [])
    return TOO_FEW_NODES if any(e.code == "min_value" for e in errors) else ""


@login_required
def picker(request: ProjectRequest) -> HttpResponse:
    """Create cluster, step one: a GPU and a size, and the offers that can start now (as they
    were at most one tick ago: the create form checks its offer again)."""
    form = PickerForm(request.GET)
    form.is_valid()
    community = form.cleaned_data.get("community", False)
    nodes = form.cleaned_data.get("nodes")
    drills = sees_drills(user=request.user, project=request.project)
    every_card = cached(
        cards_key(include_community=community, include_drills=drills),
        lambda: gpu_cards(include_community=community, include_drills=drills),
    )
    cards = buyer_order([card for card in every_card if card.listed])
    card, gpu_error = _choose_card(cards, form.cleaned_data.get("gpu") or "")
    offers = every_offer = []
    if card is not None and nodes is not None:
        every_offer = cached_offers(
            gpu=card.gpu, nodes=nodes, include_community=community, include_drills=drills
        )
        offers = narrow_offers(
            every_offer, sort=form.sort_by, gpus_per_machine=form.gpus_per_machine
        )
    available = [o for o in offers if o.is_available]
    context = {
        "form": form,
        "cards": cards,
        "card": card,
        "gpu_error": gpu_error,
        "nodes": nodes,
        "shown_nodes": nodes if nodes is not None else form["nodes"].value(),
        "nodes_error": form.errors.get("nodes", [""])[0],
        "too_few_nodes": _too_few(form),
        "community": community,
        "quick_picks": SIZE_QUICK_PICKS,
        "offers": offers,
        "every_offer": every_offer,
        "sort": form.sort_by,
        "sorts": SortBy.choices,
        "sort_error": form.errors.get("sort", [""])[0],
        "gpus": form.gpus_per_machine,
        "gpu_choices": GPUS_PER_MACHINE,
        "gpus_error": form.errors.get("gpus", [""])[0],
        "available": available,
        "unavailable": [o for o in offers if not o.is_available],
        "shows_community": any(o.machine_type.community for o in offers),
        "features": compare_features(offers),
    }
    template = "offers/picker.html#offers" if _swaps_region(request) else "offers/picker.html"
    return render(request, template, context)


@login_required
def quote(request: ProjectRequest) -> HttpResponse:
    """Request a quote: stored, acknowledged by email, sent to sales, listed for the user."""
    if request.method == "POST":
        project = require_project(request)  # a 404 for a user in no project, as on every page
        form = QuoteForm(request.POST)
        status = 422
        if form.is_valid():
            try:
                created = request_quote(project=project, user=request.user, **form.cleaned_data)
            except QuoteInvalid as exc:
                form.add_error(exc.field, exc.problem)
            except QuoteRateLimited as exc:
                form.add_error(None, exc.message)
                status = 429
            else:
                messages.success(
                    request,
                    f"Quote request sent. Our team will reply to {created.contact_email}; "
                    "a copy is in your inbox.",
                )
                return redirect("offers:quotes")
        return render(request, "offers/quote.html", {"form": form}, status=status)
    form = QuoteForm(
        initial=quote_initial(
            request.GET, user_email=request.user.email, user_name=request.user.name
        )
    )
    return render(request, "offers/quote.html", {"form": form})


@login_required
def quotes(request: ProjectRequest) -> HttpResponse:
    """The project's quote requests and their status (a 404 for a user in no project)."""
    quotes = quotes_for(require_project(request))
    return render(request, "offers/quotes.html", {"quotes": quotes})
