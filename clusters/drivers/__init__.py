"""Drivers start, watch, install and stop the machines behind a cluster's nodes (DESIGN.md).

`get_driver(host)` picks the driver a host is registered with.
"""

from clusters.drivers.base import (
    CheckResult,
    Driver,
    InstallPlan,
    InstallResult,
    Observation,
    PlanNode,
)
from clusters.drivers.registry import get_driver

__all__ = [
    "CheckResult",
    "Driver",
    "InstallPlan",
    "InstallResult",
    "Observation",
    "PlanNode",
    "get_driver",
]
