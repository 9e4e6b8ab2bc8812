"""/shared and volumes on the lab's real hosts (docs/drivers.md, docs/volumes.md): node-0's
folder mounted on the others over the private network (sshfs: the lab's kernel has no NFS
server), and a volume's files kept on the lab's storage host (lab-store), synced into
/shared/volume with rsync when a cluster starts and back before its head is wiped. Skipped,
with the reason, where the lab cannot start.
"""

from __future__ import annotations

import pytest

from clusters import connect, volumes
from clusters.machines import storage
from clusters.models import Cluster, Event
from lab import hostlab
from tests.clusters.lifecycle_kit import create
from tests.clusters.test_ssh_lab import (
    drive,
    machine_type,
    project_with,
    ssh,
    ssh_config_file,
    terminate_and_check,
)

pytestmark = [pytest.mark.lab, pytest.mark.django_db(transaction=True)]


def ready_cluster(project, **extra) -> Cluster:
    cluster = create(project, machine_type("lab-h100x2-vm"), nodes=2, **extra)
    drive(cluster, Cluster.Status.READY, Cluster.Status.DEGRADED, Cluster.Status.FAILED)
    events = "\n".join(
        f"  {e.reason}: {e.message}\n{e.output[-2000:]}" for e in cluster.events.all()
    )
    assert cluster.status == Cluster.Status.READY, events
    return cluster


def on_store(lab, command: str, check: bool = True):
    return lab.exec(hostlab.STORAGE_NAME, command, check=check)


def test_a_file_written_to_shared_on_node_1_is_read_on_node_0(fleet, user_key, tmp_path):
    lab = fleet
    cluster = ready_cluster(project_with(user_key))
    config = ssh_config_file(cluster, tmp_path, user_key, lab)

    ssh(config, "node-1", "echo written-on-node-1 > /shared/note.txt")
    assert ssh(config, "node-0", "cat /shared/note.txt") == "written-on-node-1"
    ssh(config, "node-0", "echo and-back > /shared/reply.txt")
    assert ssh(config, "node-1", "cat /shared/reply.txt") == "and-back"
    # The hostfile every node reads is node-0's, through the mount.
    assert ssh(config, "node-1", "cat /shared/hostfile") == ssh(
        config, "node-0", "cat /shared/hostfile"
    )
    mount = ssh(config, "node-1", "grep ' /shared ' /proc/mounts")
    assert mount.startswith("root@10.77.0.1:/shared /shared fuse.sshfs "), mount

    # Which way it is shared is recorded: in the acceptance report and the node plan.
    cluster.refresh_from_db()
    rows = {row["name"]: row for row in cluster.acceptance["nodes"]}
    assert rows["node-1"]["shared"] == "sshfs"
    shape = connect.shape_for(
        Cluster.objects.prefetch_related("nodes", "volumes").get(pk=cluster.pk)
    )
    plan = connect.node_plan(shape, shape.nodes[1])
    assert plan["mounts"] == [
        {"path": "/shared", "export": False, "source": "node-0", "method": "sshfs"}
    ]
    assert "(sshfs)" in connect.storage(shape)["summary"]

    terminate_and_check(lab, cluster)  # /shared unmounted and gone on both hosts


def test_a_volume_outlives_its_cluster_on_the_storage_host(fleet, user_key, tmp_path):
    lab = fleet
    project = project_with(user_key)
    volume = volumes.create_volume(project=project, name="data", location="lab", size_gb=1)
    first = ready_cluster(project, volume_id=volume.pk)
    config = ssh_config_file(first, tmp_path, user_key, lab)
    ssh(
        config,
        "node-0",
        "mkdir -p /shared/volume/run1 && echo checkpoint-1 > /shared/volume/run1/ckpt",
    )
    # Written on node-1 through /shared: it lands in node-0's copy of the volume.
    ssh(config, "node-1", "echo from-node-1 > /shared/volume/node1.txt")
    terminate_and_check(lab, first)

    folder = f"{hostlab.STORAGE_PATH}/v{volume.pk}"
    assert on_store(lab, f"cat {folder}/run1/ckpt").stdout.strip() == "checkpoint-1"
    assert on_store(lab, f"cat {folder}/node1.txt").stdout.strip() == "from-node-1"
    # The cluster's key was let in for the syncs only.
    assert f"runcrate-c{first.pk}-v" not in on_store(lab, "cat /root/.ssh/authorized_keys").stdout

    volume.refresh_from_db()
    assert volume.cluster_id is None  # detached: free for the next cluster
    second = ready_cluster(project, volume_id=volume.pk)
    config = ssh_config_file(second, tmp_path, user_key, lab)
    assert ssh(config, "node-0", "cat /shared/volume/run1/ckpt") == "checkpoint-1"
    assert ssh(config, "node-0", "cat /shared/volume/node1.txt") == "from-node-1"
    ssh(config, "node-0", "rm /shared/volume/node1.txt && echo 2 > /shared/volume/run2")
    terminate_and_check(lab, second)
    listing = on_store(lab, f"cd {folder} && find . -type f | sort").stdout.split()
    assert listing == ["./run1/ckpt", "./run2"]


def test_a_sync_back_that_fails_keeps_the_stored_files_says_so_and_still_terminates(
    fleet, user_key, tmp_path
):
    lab = fleet
    project = project_with(user_key)
    volume = volumes.create_volume(project=project, name="keep", location="lab", size_gb=1)
    folder = f"{hostlab.STORAGE_PATH}/v{volume.pk}"
    on_store(lab, f"mkdir -p {folder} && echo original > {folder}/file")
    cluster = ready_cluster(project, volume_id=volume.pk)
    config = ssh_config_file(cluster, tmp_path, user_key, lab)
    assert ssh(config, "node-0", "cat /shared/volume/file") == "original"
    ssh(config, "node-0", "echo changed > /shared/volume/file")
    # The storage host's rrsync breaks: the sync back is refused.
    on_store(lab, "chmod -x /usr/bin/rrsync")
    try:
        terminate_and_check(lab, cluster)
    finally:
        on_store(lab, "chmod +x /usr/bin/rrsync")
    assert cluster.status == Cluster.Status.TERMINATED
    event = Event.objects.get(cluster=cluster, reason=Event.Reason.VOLUME_SYNC_FAILED)
    assert event.node.name == "node-0"
    assert event.message.startswith("Volume keep could not be synced back from /shared/volume")
    assert "rrsync" in event.output
    # It was tried again before node-0 was reimaged, and the stored copy is the old one, whole.
    assert cluster.nodes.get(index=0).driver_state["stop"]["attempts"] == storage.SYNC_ATTEMPTS
    assert on_store(lab, f"cat {folder}/file").stdout.strip() == "original"
    # The refused grant left no way in for the cluster's key.
    assert f"runcrate-c{cluster.pk}-v" not in on_store(lab, "cat /root/.ssh/authorized_keys").stdout
