from __future__ import annotations

from datetime import datetime
from typing import TYPE_CHECKING

from clusters.machines.base import Driver, MachineState, Observation, Released
from clusters.machines.simulated import SimulatedDriver
from clusters.machines.ssh import SshDriver

if TYPE_CHECKING:
    from clusters.models import Node
    from offers.models import Host


class UnavailableDriver(Driver):
    """A host registered with a driver this installation cannot run (yet): it never comes up,
    and says why, so the cluster fails with a message instead of waiting for its deadline."""

    name = "unavailable"

    def __init__(self, driver_name: str) -> None:
        self.driver_name = driver_name

    def start(self, node: Node, *, agent_token: str, plan: dict) -> dict:
        return {}

    def observe(self, node: Node, *, now: datetime) -> Observation:
        return Observation(
            MachineState.FAILED,
            since=now,
            message=f"The {self.driver_name!r} driver is not available on this installation.",
        )

    def stop(self, node: Node, *, attempt: int = 1) -> Released:
        # Never started (start does nothing): no tenant ever reached it, so it is as it was
        # registered.
        return Released(pristine=True)


_DRIVERS: dict[str, Driver] = {"simulated": SimulatedDriver(), "ssh": SshDriver()}


def get_driver(host: Host) -> Driver:
    return _DRIVERS.get(host.driver) or UnavailableDriver(host.driver)
