"""How long a cluster takes to be ready: an estimate shown before it is created (the create
form) and counted down while it starts (the cluster page). The rules: docs/clusters.md, "Time
to ready".

It is an estimate of the usual path, not a limit: the lifecycle's deadlines (docs/lifecycle.md)
are what fail a cluster, and they are looser (two boot times to run, one more each for the
agents and the network, nothing past `give_up_at`; 15 minutes to install)."""

from datetime import datetime, timedelta

from django.conf import settings

from clusters.models import Cluster, Node

# After its machines are up, a cluster waits for every agent to check in and for the network
# report of every node: about a quarter of the boot time each (a bootstrap over SSH, then a
# reachability test between the nodes), as the simulated data center takes them.
CHECKS_SHARE_OF_BOOT = 0.5
# Installing the software once every machine joined: its packages come from the location's
# mirror, then the service starts on every node and the readiness check passes (the installers
# wait up to 180 s for the Kubernetes API and up to 300 s for a Ray head). The install deadline
# is INSTALL_SECONDS (15 minutes).
INSTALL_ESTIMATE_SECONDS = 180


def _scaled(seconds: float) -> timedelta:
    """The demo's simulated data center runs RUNCRATE_SIM_SPEED times faster (1 in production),
    and so does its estimate, which would otherwise read minutes for what takes seconds."""
    return timedelta(seconds=round(seconds / settings.RUNCRATE_SIM_SPEED))


def install_estimate(software: str) -> timedelta:
    if software == Cluster.Software.NONE:
        return timedelta(0)
    return _scaled(INSTALL_ESTIMATE_SECONDS)


def real_time_to_ready(*, boot_seconds: int, software: str) -> timedelta:
    """`time_to_ready` at real speed, whatever RUNCRATE_SIM_SPEED says: what a track record of
    real machines reads (and the demo's made-up history, clusters/demo_history.py, follows)."""
    install = 0 if software == Cluster.Software.NONE else INSTALL_ESTIMATE_SECONDS
    return timedelta(seconds=round(boot_seconds * (1 + CHECKS_SHARE_OF_BOOT) + install))


def time_to_ready(*, boot_seconds: int, software: str) -> timedelta:
    """From creation to ready: the machines boot, the agents check in and the network is
    tested, then the software (if any) installs; divided by RUNCRATE_SIM_SPEED, as the
    simulated data center is (the demo's speed-up: `sim_speed`)."""
    return _scaled(boot_seconds * (1 + CHECKS_SHARE_OF_BOOT)) + install_estimate(software)


def sim_speed() -> float | None:
    """How many times faster than real the simulated data center runs, where it does (the demo,
    `make run`: 30); None at real speed. The create form says so beside its estimate, so the
    demo's seconds never sit unexplained beside a track record's minutes."""
    speed = float(settings.RUNCRATE_SIM_SPEED)
    return speed if speed != 1 else None


def ready_by(cluster: Cluster, nodes: list[Node]) -> datetime | None:
    """When a starting cluster should be ready, for the page to count down to: from its creation
    while it provisions; while it installs, from when its nodes' install began (a retried
    install starts again); None otherwise. `nodes` are the cluster's nodes, read already."""
    if cluster.status == Cluster.Status.PROVISIONING:
        boot = cluster.machine_type.boot_seconds
        return cluster.created_at + time_to_ready(boot_seconds=boot, software=cluster.software)
    if cluster.status == Cluster.Status.INSTALLING:
        installing = [n.step_started_at for n in nodes if n.step == Node.Step.INSTALL]
        began = max(installing, default=cluster.joined_at)
        return began + install_estimate(cluster.software) if began else None
    return None
