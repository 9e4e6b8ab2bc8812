"""The `ssh` driver: real Linux hosts an operator already has, reached over SSH with paramiko.

Every connection pins the host key the inventory gives (`Host.host_key`): a host that offers any
other key is never bootstrapped; its node fails with `host_key_mismatch` and the event shows the
key it offered. The operator's key is `RUNCRATE_SSH_KEY_FILE` (made on first use;
`manage.py operator_ssh_key` prints its public half for the hosts' `authorized_keys`).

- `start` uploads the node plan as files and runs `clusters/machines/software/host/bootstrap.sh`
  (hostname, /etc/hosts, keys, environment, hostfile, WireGuard, the agent); it is idempotent.
- `observe` reads what `start` recorded: no connection inside the lifecycle's transaction.
- `stop` runs `wipe.sh`, then `verify.sh` over a new connection; anything left is an error.
  Both begin with `cluster-processes.sh` (`host_script`): one rule for which processes are the
  cluster's (by what they run and by its credentials), ended by the one, listed by the other.
- At a location with an SSH gateway, `start` and `stop` also keep the cluster's jump user on
  the gateway (`gateway.sh`): users reach the hosts with `ProxyJump c<id>@gateway`.

Connections run in the per-node tasks under their leases, with timeouts; what goes wrong
becomes the failure message ("could not connect to 203.0.113.7:22: timed out").
"""

from __future__ import annotations

import base64
import json
import logging
import re
import shlex
import time
from collections.abc import Sequence
from contextlib import nullcontext
from datetime import datetime
from pathlib import Path
from typing import TYPE_CHECKING

import paramiko
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey
from django.conf import settings
from django.utils import timezone
from django.utils.dateparse import parse_datetime

from clusters import secrets
from clusters.connect import SHARED_DIR, kube_ca, kube_token, shape_for
from clusters.machines import pristine, storage
from clusters.machines.base import (
    HOST_LOG_DIR,
    INSTALL_SECONDS,
    LOG_CAP_BYTES,
    NODE_LOG_KINDS,
    CheckResult,
    Driver,
    DriverError,
    InstallPlan,
    InstallResult,
    LogKind,
    LogText,
    MachineState,
    NetworkTestResult,
    Observation,
    Released,
    log_script,
    read_log_text,
)
from clusters.machines.session import (
    Session,
    connect,
    openssh_pair,
)
from clusters.machines.software import RAY_REQUIREMENT, checks, network_test
from clusters.models import Node
from offers.models import Host

if TYPE_CHECKING:
    from clusters.models import Cluster

log = logging.getLogger(__name__)

SCRIPTS = Path(__file__).resolve().parent / "software" / "host"
AGENT_FILE = Path(__file__).resolve().parent / "runcrate_agent.py"
INCOMING = "/var/lib/runcrate/incoming"
SOFTWARE_INCOMING = "/var/lib/runcrate/software"
# drain.sh and its files on the head: a folder of its own, since an upload empties its folder
# first and an install may be using SOFTWARE_INCOMING.
DRAIN_INCOMING = "/var/lib/runcrate/drain"
WIREGUARD_PORT = 51820
REIMAGE_POLL_SECONDS = 2
# A log fetch (read_logs): its whole deadline, and the most the dashboard reads of one text
# (the host is asked for its last LOG_CAP_BYTES; a host that sends more is cut off).
LOG_FETCH_SECONDS = 90
LOG_READ_BYTES = 2 * LOG_CAP_BYTES + 4096
_STATUS_LINE = re.compile(r"^runcrate: (\w+)=(.*)$")


# --- connections: clusters/machines/session.py -----------------------------------------------


def host_session(host: Host):
    return connect(
        address=host.address,
        port=host.port,
        user=host.user or "root",
        host_key=host.host_key,
        name=host.name,
    )


def read_host(host: Host, *, baseline: dict | None = None) -> dict:
    """What the host is now (pristine.read): read over SFTP by the product's own code, its
    contents hashed by the host's sha256sum, through this session's bounded commands, only once
    what that depends on is as in `baseline` (None: recording it, staff vouch for the host)."""
    with host_session(host) as session:
        sftp = session.client.open_sftp()
        sftp.get_channel().settimeout(pristine.REPLY_SECONDS)  # a FIFO opened blocks no longer
        try:
            return pristine.read(
                sftp,
                run=session.run,
                user=host.user or "root",
                baseline=baseline,
                seconds=settings.RUNCRATE_VERIFY_SECONDS,
            )
        except pristine.Unverified as error:
            raise DriverError(f"{session.where}: not verified: {error.message}") from None
        except TimeoutError:
            raise DriverError(
                f"{session.where}: not verified: the host did not answer a read within "
                f"{pristine.REPLY_SECONDS:.0f} s"
            ) from None
        except (paramiko.SSHException, OSError) as error:
            raise DriverError(f"{session.where}: the connection broke: {error}") from None
        finally:
            sftp.close()


def verify_host(host: Host) -> list[pristine.Difference]:
    """What differs on `host` from its baseline; [] when it is pristine. A baseline of an older
    version of the reader is one difference that says to record it anew (nothing is read)."""
    if not host.baseline:
        return [
            pristine.Difference(
                "baseline",
                "no baseline was recorded for this host: reimage it, then Record baseline",
            )
        ]
    outdated = pristine.outdated(host.baseline)
    if outdated:
        return [outdated]
    return pristine.differences(host.baseline, read_host(host, baseline=host.baseline))


def reimage_and_verify(host: Host, command: str) -> list[pristine.Difference]:
    """Run the reimage command, wait until the host answers again with its pinned host key
    (or the new one the command printed, which is pinned from then on), and verify it.
    DriverError when the reimage fails or the host does not come back in time."""
    timeout = settings.RUNCRATE_REIMAGE_SECONDS
    try:
        new_key = pristine.run_reimage(host, command=command, timeout=timeout)
    except pristine.ReimageFailed as error:
        raise DriverError(error.message, output=error.output) from None
    if new_key and new_key != host.host_key:
        Host.objects.filter(pk=host.pk).update(host_key=new_key)
        host.host_key = new_key
        log.info("host %s: the reimage printed a new host key; it is pinned now", host.name)
    wait_until_up(host, seconds=timeout)
    return verify_host(host)


def wait_until_up(host: Host, *, seconds: float) -> None:
    """Poll until `host` takes an SSH session with its pinned key, for at most `seconds`; a
    host that offers another key fails at once (never trusted)."""
    deadline = time.monotonic() + seconds
    while True:
        try:
            with host_session(host) as session:
                session.run("true", timeout=30)
            return
        except DriverError as error:
            if error.reason == "host_key_mismatch" or time.monotonic() >= deadline:
                raise DriverError(
                    f"{host.name} did not come back after its reimage: {error.message}",
                    reason=error.reason,
                    output=error.output,
                ) from None
        time.sleep(REIMAGE_POLL_SECONDS)


def _require_root(host: Host) -> None:
    """The scripts run as root: the driver logs in as root (a user with sudo is not supported
    yet); it says so before connecting."""
    if (host.user or "root") != "root":
        raise DriverError(
            f"{host.name} is registered with user {host.user!r}; the ssh driver logs in as root "
            "(set the host's user to root and authorise the operator's key for root).",
            reason="machine_failed",
        )


def last_line(output: str) -> str:
    """A script's verdict: its last non-empty line ("runcrate: ok", "runcrate: failed: …")."""
    lines = output.strip().splitlines()
    return lines[-1].strip() if lines else ""


def status_lines(output: str) -> dict[str, str]:
    """The `runcrate: key=value` lines a script prints, as a dict."""
    found = {}
    for line in output.splitlines():
        match = _STATUS_LINE.match(line.strip())
        if match:
            found[match.group(1)] = match.group(2).strip()
    return found


# --- the driver ------------------------------------------------------------------------------


class SshDriver(Driver):
    name = "ssh"

    def start(self, node: Node, *, agent_token: str, plan: dict) -> dict:
        host = node.reserved_host
        _require_root(host)
        files = bootstrap_files(node, agent_token=agent_token, plan=plan)
        with host_session(host) as session:
            session.upload(files, INCOMING)
            status, output = session.run(f"env INCOMING={INCOMING} sh {INCOMING}/bootstrap.sh")
            if status != 3:  # a refusal changes nothing on the host, not even a log
                keep_output(session, "bootstrap", output)
        facts = status_lines(output)
        last = last_line(output)
        if status != 0 or last != "runcrate: ok":
            why = last.removeprefix("runcrate: ") or "no output"
            if not last.startswith(("runcrate: refused", "runcrate: failed")):
                why = f"it stopped (exit status {status}) after: {why}"
            refused = status == 3
            raise DriverError(
                f"the bootstrap of {host.name} {'refused' if refused else 'failed'}: "
                f"{why.removeprefix('refused: ').removeprefix('failed: ')}",
                reason="machine_failed" if refused else "",
                output=output[-20_000:],
            )
        gateway_sync(node)
        volume = None
        synced = storage.synced_volume(node)
        if synced is not None:
            with host_session(host) as session:
                volume = storage.pull(node, session, cluster_keys(node)[1], synced)
        return {
            "volume": volume,
            "bootstrapped_at": timezone.now().isoformat(),
            "os": facts.get("os", ""),
            "wireguard": facts.get("wireguard", ""),
            "original_hostname": facts.get("original_hostname", ""),
            "changed": [
                line.removeprefix("runcrate: changed ")
                for line in output.splitlines()
                if line.startswith("runcrate: changed ")
            ],
        }

    def observe(self, node: Node, *, now: datetime) -> Observation:
        up = parse_datetime(node.driver_state.get("bootstrapped_at") or "")
        if up is None:
            return Observation(MachineState.BOOTING)
        # The address users reach: the host's own, or (behind a gateway) the one the gateway
        # forwards to.
        host = node.reserved_host
        return Observation(
            MachineState.RUNNING,
            since=up,
            public_address=host.address,
            public_port=host.port,
            host_key=host.host_key,
        )

    def install(self, node: Node, *, plan: InstallPlan) -> InstallResult:
        """Apply the node's plan again (peers may have joined since the start), then run the
        software's installer, `clusters/machines/software/host/install-<software>.sh`, where there
        is
        one (docs/drivers.md)."""
        script = SCRIPTS / f"install-{plan.software}.sh"
        if not script.exists():
            return InstallResult(
                ok=False,
                output=f"Installing {plan.software} on ssh hosts is not available yet; the "
                "machines are up with their private network. Terminate the cluster, or use it "
                "without the software.",
            )
        self.start(node, agent_token=plan.agent_tokens[node.name], plan=plan.node_plans[node.name])
        files = {
            "software.env": (software_env(node, plan), 0o600),
            # What every installer shares, sourced from beside it.
            "installer.sh": ((SCRIPTS / "installer.sh").read_text(), 0o600),
            script.name: (script.read_text(), 0o700),
        }
        with host_session(node.reserved_host) as session:
            session.upload(files, SOFTWARE_INCOMING)
            # The install step's own deadline: never cut shorter than the step allows.
            status, output = session.run(
                f"sh {SOFTWARE_INCOMING}/{script.name}", timeout=INSTALL_SECONDS
            )
            keep_output(session, "install", output)
        last = last_line(output)
        return InstallResult(ok=status == 0 and last == "runcrate: ok", output=output[-20_000:])

    def drain(self, head: Node, *, plan: InstallPlan, drained: dict[str, str]) -> InstallResult:
        """Run `clusters/machines/software/host/drain.sh` on the head with the plan's nodes
        (drain.env) and the nodes to drain (drain.list); it changes only what differs and only
        what the product drained (docs/drivers.md, "Draining a node")."""
        files = {
            "drain.env": (drain_env(plan), 0o600),
            "drain.list": (drain_list(drained), 0o600),
            "drain.sh": ((SCRIPTS / "drain.sh").read_text(), 0o700),
        }
        with host_session(head.reserved_host) as session:
            session.upload(files, DRAIN_INCOMING)
            status, output = session.run(
                f"sh {DRAIN_INCOMING}/drain.sh", timeout=drain_seconds(len(plan.nodes))
            )
            keep_output(session, "drain", output)
        last = last_line(output)
        return InstallResult(ok=status == 0 and last == "runcrate: ok", output=output[-20_000:])

    def check(self, node: Node, *, plan: InstallPlan, now: datetime) -> CheckResult:
        """The software's own readiness check, run on the head (`node`), read by the same
        parsers as everywhere (`clusters/machines/software/checks.py`)."""
        expected = [checks.ExpectedNode(n.name, n.private_ip, n.gpus) for n in plan.nodes]
        with host_session(node.reserved_host) as session:
            # stderr too: "Unable to contact slurm controller" is how a starting one answers.
            _, output = session.run(f"{checks.COMMANDS[plan.software]} 2>&1", timeout=60)
        return checks.run_check(plan.software, output, expected)

    def stop(self, node: Node, *, attempt: int = 1) -> Released:
        """Sync the volume back (node-0), then make the host fit for the next tenant: where
        its location or the host has a reimage command, reimage it and verify it against its
        baseline (clusters/machines/pristine.py); otherwise wipe what the product wrote and
        verify that over a new connection, and the host is not pristine: a tenant was root on
        it, so it waits, dirty, for staff to reimage it (docs/inventory.md)."""
        host = node.reserved_host
        _require_root(host)
        command = host.reimage_command
        user = shlex.quote(host.user or "root")
        warning = ("", "")
        synced = storage.synced_volume(node)
        # A reimage needs no session of its own: a host its tenant left unreachable is
        # reimaged all the same, unless node-0 still holds a volume's files to sync back.
        with host_session(host) if synced or not command else nullcontext() as session:
            if synced:
                assert session is not None  # opened for the sync
                warning = storage.push(node, session, cluster_keys(node)[1], synced) or warning
                if warning[0] and attempt < storage.SYNC_ATTEMPTS:
                    # node-0 keeps the files: the stop is tried again before anything is wiped.
                    raise DriverError(f"{warning[0]} It is tried again.", output=warning[1])
            if not command:
                assert session is not None  # opened for the wipe
                status, output = session.run(f"sh -s {user}", stdin=host_script("wipe.sh"))
                if status != 0:
                    raise DriverError(f"the wipe of {host.name} failed", output=output[-20_000:])
        if command:
            # The reimage replaces everything the tenant could have touched: no wipe first.
            differences = reimage_and_verify(host, command)
            why = pristine.report(differences)
        else:
            self._verify_wipe(node)
            why = (
                "It served a cluster and neither it nor its location has a reimage command: "
                "reimage it, then Mark free (the verification runs then)."
            )
        gateway_sync(node, leaving=True)
        return Released(
            pristine=bool(command) and not why, why=why, warning=warning[0], output=warning[1]
        )

    def _verify_wipe(self, node: Node) -> None:
        """verify.sh over a new connection: what is checked is what the next cluster would
        find of the product's own files and processes."""
        host = node.reserved_host
        user = shlex.quote(host.user or "root")
        original = shlex.quote(node.driver_state.get("original_hostname") or "")
        with host_session(host) as session:
            status, output = session.run(f"sh -s {user} {original}", stdin=host_script("verify.sh"))
        if status != 0:
            leftovers = [line for line in output.splitlines() if line.startswith("leftover:")]
            raise DriverError(
                f"{host.name} is not clean after the wipe: "
                f"{'; '.join(x.removeprefix('leftover: ') for x in leftovers) or output[-200:]}",
                output=output[-20_000:],
            )

    def network_test(
        self, cluster: Cluster, *, nodes: list[Node], plan: InstallPlan
    ) -> NetworkTestResult:
        """all_reduce_perf across `nodes` where node-0 has nccl-tests and mpirun; otherwise the
        agent's own measurement from every other node to node-0, one node after another (so no
        two share the head's link). Every remote command is bounded on the host itself
        (`timeout`) and by the session (clusters/machines/software/network_test.py)."""
        head, workers = nodes[0], nodes[1:]
        with host_session(head.reserved_host) as session:
            _, found = session.run(network_test.FIND_NCCL, timeout=30)
            path = network_test.found_nccl(found)
            if path:
                command = network_test.all_reduce_perf_command(
                    path=path, ranks=len(nodes), gpus=plan.gpus_per_machine
                )
                directory = shlex.quote(network_test.HOSTFILE.rsplit("/", 1)[0])
                status, output = session.run(
                    f"mkdir -p -m 700 {directory} && cat > {network_test.HOSTFILE} && "
                    f"{command} 2>&1",
                    stdin=network_test.hostfile(
                        [n.name for n in nodes], gpus=plan.gpus_per_machine
                    ),
                    timeout=network_test.NCCL_SECONDS + 30,
                )
                return network_test.read_all_reduce_perf(output, status=status, command=command)
        # The dashboard's own agent program, on stdin: the same measurement on every host.
        source = AGENT_FILE.read_text()
        command = network_test.agent_command(head_ip=head.private_ip)
        bound = network_test.AGENT_SECONDS + network_test.AGENT_SLACK_SECONDS + 15
        pairs = []
        for worker in workers:
            try:
                with host_session(worker.reserved_host) as session:
                    _, output = session.run(command, stdin=source, timeout=bound)
            except DriverError as error:
                pairs.append(network_test.unmeasured_pair(worker.name, head.name, error.message))
                continue
            pairs.append(network_test.read_agent_pair(output, node=worker.name, head=head.name))
        return network_test.agent_result(pairs)

    def read_logs(self, node: Node, *, kinds: Sequence[LogKind], head_ip: str) -> list[LogText]:
        """Each of `kinds` by its `log_script` over one session; the host cuts each text to its
        last LOG_CAP_BYTES and says which command produced it."""
        texts = []
        with host_session(node.reserved_host) as session:
            # One deadline for the whole fetch once connected (the connection has its own) and
            # a cap the dashboard enforces on each text (the host's own `tail` is the tenant's):
            # LOG_FETCH_SECONDS bounds a fetch's hold on its worker however the host answers,
            # and the fetch's lease outlasts it (clusters/telemetry/logs.py).
            deadline = time.monotonic() + LOG_FETCH_SECONDS
            for kind in kinds:
                left = deadline - time.monotonic()
                if left <= 1:
                    raise DriverError(
                        f"{session.where}: the logs did not come within {LOG_FETCH_SECONDS} "
                        "seconds; the dashboard stopped reading them"
                    )
                _, output = session.run(
                    log_script(kind, head_ip=head_ip),
                    timeout=left,
                    max_bytes=LOG_READ_BYTES,
                    name=f"the read of the {_log_name(kind)}",
                )
                texts.append(read_log_text(kind, output))
        return texts


def _log_name(kind: LogKind) -> str:
    """How an error names a text it was reading: "bootstrap log", "slurm queue"."""
    words = kind.replace("_", " ")
    return f"{words} log" if kind in NODE_LOG_KINDS else words


def keep_output(session: Session, name: str, output: str) -> None:
    """Append what the bootstrap or an installer printed to `HOST_LOG_DIR/<name>.log` on the host,
    after a line saying when, for the Logs tab (`read_logs`). On stdin, never on a command line;
    a failure to keep it is logged, never the step's failure."""
    stamp = timezone.now().isoformat(timespec="seconds")
    directory = shlex.quote(HOST_LOG_DIR)
    try:
        status, said = session.run(
            f"mkdir -p -m 700 {directory} && cat >> {directory}/{name}.log",
            stdin=f"==> {name}, {stamp}\n{output}\n",
            timeout=30,
        )
    except DriverError as error:
        log.warning("%s: could not keep the %s output: %s", session.where, name, error.message)
        return
    if status != 0:
        log.warning("%s: could not keep the %s output: %s", session.where, name, said.strip())


# --- what the bootstrap is given ---------------------------------------------------------------


def host_script(name: str) -> str:
    """A script of clusters/machines/software/host for `sh -s`, after the functions that find the
    cluster's processes (`cluster-processes.sh`), which the wipe ends and verify.sh lists."""
    return (SCRIPTS / "cluster-processes.sh").read_text() + "\n" + (SCRIPTS / name).read_text()


def software_env(node: Node, plan: InstallPlan) -> str:
    """The shell variables an installer reads: who it is, the head, every node, the GPUs, the
    package sources, and a per-cluster secret (e.g. Slurm's munge key), derived rather than
    stored; for Kubernetes, what node-0's k3s server needs (`kubernetes_env`)."""
    location = node.cluster.machine_type.location
    secret = cluster_secret(node, "runcrate-software")
    return "".join(
        [
            _env_line("SOFTWARE", plan.software),
            _env_line("CLUSTER_NAME", plan.cluster_name),
            _env_line("NODE_NAME", node.name),
            _env_line("ROLE", "head" if node.index == 0 else "worker"),
            _env_line("HEAD_NAME", plan.head.name),
            _env_line("HEAD_IP", plan.head.private_ip),
            _env_line("PRIVATE_IP", node.private_ip),
            _env_line("NODES", " ".join(n.name for n in plan.nodes)),
            _env_line("GPUS_PER_NODE", str(plan.gpus_per_machine)),
            _env_line("APT_MIRROR", location.apt_mirror),
            _env_line("PIP_INDEX_URL", location.pip_index_url),
            _env_line("RAY_REQUIREMENT", RAY_REQUIREMENT),
            _env_line("RAY_AUTH_TOKEN", cluster_secret(node, "runcrate-ray-token").hex()),
            _env_line("CLUSTER_SECRET_B64", base64.b64encode(secret * 32).decode()),
            _env_line("K3S_URL", settings.RUNCRATE_K3S_URL),
            kubernetes_env(node) if plan.software == "kubernetes" else "",
        ]
    )


def drain_env(plan: InstallPlan) -> str:
    """The shell variables drain.sh reads: the software, the head, every node of the plan."""
    return "".join(
        [
            _env_line("SOFTWARE", plan.software),
            _env_line("NODE_NAME", plan.head.name),
            _env_line("HEAD_IP", plan.head.private_ip),
            _env_line("NODES", " ".join(n.name for n in plan.nodes)),
        ]
    )


def drain_list(drained: dict[str, str]) -> str:
    """drain.list: a line `name<TAB>why` per node to drain. A line break or tab in `why` would
    split the line, so each becomes a space; drain.sh cleans the rest (quotes, length)."""
    lines = []
    for name, why in sorted(drained.items()):
        one_line = " ".join(why.replace("\t", " ").splitlines())
        lines.append(f"{name}\t{one_line}\n")
    return "".join(lines)


def drain_seconds(nodes: int) -> int:
    """How long drain.sh may run on a cluster of `nodes`: its own bounds, one node after
    another (a Ray node's raylet started again: 120 s), and a minute for the scheduler."""
    return 60 + 120 * nodes


def kubernetes_env(node: Node) -> str:
    """For node-0's k3s server: the admin's bearer token and the cluster's CA, which the
    users' kubeconfig carries (docs/connecting.md), and the address users reach its API at, for
    its certificate. The other nodes need none of it."""
    if node.index != 0:
        return ""
    shape = shape_for(node.cluster, planning=True)
    ca = kube_ca(shape)
    return "".join(
        [
            _env_line("KUBE_ADMIN_TOKEN", kube_token(shape)),
            _env_line("KUBE_API_ADDRESS", "" if shape.gateway else node.reserved_host.address),
            _env_line("KUBE_CA_CERT_B64", base64.b64encode(ca.certificate.encode()).decode()),
            _env_line("KUBE_CA_KEY_B64", base64.b64encode(ca.key.encode()).decode()),
        ]
    )


def _env_line(name: str, value: str) -> str:
    return f"{name}={shlex.quote(value)}\n"


def bootstrap_files(node: Node, *, agent_token: str, plan: dict) -> dict[str, tuple[str, int]]:
    """The node plan (`clusters.connect.node_plan`) as the files bootstrap.sh reads."""
    cluster = node.cluster
    peers = list(
        Node.objects.filter(cluster_id=cluster.pk, status__in=Node.LIVE)
        .select_related("host")
        .order_by("index")
    )
    known_hosts = "".join(
        f"{p.name},{p.private_ip} {p.host.host_key}\n" for p in peers if p.host and p.host.host_key
    )
    hosts = "".join(f"{ip} {name}\n" for name, ip in sorted(plan["hosts"].items()))
    environment = "".join(f"{k}={v}\n" for k, v in sorted(plan["environment"].items()))
    agent = {
        "runcrate_url": settings.RUNCRATE_AGENT_URL,
        "runcrate_node_id": str(node.pk),
        "runcrate_node_token": agent_token,
        "interface": "rc0",
        "private_ip": plan["private_ip"],
        "is_head": plan["role"] == "head",
        "health_seconds": settings.RUNCRATE_HEALTH_SECONDS,
    }
    shared = next((m for m in plan["mounts"] if m["path"] == SHARED_DIR), None)
    if shared and shared["source"]:
        # The worker's agent mounts node-0's /shared before its network test (sshfs with the
        # cluster's own key where there is no NFS).
        agent |= {"shared_mount": SHARED_DIR, "shared_identity": "/root/.ssh/runcrate_cluster"}
    shared_role = "" if shared is None else "export" if shared["export"] else "mount"
    plan_env = _plan_env(node, plan, peers=peers, shared_role=shared_role)
    key_state = cluster_keys(node)
    return {
        "plan.env": (plan_env, 0o600),
        "hosts": (hosts, 0o644),
        "environment": (environment, 0o644),
        "hostfile": (plan["hostfile"]["content"], 0o644),
        "authorized_keys": (cluster.authorized_keys.strip() + "\n" + key_state[1] + "\n", 0o600),
        "known_hosts": (known_hosts, 0o644),
        "cluster_key": (key_state[0], 0o600),
        "cluster_key.pub": (key_state[1] + "\n", 0o644),
        "agent.json": (json.dumps(agent, indent=2) + "\n", 0o600),
        "runcrate_agent.py": (AGENT_FILE.read_text(), 0o755),
        "bootstrap.sh": ((SCRIPTS / "bootstrap.sh").read_text(), 0o700),
    }


def _plan_env(node: Node, plan: dict, *, peers: list[Node], shared_role: str) -> str:
    """plan.env, the shell variables bootstrap.sh sources: the node's name and address, its
    WireGuard peers, the hostfile, the shared folder's role, the volume sync and the mirrors."""
    location = node.cluster.machine_type.location
    return "".join(
        [
            _env_line("NODE_NAME", plan["hostname"]),
            _env_line("PRIVATE_IP", plan["private_ip"]),
            _env_line("WG_PORT", str(WIREGUARD_PORT)),
            # The peers' public addresses, the only ones WireGuard's port accepts (the firewall).
            _env_line("WG_PEERS", " ".join(p.host.address for p in peers if p.host and p != node)),
            _env_line("LOGIN_USER", "root"),
            _env_line("HOSTFILE_PATH", plan["hostfile"]["path"]),
            _env_line("SHARED_DIR", SHARED_DIR),
            _env_line("SHARED_ROLE", shared_role),
            # node-0 syncs an attached volume with rsync (clusters/machines/storage.py).
            _env_line("VOLUME_SYNC", "1" if any("volume" in m for m in plan["mounts"]) else ""),
            _env_line("APT_MIRROR", location.apt_mirror),
            _env_line("PIP_INDEX_URL", location.pip_index_url),
        ]
    )


def cluster_secret(node: Node, purpose: str) -> bytes:
    """32 bytes derived from the key the cluster was created under, the cluster and
    `purpose`: the same on every node and every call, after a key rotation too, stored nowhere
    (clusters/secrets.py)."""
    founder = node if node.index == 0 else node.cluster.nodes.filter(index=0).first()
    context = f"{node.cluster_id}:{node.cluster.created_at.isoformat()}"
    return secrets.cluster_secret(secrets.cluster_key(founder), purpose, context)


def cluster_keys(node: Node) -> tuple[str, str]:
    """The cluster's node-to-node key pair, derived from the secret key and the cluster, so
    every node gets the same pair without it being stored anywhere."""
    seed = cluster_secret(node, "runcrate-cluster-key")
    return openssh_pair(
        Ed25519PrivateKey.from_private_bytes(seed), f"runcrate-cluster-{node.cluster_id}"
    )


# --- the location's SSH gateway -----------------------------------------------------------------


def gateway_sync(node: Node, *, leaving: bool = False) -> None:
    """Keep the cluster's jump user `c<id>` on the location's gateway: the users' keys, each
    allowed to forward only to this cluster's hosts. Removed, with its home, with the last host.

    Each node's start registers its host (`add`) and its release takes it away (`leave`) under
    one lock on the gateway (`gateway.sh`), which also drops every host the dashboard no longer
    sees live: concurrent starts and stops of one cluster's nodes never race each other."""
    location = node.cluster.machine_type.location
    if not location.ssh_gateway:
        return
    address, _, port = location.ssh_gateway.rpartition(":")
    address = address.strip("[]")
    # The hosts of the nodes still serving the cluster: once it ends, none.
    holding = (
        Node.objects.filter(cluster_id=node.cluster_id, holds_host=True, status__in=Node.LIVE)
        .select_related("host")
        .order_by("index")
    )
    if leaving:
        holding = holding.exclude(pk=node.pk)
    live = sorted({_gateway_target(n.host) for n in holding if n.host})
    user = f"c{node.cluster_id}"
    script = (SCRIPTS / "gateway.sh").read_text()
    if node.host is None or (leaving and not live):
        command, stdin = f"sh -s remove {user}", script
    else:
        words = [user, _gateway_target(node.host), *live]
        command = f"sh -s {'leave' if leaving else 'add'} {shlex.join(words)}"
        keys = "".join(
            f"{line.strip()}\n"
            for line in node.cluster.authorized_keys.splitlines()
            if line.strip() and not line.strip().startswith("#")
        )
        stdin = script + "\n" + _heredoc(keys)
    with connect(
        address=address,
        port=int(port or 22),
        user="root",
        host_key=location.ssh_gateway_host_key,
        name=f"the {location.code} gateway",
    ) as session:
        # The keys travel as a here-document after the script, never on a command line.
        status, output = session.run(command, stdin=stdin)
    if status != 0 or last_line(output) != "runcrate: ok":
        raise DriverError(
            f"the {location.code} gateway refused the jump user: {output.strip()[-300:]}"
        )


def _gateway_target(host) -> str:
    """Where the gateway forwards to for `host`, as `permitopen` takes it."""
    address = f"[{host.address}]" if ":" in host.address else host.address
    return f"{address}:{host.port}"


def _heredoc(keys: str) -> str:
    """The keys for `sync` in gateway.sh, base64: nothing in them can end the here-document."""
    encoded = base64.encodebytes(keys.encode()).decode()
    return f"sync \"$@\" <<'RUNCRATE_KEYS'\n{encoded}RUNCRATE_KEYS\n"
