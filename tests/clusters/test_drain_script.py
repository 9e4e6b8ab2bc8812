"""Draining a node (issue 36, "Drain at once"): drain.sh on the head, and the drivers' `drain`.

Slurm, k3s and a Ray cluster cannot run in these tests, so drain.sh runs under `sh` with
STAND-INS first on PATH: small sh scripts named `sinfo`, `scontrol`, `kubectl`, `ssh`, `pgrep`
and `ray` that write their argv to a file and answer from state files. The `ssh` stand-in plays
each node: it runs the command drain.sh sends on this machine, with the node's /etc/runcrate
mapped into the test's folder, where the `pgrep` and `ray` stand-ins keep that node's raylet
(a file). drain.sh's shellcheck run is test_kubernetes_install.py's, over every host script."""

from __future__ import annotations

import subprocess
from contextlib import contextmanager
from pathlib import Path

import pytest

from clusters.machines import ssh
from clusters.machines.base import InstallPlan, PlanNode
from clusters.machines.simulated import SimulatedDriver
from tests.clusters.lifecycle_kit import create, inventory, node

SCRIPT = ssh.SCRIPTS / "drain.sh"
ECC = "GPU 1 reports 3 uncorrectable ECC errors"

# What every stand-in shares: its argv written as one line, words separated by tabs.
RECORD = """#!/bin/sh
record() {
  { printf '%s' "${0##*/}"; printf '\\t%s' "$@"; printf '\\n'; } >> "$STANDIN_ROOT/calls"
}
"""
STAND_INS = {
    # drain.sh runs as root; these tests do not.
    "id": "echo 0\n",
    # Slurm: sinfo answers from a table, or as a controller that does not answer; scontrol
    # fails where told to.
    "sinfo": """record "$@"
if [ -f "$STANDIN_ROOT/sinfo-fails" ]; then
  echo "slurm_load_partitions: Unable to contact slurm controller" >&2; exit 1
fi
cat "$STANDIN_ROOT/sinfo"
""",
    "scontrol": """record "$@"
if [ -f "$STANDIN_ROOT/scontrol-fails" ]; then
  echo "slurm_update error: Invalid node state specified" >&2; exit 1
fi
""",
    # k3s: `kubectl get nodes` answers from a table; the rest is recorded.
    "kubectl": 'record "$@"\n[ "$1" != get ] || cat "$STANDIN_ROOT/kubectl-nodes"\n',
    # ssh plays the node it is asked for: unreachable where told to, else it runs the command
    # here with /etc/runcrate under hosts/NODE/.
    "ssh": """record "$@"
while [ "$1" = -o ]; do shift 2; done
host=$1; shift
home="$STANDIN_ROOT/hosts/$host"
if [ -f "$home/unreachable" ]; then
  echo "ssh: connect to host $host port 22: Connection timed out" >&2; exit 255
fi
mkdir -p "$home/etc"
command=$(printf '%s' "$*" | sed "s#/etc/runcrate#$home/etc#g")
STANDIN_NODE=$host exec sh -c "$command"
""",
    "pgrep": '[ -f "$STANDIN_ROOT/hosts/$STANDIN_NODE/raylet" ]\n',
    "ray": """record "$STANDIN_NODE" "$@"
case "$1" in
  stop) rm -f "$STANDIN_ROOT/hosts/$STANDIN_NODE/raylet" ;;
  start) touch "$STANDIN_ROOT/hosts/$STANDIN_NODE/raylet" ;;
esac
""",
}


class Head:
    """A head's folder for drain.sh, with the stand-ins and their state."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self.folder = root / "drain"
        self.bin = root / "bin"
        self.folder.mkdir()
        self.bin.mkdir()
        for name, body in STAND_INS.items():
            tool = self.bin / name
            tool.write_text(RECORD + body)
            tool.chmod(0o755)
        (self.folder / "drain.sh").write_text(SCRIPT.read_text())

    def run(
        self, *, software: str, nodes: int, drained: dict[str, str]
    ) -> subprocess.CompletedProcess:
        """drain.sh with the files SshDriver.drain uploads for this plan and `drained`."""
        plan = InstallPlan(
            cluster_name="train",
            software=software,
            gpus_per_machine=8,
            boot_seconds=180,
            nodes=[
                PlanNode(f"node-{i}", f"10.77.0.{i + 1}", 8, is_head=i == 0) for i in range(nodes)
            ],
        )
        (self.folder / "drain.env").write_text(ssh.drain_env(plan))
        (self.folder / "drain.list").write_text(ssh.drain_list(drained))
        return self.run_script()

    def run_script(self) -> subprocess.CompletedProcess:
        """drain.sh with the files in its folder, the stand-ins first on PATH."""
        (self.root / "calls").unlink(missing_ok=True)
        return subprocess.run(
            ["sh", str(self.folder / "drain.sh")],
            capture_output=True,
            text=True,
            timeout=60,
            env={"PATH": f"{self.bin}:/usr/bin:/bin", "STANDIN_ROOT": str(self.root)},
        )

    def calls(self, tool: str) -> list[list[str]]:
        path = self.root / "calls"
        lines = path.read_text().splitlines() if path.exists() else []
        return [line.split("\t")[1:] for line in lines if line.split("\t")[0] == tool]

    def state(self, name: str, text: str) -> None:
        (self.root / name).write_text(text)

    def node_home(self, name: str) -> Path:
        home = self.root / "hosts" / name
        (home / "etc").mkdir(parents=True, exist_ok=True)
        return home


@pytest.fixture
def head(tmp_path) -> Head:
    return Head(tmp_path)


def said(done) -> list[str]:
    return done.stdout.strip().splitlines()


# --- Slurm ---------------------------------------------------------------------------------------


SINFO = (
    "node-0|idle|\n"
    f"node-1|drained|runcrate: {ECC}\n"  # the product drained it; no longer listed
    "node-2|idle|\n"
    "node-3|drained|maintenance\n"  # a user drained it by hand
    "node-4|drained|runcrate: lost\n"  # already drained, with the same reason
)


def test_slurm_drains_the_listed_node_and_resumes_the_one_it_drained_before(head):
    head.state("sinfo", SINFO)
    done = head.run(
        software="slurm",
        nodes=6,
        drained={"node-2": ECC, "node-4": "lost", "node-5": "unhealthy"},
    )
    assert done.returncode == 0, done.stdout + done.stderr
    assert head.calls("sinfo") == [["-h", "-N", "-o", "%N|%T|%E"]]
    assert head.calls("scontrol") == [
        ["update", "NodeName=node-1", "State=RESUME"],
        ["update", "NodeName=node-2", "State=DRAIN", f"Reason=runcrate: {ECC}"],
    ]
    assert said(done) == [
        "runcrate: resumed node-1",
        "runcrate: drained node-2",
        "runcrate: skipped node-5 (Slurm does not know it yet: it is not in slurm.conf)",
        "runcrate: ok",
    ]


def test_slurm_never_touches_a_node_a_user_drained_by_hand_even_when_listed(head):
    head.state("sinfo", SINFO)
    done = head.run(software="slurm", nodes=5, drained={"node-3": ECC, "node-4": "lost"})
    assert done.returncode == 0
    assert [c for c in head.calls("scontrol") if "NodeName=node-3" in c] == []
    assert "runcrate: skipped node-3 (drained by hand: maintenance)" in said(done)


def test_slurm_changes_nothing_where_the_scheduler_already_matches(head):
    head.state("sinfo", "node-0|idle|\nnode-1|drained*|runcrate: lost\nnode-2|idle|\n")
    done = head.run(software="slurm", nodes=3, drained={"node-1": "lost"})
    assert said(done) == ["runcrate: ok"]
    assert head.calls("scontrol") == []


def test_a_reason_with_quotes_and_line_breaks_reaches_slurm_cleaned_and_cut(head):
    head.state("sinfo", "node-0|idle|\nnode-1|idle|\n")
    why = "GPU \"0\" said 'no'\nthen `reboot`\t$(halt)\a\\ " + "x" * 300
    done = head.run(software="slurm", nodes=2, drained={"node-1": why})
    assert done.returncode == 0
    ((*_, reason),) = head.calls("scontrol")
    cleaned = "GPU 0 said no then reboot $(halt)  " + "x" * 300  # the bell: a space
    assert reason == "Reason=runcrate: " + cleaned[:200]


def test_a_name_that_is_not_the_clusters_is_skipped(head):
    head.state("sinfo", "node-0|idle|\nnode-1|idle|\n")
    done = head.run(software="slurm", nodes=2, drained={"node-9": ECC, "-oProxyCommand=x": ECC})
    assert done.returncode == 0
    assert head.calls("scontrol") == []
    assert "runcrate: skipped node-9 (not a node of this cluster)" in said(done)
    assert "runcrate: skipped -oProxyCommand=x (not a node of this cluster)" in said(done)


def test_a_refused_scontrol_fails_the_run_after_trying_every_node(head):
    head.state("sinfo", SINFO)
    head.state("scontrol-fails", "")
    done = head.run(software="slurm", nodes=5, drained={"node-2": ECC, "node-4": "lost"})
    assert done.returncode == 4
    assert len(head.calls("scontrol")) == 2  # node-1's resume was tried too
    assert said(done)[-1] == (
        "runcrate: failed: scontrol could not resume node-1: slurm_update error: Invalid node "
        "state specified; scontrol could not drain node-2: slurm_update error: Invalid node "
        "state specified"
    )


def test_a_controller_that_does_not_answer_fails_before_any_change(head):
    head.state("sinfo-fails", "")
    done = head.run(software="slurm", nodes=3, drained={"node-2": ECC})
    assert done.returncode == 4
    assert head.calls("scontrol") == []
    assert said(done)[-1] == (
        "runcrate: failed: sinfo on node-0 failed: slurm_load_partitions: Unable to contact "
        "slurm controller"
    )


# --- Kubernetes ----------------------------------------------------------------------------------


def test_kubernetes_cordons_and_annotates_and_uncordons_what_it_cordoned(head):
    head.state(
        "kubectl-nodes",
        "node-0||\n"
        "node-1|true|runcrate: lost\n"  # the product cordoned it; no longer listed
        "node-2||\n"
        "node-3|true|\n",  # cordoned by hand
    )
    done = head.run(software="kubernetes", nodes=4, drained={"node-2": ECC, "node-3": ECC})
    assert done.returncode == 0, done.stdout
    assert head.calls("kubectl")[1:] == [
        ["uncordon", "node-1"],
        ["annotate", "node", "node-1", "runcrate.drained-"],
        ["annotate", "node", "node-2", f"runcrate.drained=runcrate: {ECC}", "--overwrite"],
        ["cordon", "node-2"],
    ]
    assert said(done) == [
        "runcrate: resumed node-1",
        "runcrate: drained node-2",
        "runcrate: skipped node-3 (cordoned by hand)",
        "runcrate: ok",
    ]


def test_kubernetes_leaves_a_node_cordoned_with_the_same_reason(head):
    head.state("kubectl-nodes", f"node-0||\nnode-1|true|runcrate: {ECC}\n")
    done = head.run(software="kubernetes", nodes=2, drained={"node-1": ECC})
    assert said(done) == ["runcrate: ok"]
    assert [c[0] for c in head.calls("kubectl")] == ["get"]


# --- Ray -----------------------------------------------------------------------------------------

RAY_ARGS = (
    "2.60.0 auth=0123456789abcdef --address=10.77.0.1:6379 --node-ip-address=10.77.0.2 "
    "--num-gpus=8 --disable-usage-stats"
)


def test_ray_stops_the_listed_nodes_raylet_and_starts_an_undrained_one_again(head):
    for name in ("node-0", "node-1", "node-2", "node-3"):
        (head.node_home(name) / "raylet").touch()
    undrained = head.node_home("node-1")
    (undrained / "raylet").unlink()  # drained before: stopped, with the marker
    (undrained / "etc" / "ray.drained").write_text("runcrate: lost\n")
    (undrained / "etc" / "ray.args").write_text(RAY_ARGS + "\n")
    (head.node_home("node-3") / "unreachable").touch()

    done = head.run(software="ray", nodes=4, drained={"node-0": ECC, "node-2": ECC, "node-3": ECC})
    assert done.returncode == 0, done.stdout + done.stderr
    assert said(done) == [
        "runcrate: skipped node-0 (the Ray head: stopping its raylet would stop the whole cluster)",
        "runcrate: resumed node-1",
        "runcrate: drained node-2",
        "runcrate: skipped node-3 (not reachable over SSH from node-0: ssh: connect to host "
        "node-3 port 22: Connection timed out)",
        "runcrate: ok",
    ]
    # Over the cluster's own key, never asking, never waiting long for a lost node.
    assert [c[:5] for c in head.calls("ssh")] == [
        ["-o", "BatchMode=yes", "-o", "ConnectTimeout=10", name]
        for name in ("node-1", "node-2", "node-3")
    ]
    assert head.calls("ray") == [
        ["node-1", "start", *RAY_ARGS.split()[2:]],
        ["node-2", "stop", "--force"],
    ]
    assert (head.root / "hosts/node-1/raylet").exists()
    assert not (head.root / "hosts/node-1/etc/ray.drained").exists()
    assert not (head.root / "hosts/node-2/raylet").exists()
    assert (head.root / "hosts/node-2/etc/ray.drained").read_text() == f"runcrate: {ECC}\n"
    assert (head.root / "hosts/node-0/raylet").exists()

    # A second run finds every node as it should be: nothing is stopped or started.
    again = head.run(software="ray", nodes=3, drained={"node-2": ECC})
    assert said(again) == ["runcrate: ok"]
    assert head.calls("ray") == []


def test_ray_says_why_a_node_could_not_start_again(head):
    home = head.node_home("node-1")
    (home / "etc" / "ray.drained").write_text("runcrate: lost\n")  # and no ray.args
    done = head.run(software="ray", nodes=2, drained={})
    assert done.returncode == 4
    assert said(done)[-1] == (
        "runcrate: failed: could not start the raylet of node-1 again: no "
        f"{home}/etc/ray.args to start its raylet with"
    )
    assert (home / "etc" / "ray.drained").exists()  # still drained: the next run tries again


def test_software_none_has_nothing_to_drain(head):
    done = head.run(software="none", nodes=3, drained={"node-2": ECC})
    assert done.returncode == 0
    assert said(done) == ["runcrate: ok"]
    assert not (head.root / "calls").exists()


# --- the drivers ---------------------------------------------------------------------------------


def plan_for(cluster, software: str) -> InstallPlan:
    return InstallPlan(
        cluster_name=cluster.name,
        software=software,
        gpus_per_machine=8,
        boot_seconds=180,
        nodes=[
            PlanNode(n.name, n.private_ip, 8, is_head=n.index == 0)
            for n in cluster.nodes.order_by("index")
        ],
    )


@pytest.mark.django_db
def test_the_ssh_driver_runs_drain_sh_on_the_head_with_its_files(project, monkeypatch, head):
    cluster = create(project, inventory(hosts=3), nodes=3, software="slurm")
    plan = plan_for(cluster, "slurm")
    uploaded: dict[str, tuple[str, int]] = {}
    ran: list[tuple[str, float | None]] = []
    sessions: list[str] = []

    @contextmanager
    def host_session(host):
        sessions.append(host.name)

        class Session:
            where = "203.0.113.7:22"

            def upload(self, files, directory):
                assert directory == ssh.DRAIN_INCOMING
                uploaded.update(files)

            def run(self, command, *, stdin=None, timeout=None, max_bytes=None):
                ran.append((command, timeout))
                return 0, "runcrate: drained node-2\nruncrate: ok\n"

        yield Session()

    monkeypatch.setattr(ssh, "host_session", host_session)
    result = ssh.SshDriver().drain(node(cluster, 0), plan=plan, drained={"node-2": ECC})
    assert result.ok and result.output.endswith("runcrate: ok\n")
    assert sessions == [node(cluster, 0).host.name]
    assert ran[0] == (f"sh {ssh.DRAIN_INCOMING}/drain.sh", ssh.drain_seconds(3))
    assert ran[1][0].endswith("/drain.log")  # kept for the Logs tab
    assert uploaded["drain.sh"] == (SCRIPT.read_text(), 0o700)
    assert uploaded["drain.list"] == (f"node-2\t{ECC}\n", 0o600)
    env = uploaded["drain.env"][0]
    assert "SOFTWARE=slurm\n" in env and "NODE_NAME=node-0\n" in env
    assert "NODES='node-0 node-1 node-2'\n" in env

    # The files it uploads are the ones drain.sh reads.
    for name, (content, _) in uploaded.items():
        (head.folder / name).write_text(content)
    head.state("sinfo", "node-0|idle|\nnode-1|idle|\nnode-2|idle|\n")
    assert said(head.run_script()) == ["runcrate: drained node-2", "runcrate: ok"]


@pytest.mark.django_db
def test_the_ssh_driver_reports_a_failed_drain(project, monkeypatch):
    cluster = create(project, inventory(hosts=2), software="ray")

    @contextmanager
    def host_session(host):
        class Session:
            where = "203.0.113.7:22"

            def upload(self, files, directory):
                pass

            def run(self, command, *, stdin=None, timeout=None, max_bytes=None):
                return 4, "runcrate: failed: could not stop the raylet of node-1: no answer\n"

        yield Session()

    monkeypatch.setattr(ssh, "host_session", host_session)
    result = ssh.SshDriver().drain(
        node(cluster, 0), plan=plan_for(cluster, "ray"), drained={"node-1": ECC}
    )
    assert not result.ok
    assert "could not stop the raylet of node-1" in result.output


@pytest.mark.django_db
def test_the_simulated_data_center_drains_what_it_is_asked_to(project):
    cluster = create(project, inventory(hosts=3), nodes=3, software="slurm")
    result = SimulatedDriver().drain(
        node(cluster, 0), plan=plan_for(cluster, "slurm"), drained={"node-2": ECC}
    )
    assert result.ok
    assert result.output == "runcrate: drained node-2\nruncrate: ok\n"
    none = SimulatedDriver().drain(
        node(cluster, 0), plan=plan_for(cluster, "none"), drained={"node-2": ECC}
    )
    assert none.ok and none.output == "runcrate: ok\n"
