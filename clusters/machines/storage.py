"""Volumes on ssh hosts: a volume's files live on its location's storage host, one folder per
volume (`<storage_path>/v<id>`), and are synced with rsync into `/shared/volume` on the head when
the cluster starts and back before the head is wiped (docs/volumes.md, docs/drivers.md).

The data goes straight between the head and the storage host, never through the dashboard.
For each sync the dashboard (with the operator's key) lets the cluster's own key in on the
storage host, restricted by `rrsync` to that one volume's folder, and takes it away afterwards.
The head checks the storage host's pinned key, as the dashboard does.
"""

from __future__ import annotations

import shlex
from dataclasses import dataclass
from typing import TYPE_CHECKING

from clusters.connect import VOLUME_DIR
from clusters.machines.base import DriverError
from clusters.machines.session import Session, connect

if TYPE_CHECKING:
    from clusters.models import Node, Volume
    from offers.models import Location

# On the head: the storage host's pinned key, and the mark that the volume came in (only a
# volume that came in is synced back: a half-wiped head never overwrites the stored files).
KNOWN_HOSTS = "/etc/runcrate/storage_known_hosts"
PULLED = "/var/lib/runcrate/volume-pulled"
IDENTITY = "/root/.ssh/runcrate_cluster"
# A sync's deadline grows with the volume's size: a start of a few minutes, then SECONDS_PER_GB
# (a volume synced at no less than 50 MB/s), and never more than SYNC_SECONDS_MAX. The head is
# a tenant's: a sync that outlives it is closed by the dashboard (Session.run).
SYNC_SECONDS_BASE = 180.0
SYNC_SECONDS_PER_GB = 20.0
SYNC_SECONDS_MAX = 3600.0  # inside the longest work (rules.LONGEST_WORK_SECONDS), with the wipe
# A stop whose sync back fails is tried again (the release retries it after a few seconds)
# this many times in all before the machine is wiped anyway, the volume keeping its old copy;
# fewer than the release's own attempts (clusters/lifecycle/rules.py RELEASE_ATTEMPTS).
SYNC_ATTEMPTS = 2


@dataclass(frozen=True)
class Store:
    """Where one volume's files are: the storage host, and the folder for this volume."""

    address: str
    port: int
    host_key: str
    folder: str

    @classmethod
    def for_volume(cls, volume: Volume, location: Location) -> Store | None:
        if not location.storage_host:
            return None  # the location keeps no files (the simulated data center)
        address, _, port = location.storage_host.rpartition(":")
        return cls(
            address=address.strip("[]"),
            port=int(port),
            host_key=location.storage_host_key,
            folder=f"{location.storage_path.rstrip('/')}/v{volume.pk}",
        )

    @property
    def known_name(self) -> str:
        return self.address if self.port == 22 else f"[{self.address}]:{self.port}"

    def session(self):
        return connect(
            address=self.address,
            port=self.port,
            user="root",
            host_key=self.host_key,
            name=f"storage host {self.address}",
        )


def synced_volume(node: Node) -> tuple[Volume, Store] | None:
    """The volume attached to the node's cluster and where its files are, for node-0 of a
    location with a storage host; None where there is nothing to sync."""
    if node.index != 0:
        return None
    volume = node.cluster.volumes.filter(deleted_at__isnull=True).first()
    if volume is None:
        return None
    store = Store.for_volume(volume, node.cluster.machine_type.location)
    return None if store is None else (volume, store)


def _tag(node: Node, volume: Volume) -> str:
    return f"runcrate-c{node.cluster_id}-v{volume.pk}"


def _grant(store: Store, public_key: str, tag: str) -> None:
    """Let the cluster's key in on the storage host, for rsync into this volume's folder only."""
    entry = f'restrict,command="/usr/bin/rrsync {store.folder}" {public_key} {tag}'
    script = (
        "set -e; umask 077; "
        "test -x /usr/bin/rrsync || { echo 'no /usr/bin/rrsync (the rsync package)'; exit 1; }; "
        f"mkdir -p {shlex.quote(store.folder)}; mkdir -p /root/.ssh; "
        "touch /root/.ssh/authorized_keys; "
        f"grep -qxF {shlex.quote(entry)} /root/.ssh/authorized_keys "
        f"|| echo {shlex.quote(entry)} >> /root/.ssh/authorized_keys"
    )
    with store.session() as session:
        status, output = session.run(script, timeout=60)
    if status != 0:
        raise DriverError(f"the storage host {store.address} refused the volume: {output.strip()}")


def _revoke(store: Store, tag: str) -> None:
    script = (
        "f=/root/.ssh/authorized_keys; [ -f $f ] || exit 0; "
        f"grep -v -- ' {tag}$' $f > $f.runcrate || true; cat $f.runcrate > $f; rm -f $f.runcrate"
    )
    with store.session() as session:
        session.run(script, timeout=60)


def _rsync(store: Store, *, source: str, target: str, whole: bool = False) -> str:
    """`whole`: the target's files change only once every file came over (rsync puts the new
    ones aside and renames them, and deletes, at the end), so a sync that breaks half-way
    leaves the volume's copy as it was."""
    ssh = (
        f"ssh -i {IDENTITY} -p {store.port} -o BatchMode=yes -o StrictHostKeyChecking=yes "
        f"-o UserKnownHostsFile={KNOWN_HOSTS} -o ConnectTimeout=10"
    )
    at_the_end = "--delay-updates --delete-delay " if whole else ""
    return f"rsync -a --delete {at_the_end}-e {shlex.quote(ssh)} {source} {target} 2>&1"


def _remote(store: Store) -> str:
    # rrsync roots every path in the volume's folder: "./" is the folder itself.
    return f"root@{store.address}:./"


def sync_seconds(volume: Volume) -> float:
    """How long one sync of `volume` may take, from its size."""
    return min(SYNC_SECONDS_BASE + SYNC_SECONDS_PER_GB * volume.size_gb, SYNC_SECONDS_MAX)


def pull(node: Node, session: Session, public_key: str, synced: tuple[Volume, Store]) -> str:
    """Bring the volume's files (`synced_volume(node)`) into /shared/volume on node-0, once per
    cluster. Returns what was done, for the start's record; raises DriverError when the sync
    fails (the start is tried again)."""
    volume, store = synced
    status, _ = session.run(f"test -e {PULLED}", timeout=30)
    if status == 0:
        return f"volume {volume.name} is in {VOLUME_DIR}"
    tag = _tag(node, volume)
    try:
        _grant(store, public_key, tag)
        known = f"{store.known_name} {store.host_key}\n"
        status, output = session.run(
            f"mkdir -p {VOLUME_DIR} /var/lib/runcrate && cat > {KNOWN_HOSTS} && "
            f"{_rsync(store, source=_remote(store), target=f'{VOLUME_DIR}/')} && touch {PULLED}",
            stdin=known,
            timeout=sync_seconds(volume),
        )
    finally:
        _revoke(store, tag)
    if status != 0:
        last = output.strip().splitlines()[-1] if output.strip() else "no output"
        raise DriverError(
            f"volume {volume.name} could not be synced in from the storage host "
            f"{store.address}: {last}",
            output=output[-20_000:],
        )
    return f"volume {volume.name} synced into {VOLUME_DIR}"


def push(
    node: Node, session: Session, public_key: str, synced: tuple[Volume, Store]
) -> tuple[str, str] | None:
    """Sync /shared/volume on node-0 back to the volume (`synced_volume(node)`) before the
    wipe. Returns a warning and the output (the files stay as they were on the storage host)
    when it could not; None otherwise."""
    volume, store = synced
    status, _ = session.run(f"test -e {PULLED} -a -d {VOLUME_DIR}", timeout=30)
    if status != 0:
        return None  # it never came in (or a wipe has begun): nothing to sync back
    tag = _tag(node, volume)
    try:
        try:
            _grant(store, public_key, tag)
            status, output = session.run(
                _rsync(store, source=f"{VOLUME_DIR}/", target=_remote(store), whole=True),
                timeout=sync_seconds(volume),
            )
        finally:
            _revoke(store, tag)
    except DriverError as error:
        status, output = 1, error.message
    if status != 0:
        last = output.strip().splitlines()[-1] if output.strip() else "no output"
        return (
            f"Volume {volume.name} could not be synced back from {VOLUME_DIR} on node-0 ({last}); "
            "it keeps the files it had when this cluster started.",
            output[-20_000:],
        )
    return None
