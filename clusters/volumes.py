"""Volumes (SPEC §6, docs/volumes.md): create, delete, and the rules for attaching one to a
cluster. The Storage page, the API and `clusters.lifecycle.create_cluster` call these; none
re-implements them.

A volume is attached to one cluster at a time, when that cluster is created, and detached when
the cluster ends. Attaching and deleting are conditional updates on the volume row (`WHERE
cluster IS NULL AND deleted_at IS NULL`) whose row count is checked, so a create and a delete
racing for the same volume, or two creates, never both win.

Billing meters the storage (billing/metering.py): a volume is opened there when it is created
and closed when it is deleted, in the same transaction.
"""

from __future__ import annotations

import re
from datetime import datetime
from decimal import Decimal

from django.conf import settings
from django.db import IntegrityError, transaction
from django.db.models import Exists, OuterRef, QuerySet
from django.utils import timezone

from accounts.models import Project
from billing import ledger, meter, metering
from clusters.errors import ClusterRefused
from clusters.models import NAME_RE, Cluster, Volume
from offers.models import Location, MachineType
from offers.visibility import visible_locations
from runcrate.money import usd

CENT = Decimal("0.01")


class VolumeRefused(ClusterRefused):
    """A volume request refused with a stable code; nothing was written."""

    STATUS = {
        **ClusterRefused.STATUS,
        "invalid_name": 422,
        "name_taken": 409,
        "unknown_location": 422,
        "invalid_size": 422,
        "volume_in_use": 409,
        "location_cannot_attach": 422,
    }


def rate(value: Decimal) -> str:
    """A price per GB-month as text: 2 places, or up to the 4 a location's price may have."""
    if value == value.quantize(CENT):
        return f"{value:.2f}"
    return f"{value.normalize():f}"


def live_volumes(project: Project) -> QuerySet[Volume]:
    """The project's volumes that are not deleted, with their location and cluster."""
    return (
        Volume.objects.filter(project=project, deleted_at__isnull=True)
        .select_related("location", "cluster")
        .order_by("name", "pk")
    )


def _attaching_types():
    """Machine types a volume can be attached to when a cluster is created on them: sold
    self-serve (Ethernet) and not community hosts (SPEC §1: no volume on community hosts)."""
    return MachineType.objects.filter(
        community=False, interconnect__in=MachineType.SELF_SERVE_INTERCONNECTS
    )


def why_no_volumes(location: Location) -> str:
    """Why a volume in `location` could never be attached, or "" when some offer there can take
    one. Reads `location.can_attach` and `location.sells` where `volume_locations` set them."""
    can_attach = getattr(location, "can_attach", None)
    sells = getattr(location, "sells", None)
    if can_attach is None:
        can_attach = _attaching_types().filter(location=location).exists()
    if can_attach:
        return ""
    if sells is None:
        sells = MachineType.objects.filter(
            location=location, interconnect__in=MachineType.SELF_SERVE_INTERCONNECTS
        ).exists()
    if sells:
        return (
            f"No offer in {location.code} can attach a volume: its machines are community hosts, "
            "which never get one."
        )
    return f"No machines are offered in {location.code}, so a volume there could not be attached."


def volume_locations() -> list[tuple[Location, str]]:
    """Every location with why a volume cannot be created there ("" where it can), by code, in
    one query: the Storage page shows the ones that cannot as disabled choices. Never a
    failure-drill location (offers/visibility.py): storage is no place for hosts that fail."""
    self_serve = MachineType.objects.filter(
        location=OuterRef("pk"), interconnect__in=MachineType.SELF_SERVE_INTERCONNECTS
    )
    locations = (
        visible_locations(drills=False)
        .annotate(
            can_attach=Exists(_attaching_types().filter(location=OuterRef("pk"))),
            sells=Exists(self_serve),
        )
        .order_by("code")
    )
    return [(location, why_no_volumes(location)) for location in locations]


def _size(raw: object) -> int:
    size = None
    if isinstance(raw, int) and not isinstance(raw, bool):
        size = raw
    elif isinstance(raw, str) and re.fullmatch(r"[0-9]{1,9}", raw.strip()):
        size = int(raw.strip())
    if size is None or not Volume.MIN_GB <= size <= Volume.MAX_GB:
        raise VolumeRefused(
            "invalid_size",
            f"A volume holds {Volume.MIN_GB} to {Volume.MAX_GB:,} GB, in whole GB; "
            f"{raw!r} is not in that range.",
            field="size_gb",
        )
    return size


def _volume_location(code: object) -> Location | None:
    """The location a volume may be created in by its code: never a failure-drill one
    (offers/visibility.py), which reads as unknown."""
    if not isinstance(code, str):
        return None
    return visible_locations(drills=False).filter(code=code).first()


def create_volume(
    *, project: Project, name: str, location: str, size_gb: int | str, now: datetime | None = None
) -> Volume:
    """A new volume of `size_gb` GB in the location with code `location`, billed from now at
    the location's price per GB-month. Raises VolumeRefused (nothing written)."""
    now = now or timezone.now()
    name = name.strip() if isinstance(name, str) else name
    if not isinstance(name, str) or not NAME_RE.fullmatch(name):
        raise VolumeRefused(
            "invalid_name",
            "A volume name is a DNS label: 1-63 lowercase letters, digits and hyphens, starting "
            "and ending with a letter or digit.",
            field="name",
        )
    place = _volume_location(location)
    if place is None:
        raise VolumeRefused(
            "unknown_location",
            f"There is no location {location!r}; pick one of the locations listed.",
            field="location",
        )
    no_volumes = why_no_volumes(place)
    if no_volumes:
        raise VolumeRefused(
            "location_cannot_attach",
            f"{no_volumes} Pick a location where you can create a cluster to attach it to.",
            field="location",
        )
    size = _size(size_gb)
    taken = VolumeRefused(
        "name_taken",
        f"Your project already has a volume named {name!r}; pick another name.",
        field="name",
    )
    if live_volumes(project).filter(name=name).exists():
        raise taken
    try:
        with transaction.atomic():
            # The project's row locked: two creates at once cannot both count on one balance.
            Project.objects.select_for_update().filter(pk=project.pk).exists()
            _require_balance(project=project, place=place, size_gb=size)
            volume = Volume.objects.create(
                project=project,
                name=name,
                location=place,
                size_gb=size,
                price_per_gb_month=place.volume_price_per_gb_month,
                created_at=now,
            )
            metering.open_storage(
                project_id=project.pk,
                volume_id=volume.pk,
                size_gb=volume.size_gb,
                price_per_gb_month=volume.price_per_gb_month,
                at=now,
            )
            return volume
    except IntegrityError:
        # Another request took the name between the check and the insert.
        raise taken from None


def prepaid_days() -> int:
    """How many days of the project's storage the balance must hold to create a volume
    (`RUNCRATE_VOLUME_PREPAID_DAYS`, 7 by default; at least 1)."""
    return settings.RUNCRATE_VOLUME_PREPAID_DAYS


def _require_balance(*, project: Project, place: Location, size_gb: int) -> None:
    """The balance must cover `prepaid_days()` days of the project's storage with the new
    volume counted. A volume is never deleted for lack of balance (its data is kept and the
    balance goes below zero), so this is where storage debt is held back: a volume starts with
    a week of all its project's storage paid for, a week in which the top bar's short-runway
    banner and the low-balance email (both count storage in the burn rate) reach the owner
    before any debt; an account without that much cannot rent storage it would not pay for
    (docs/volumes.md)."""
    kept = live_volumes(project).values_list("price_per_gb_month", "size_gb")
    this_month = place.volume_price_per_gb_month * size_gb
    per_month = this_month + sum((price * size for price, size in kept), Decimal("0"))
    days = prepaid_days()
    needed = meter.storage_for_days(per_month, days)
    balance = ledger.balance(project=project)
    if balance < needed:
        raise VolumeRefused(
            "insufficient_balance",
            f"Your balance is {usd(balance)}; a {size_gb:,} GB volume in {place.code} "
            f"({usd(this_month)} a month) needs at least {usd(needed)}: "
            f"{days} day{'s' if days != 1 else ''} of your volumes' storage, this one "
            "included. Add credit, or make it smaller.",
            field="size_gb",
        )


def delete_volume(*, volume: Volume, now: datetime | None = None) -> Volume:
    """Delete a volume that is not attached; its storage is billed up to now (charged as soon as
    the deletion commits). Raises VolumeRefused (`volume_in_use`) while a cluster holds it."""
    now = now or timezone.now()
    with transaction.atomic():
        deleted = Volume.objects.filter(
            pk=volume.pk, cluster__isnull=True, deleted_at__isnull=True
        ).update(deleted_at=now)
        if deleted:
            metering.close_storage(volume_id=volume.pk, at=now)
    if not deleted:
        volume.refresh_from_db()
        if volume.deleted_at is not None:
            return volume  # deleted already: deleting twice changes nothing
        if volume.cluster is None:
            # Its cluster ended and let it go since the update: it can be deleted now.
            return delete_volume(volume=volume, now=now)
        raise VolumeRefused(
            "volume_in_use",
            f"Volume {volume.name} is attached to cluster {volume.cluster.name}: it cannot be "
            "deleted until that cluster ends. Terminate the cluster first.",
        )
    volume.deleted_at = now
    return volume


# --- attaching ---------------------------------------------------------------------------------


def why_not_attachable(volume: Volume, machine_type: MachineType) -> str:
    """Why `volume` cannot go on a cluster of `machine_type` now, or "" when it can."""
    if machine_type.community:
        return "Volumes cannot be attached on community hosts."
    if volume.location_id != machine_type.location_id:
        return (
            f"{volume.name} is in {volume.location.code}; this offer is in "
            f"{machine_type.location.code}."
        )
    if volume.cluster is not None:
        return f"{volume.name} is attached to {volume.cluster.name}."
    return ""


def volume_to_attach(*, project: Project, volume_id: object, machine_type: MachineType) -> Volume:
    """The project's volume `volume_id`, if it may be attached to a new cluster of
    `machine_type`; raises ClusterRefused (`volume_not_allowed`, `volume_in_use`) otherwise."""
    volume = None
    if isinstance(volume_id, int) and not isinstance(volume_id, bool):
        volume = live_volumes(project).filter(pk=volume_id).first()
    if volume is None:
        raise ClusterRefused(
            "volume_not_allowed",
            f"There is no volume {volume_id!r} in your project.",
            field="volume",
        )
    if machine_type.community:
        raise ClusterRefused(
            "volume_not_allowed",
            "Volumes cannot be attached on community hosts: pick a datacenter offer, or create "
            "the cluster without a volume.",
            field="volume",
        )
    if volume.location_id != machine_type.location_id:
        raise ClusterRefused(
            "volume_not_allowed",
            f"Volume {volume.name} is in {volume.location.name} ({volume.location.code}); this "
            f"offer is in {machine_type.location.name} ({machine_type.location.code}). A volume "
            "is attached only to clusters in its own location.",
            field="volume",
        )
    if volume.cluster_id is not None:
        raise _in_use(volume, volume.cluster)
    return volume


def _in_use(volume: Volume, cluster: Cluster | None) -> ClusterRefused:
    holder = f"cluster {cluster.name}" if cluster else "another cluster"
    return ClusterRefused(
        "volume_in_use",
        f"Volume {volume.name} is attached to {holder}; a volume is attached to one cluster at a "
        "time. Terminate that cluster first, or create this one without the volume.",
        field="volume",
    )


def attach(*, volume: Volume, cluster: Cluster, now: datetime) -> None:
    """Attach inside the cluster's creating transaction; raises ClusterRefused when another
    cluster (or a delete) took the volume since it was checked, which rolls the creation back."""
    taken = Volume.objects.filter(
        pk=volume.pk, cluster__isnull=True, deleted_at__isnull=True
    ).update(cluster=cluster, attached_at=now)
    if not taken:
        current = Volume.objects.select_related("cluster").filter(pk=volume.pk).first()
        if current is None or current.deleted_at is not None:
            raise ClusterRefused(
                "volume_not_allowed",
                f"Volume {volume.name} was deleted a moment ago.",
                field="volume",
            )
        raise _in_use(volume, current.cluster)
    volume.cluster, volume.attached_at = cluster, now


def detach(*, cluster: Cluster) -> int:
    """Detach whatever is attached to `cluster` (it has ended); returns how many."""
    return Volume.objects.filter(cluster=cluster).update(cluster=None, attached_at=None)
