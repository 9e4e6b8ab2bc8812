"""The clusters' derived rules that every caller asks (docs/clusters.md, "The rules in one
place"): which statuses count as running (the machines up and the software settled: the
cluster serves its user). The lifecycle, the metrics and idle watch, the views, the templates
and the API ask here; the API carries the answers (`running`, and `can_terminate`, the
dashboard's own `Cluster.can_terminate`), so the CLI and the MCP server display them instead of
deciding.

Who is told about a cluster is accounts/recipients.py's rule (`told_about`), asked by the
cluster emails (clusters/notifications.py) and the webhooks' switch-off email alike.

The statuses themselves are the model's named groups (`Cluster.RUNNING`, `Cluster.TERMINABLE`:
clusters/models.py, where the model's own checks read them); this module imports nothing but
the models.
"""

from clusters.models import Cluster

# Ready or degraded: the machines that joined are up and the software is settled. What the
# metrics and the idle watch record, the heartbeat watch and the health judgement watch, the
# network test runs on, and the page polls slowly.
RUNNING = Cluster.RUNNING


def is_running(status: str) -> bool:
    """Whether a cluster in `status` is running (ready or degraded)."""
    return status in RUNNING
