"""The machines behind a cluster's nodes: the drivers that start, watch, install and stop them
(DESIGN.md), the scripts and software checks they run on a host, the on-host agent program, the
pristine reader that proves a host is as its baseline, and the care of hosts between tenants.
It talks to hosts and knows no cluster rule: it reads the models it is handed, and nothing in it
imports the lifecycle, telemetry or the web.

`get_driver(host)` picks the driver a host is registered with.
"""

from clusters.machines.base import (
    CheckResult,
    Driver,
    InstallPlan,
    InstallResult,
    Observation,
    PlanNode,
)
from clusters.machines.registry import get_driver

__all__ = [
    "CheckResult",
    "Driver",
    "InstallPlan",
    "InstallResult",
    "Observation",
    "PlanNode",
    "get_driver",
]
