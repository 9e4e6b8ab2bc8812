"""What every page may say about the offers' rules: the self-serve sizes (MIN_NODES to
MAX_NODES machines), so no template writes "2 to 64" itself."""

from django.http import HttpRequest

from offers.models import MAX_NODES, MIN_NODES


def cluster_sizes(request: HttpRequest) -> dict[str, dict[str, int]]:
    return {"cluster_sizes": {"min": MIN_NODES, "max": MAX_NODES}}
