"""What every page may say about the offers' rules: the self-serve sizes (MIN_NODES to
MAX_NODES machines), so no template writes "2 to 64" itself, and what the self-serve Ethernet
network suits, so no template words it on its own."""

from django.http import HttpRequest

from offers.models import MAX_NODES, MIN_NODES
from offers.offers import ETHERNET_NOT_BUILT_FOR, ETHERNET_SUITS


def cluster_sizes(request: HttpRequest) -> dict[str, dict[str, int]]:
    return {"cluster_sizes": {"min": MIN_NODES, "max": MAX_NODES}}


def network_terms(request: HttpRequest) -> dict[str, dict[str, str]]:
    return {"network_terms": {"suits": ETHERNET_SUITS, "not_built_for": ETHERNET_NOT_BUILT_FOR}}
