"""Ray on the lab's real hosts: the real installer
(clusters/machines/software/host/install-ray.sh), the
pinned Ray from the lab's package index into its own virtualenv, the head bound to node-0's
private address, the real `ray list nodes` check; a user's job runs through `ray job submit`;
terminate leaves the hosts clean (docs/drivers.md, "Ray on ssh hosts"). Skipped, with the
reason, where the lab cannot start.
"""

from __future__ import annotations

import json

import pytest

from clusters.machines.software import RAY_REQUIREMENT, RAY_VERSION
from clusters.models import Cluster
from lab import hostlab
from offers.models import Host
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

RAY_LEFTOVERS = {
    "ray processes": "! pgrep -f '/opt/runcrate/[r]ay/|[r]aylet|[g]cs_server'",
    "ray session files": "test ! -e /tmp/ray",
    "ray command": "test ! -L /usr/local/bin/ray",
    "ray virtualenv": "test ! -e /opt/runcrate/ray",
}
JOB = "import ray; ray.init(); print('sum', ray.get(ray.remote(lambda: 6 * 7).remote()))"


def ray_logs(lab, cluster: Cluster) -> str:
    logs = []
    for node in cluster.nodes.select_related("host"):
        done = lab.exec(
            node.host.name,
            "tail -n 30 /var/lib/runcrate/software/ray-install.log;"
            " tail -n 20 /tmp/ray/session_latest/logs/raylet.out",
            check=False,
        )
        logs.append(f"--- {node.name} ({node.host.name}):\n{done.stdout}{done.stderr}")
    return "\n".join(logs)


def test_the_lab_index_serves_the_ray_the_product_pins():
    assert RAY_REQUIREMENT in hostlab.PYPI_PACKAGES


def test_a_ray_cluster_runs_a_job_on_real_hosts_and_terminate_wipes_it(fleet, user_key, tmp_path):
    lab = fleet
    cluster = create(project_with(user_key), machine_type("lab-h100x2-vm"), nodes=2, software="ray")
    try:
        drive(cluster, Cluster.Status.READY, Cluster.Status.DEGRADED, Cluster.Status.FAILED)
    except AssertionError as error:
        raise AssertionError(f"{error}\n{ray_logs(lab, cluster)}") from None
    events = "\n".join(
        f"  {e.reason}: {e.message}\n{e.output[-3000:]}" for e in cluster.events.all()
    )
    assert cluster.status == Cluster.Status.READY, f"{events}\n{ray_logs(lab, cluster)}"

    config = ssh_config_file(cluster, tmp_path, user_key, lab)
    # The check's own command, as a user runs it on node-0: both nodes, by their private
    # addresses, each with its 2 GPUs, the head on node-0.
    nodes = json.loads(ssh(config, "node-0", "ray list nodes -f state=ALIVE --format json"))
    by_ip = {n["node_ip"]: n for n in nodes}
    assert sorted(by_ip) == ["10.77.0.1", "10.77.0.2"]
    assert by_ip["10.77.0.1"]["is_head_node"] is True
    assert {n["resources_total"]["GPU"] for n in nodes} == {2.0}
    assert ssh(config, "node-1", "ray --version").endswith(RAY_VERSION)

    # A user's job, submitted the way the connect panel says, runs on the cluster.
    submit = connect_job_submit(cluster)
    out = ssh(config, "node-0", f'{submit} -- python -c "{JOB}"')
    assert "sum 42" in out, out
    assert "succeeded" in out, out

    # Running the installer again changes nothing.
    again = lab.exec(
        Host.objects.get(nodes__cluster=cluster, nodes__index=1).name,
        "sh /var/lib/runcrate/software/install-ray.sh",
        timeout=120,
    )
    assert [line for line in again.stdout.splitlines() if "changed" in line] == [], again.stdout
    assert again.stdout.strip().splitlines()[-1] == "runcrate: ok"

    terminate_and_check(lab, cluster)
    for host in Host.objects.filter(nodes__cluster=cluster):
        left = [
            what
            for what, command in RAY_LEFTOVERS.items()
            if lab.exec(host.name, command, check=False).returncode != 0
        ]
        assert left == [], f"{host.name} keeps {left}"


def connect_job_submit(cluster: Cluster) -> str:
    """The connect panel's `ray job submit` command, without its example entrypoint."""
    from clusters import connect

    shape = connect.shape_for(
        Cluster.objects.select_related("machine_type__location")
        .prefetch_related("nodes", "volumes")
        .get(pk=cluster.pk)
    )
    command = connect.ray_info(shape)["job_submit"]
    assert command.endswith(" -- python script.py"), command
    return command.removesuffix(" -- python script.py").replace(" --working-dir .", "")
