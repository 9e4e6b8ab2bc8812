"""Hosts between tenants, as staff run them: record a freshly imaged host's baseline, reimage a
dirty one, and return hosts to the pool only once they are found pristine (docs/inventory.md,
"Reimage before reuse"). Admin's actions and `manage.py record_baselines` call these; the
lifecycle's release reimages and verifies through the driver's `stop`."""

from __future__ import annotations

from dataclasses import dataclass, field

from django.utils import timezone

from clusters.machines import pristine
from clusters.machines.base import DriverError
from clusters.machines.ssh import read_host, reimage_and_verify, verify_host
from offers.inventory import return_hosts_to_service, set_host_dirty
from offers.models import Host


@dataclass
class Outcome:
    """What happened to each host asked about: done, or why not."""

    done: list[str] = field(default_factory=list)
    refused: dict[str, str] = field(default_factory=dict)


def _hosts(host_ids) -> list[Host]:
    return list(
        Host.objects.filter(pk__in=list(host_ids))
        .select_related("machine_type__location")
        .order_by("name")
    )


def _held(host: Host) -> bool:
    """Whether a node holds the host: it is its cluster's lifecycle's, never staff's."""
    return host.nodes.filter(holds_host=True).exists()


def record_baselines(host_ids) -> Outcome:
    """Record what each (freshly imaged) ssh host is now as its baseline. Only a free, dirty or
    offline host that no node holds: a host serving a cluster is the tenant's. Staff vouch that
    the host is as it was imaged; every later verification compares with this."""
    outcome = Outcome()
    for host in _hosts(host_ids):
        if host.driver != Host.Driver.SSH:
            outcome.refused[host.name] = "simulated hosts have no baseline"
            continue
        if host.state not in (Host.State.FREE, Host.State.DIRTY, Host.State.OFFLINE) or _held(host):
            outcome.refused[host.name] = f"it is {host.state}: a cluster holds it"
            continue
        try:
            baseline = read_host(host)
        except DriverError as error:
            outcome.refused[host.name] = error.message
            continue
        Host.objects.filter(pk=host.pk).update(baseline=baseline, baseline_at=timezone.now())
        outcome.done.append(host.name)
    return outcome


def return_to_service(host_ids) -> Outcome:
    """Staff's Mark free: an offline or dirty ssh host is verified against its baseline first
    and goes free only when nothing differs; otherwise it is (or stays) dirty, with what
    differs. Simulated hosts have nothing to verify."""
    outcome = Outcome()
    candidates, verified = [], []
    for host in _hosts(host_ids):
        if host.state not in (Host.State.OFFLINE, Host.State.DIRTY):
            outcome.refused[host.name] = f"it is {host.state}, not offline or dirty"
            continue
        if _held(host):
            outcome.refused[host.name] = "a node still holds it"
            continue
        if host.driver == Host.Driver.SSH:
            try:
                found = verify_host(host)
            except DriverError as error:
                outcome.refused[host.name] = f"it could not be verified: {error.message}"
                continue
            if found:
                set_host_dirty(host, pristine.report(found))
                more = f" (and {len(found) - 1} more)" if len(found) > 1 else ""
                outcome.refused[host.name] = f"it is not pristine: {found[0].message}{more}"
                continue
            verified.append(host.pk)
        candidates.append(host)
    return_hosts_to_service(host_ids=[h.pk for h in candidates], verified=verified)
    free = set(
        Host.objects.filter(pk__in=[h.pk for h in candidates], state=Host.State.FREE).values_list(
            "pk", flat=True
        )
    )
    outcome.done = [h.name for h in candidates if h.pk in free]
    return outcome


def reimage_now(host_ids) -> Outcome:
    """Staff's Reimage: run the host's (or its location's) reimage command on a dirty or
    offline ssh host, verify it, and free it when it is pristine."""
    outcome = Outcome()
    for host in _hosts(host_ids):
        command = host.reimage_command
        if host.driver != Host.Driver.SSH:
            outcome.refused[host.name] = "simulated hosts need no reimage"
            continue
        if host.state not in (Host.State.OFFLINE, Host.State.DIRTY) or _held(host):
            outcome.refused[host.name] = f"it is {host.state}: only dirty or offline hosts"
            continue
        if not command:
            outcome.refused[host.name] = "neither it nor its location has a reimage command"
            continue
        try:
            found = reimage_and_verify(host, command)
        except DriverError as error:
            outcome.refused[host.name] = error.message
            continue
        if found:
            set_host_dirty(host, pristine.report(found))
            outcome.refused[host.name] = f"reimaged, but not pristine: {found[0].message}"
            continue
        return_hosts_to_service(host_ids=[host.pk], verified=[host.pk])
        outcome.done.append(host.name)
    return outcome
