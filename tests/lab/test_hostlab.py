"""The host lab itself (lab/hostlab.py, docs/lab.md): real hosts, isolated from the machine and
from everything beyond the bridge. One lab serves the whole module (conftest.py); the last test
takes it down."""

import errno
import json
import os
import socket
import subprocess
import threading
import time
from pathlib import Path

import pytest

from lab import hostlab

REASON = hostlab.unavailable_reason()
needs_lab = pytest.mark.skipif(REASON is not None, reason=f"host lab: {REASON}")

SSH_OPTIONS = ["-F", "/dev/null", "-o", "BatchMode=yes", "-o", "IdentitiesOnly=yes"]
SSH_OPTIONS += ["-o", "ConnectTimeout=10", "-o", "StrictHostKeyChecking=yes"]


def ssh(key: Path, known_hosts: Path, address: str, command: str, *extra: str):
    return subprocess.run(
        ["ssh", *SSH_OPTIONS, "-i", str(key), "-o", f"UserKnownHostsFile={known_hosts}"]
        + [*extra, f"root@{address}", command],
        capture_output=True,
        text=True,
        timeout=60,
    )


def known_hosts(tmp_path: Path, *hosts: hostlab.LabHost) -> Path:
    path = tmp_path / "known_hosts"
    path.write_text("".join(f"{h.address} {h.host_key}\n" for h in hosts))
    return path


@pytest.fixture
def listener():
    """listener(address, port) -> a TCP server on the machine that accepts in a thread."""
    servers = []

    def start(address: str, port: int = 0) -> int:
        server = socket.create_server((address, port))
        servers.append(server)
        threading.Thread(target=lambda: _accept(server), daemon=True).start()
        return server.getsockname()[1]

    yield start
    for server in servers:
        server.close()


def _accept(server: socket.socket) -> None:
    while True:
        try:
            conn, _ = server.accept()
        except OSError:
            return
        conn.sendall(b"machine\n")
        conn.close()


def _connect_from(lab, host: str, address: str, port: int, timeout: float = 2) -> str:
    """What a TCP connection from inside the host gets: the first line read, or the error."""
    probe = (
        "import socket, sys\n"
        "s = socket.socket(); s.settimeout(float(sys.argv[3]))\n"
        "try:\n"
        "    s.connect((sys.argv[1], int(sys.argv[2]))); print(s.recv(64).decode().strip())\n"
        "except OSError as e:\n"
        "    print(type(e).__name__, e.errno)\n"
    )
    return lab.exec(
        host, f"python3 -c '{probe}' {address} {port} {timeout}", timeout=timeout + 20
    ).stdout.strip()


# --- what does not need the lab running -------------------------------------------------------


def _fake_lab() -> hostlab.Lab:
    hosts = [
        hostlab.LabHost(f"lab-{i}", f"172.30.77.{10 + i}", 22, "root", f"ssh-ed25519 KEY{i}")
        for i in (1, 2, 3)
    ]
    gateway = hostlab.LabHost("lab-gw", "172.30.77.10", 22, "root", "ssh-ed25519 GWKEY")
    return hostlab.Lab(hosts=hosts, gateway=gateway, lab_dir=Path("/nonexistent"))


def test_inventory_has_both_locations_and_splits_the_hosts():
    document = _fake_lab().inventory(gateway_hosts=1)
    assert document["gpu_models"] == [
        {"slug": "lab-h100", "name": "H100 SXM 80GB", "memory_gib": 80}
    ]
    direct, behind = document["locations"]
    assert direct["code"] == "lab" and direct["ssh_gateway"] is None
    assert behind["code"] == "lab-gw" and behind["ssh_gateway"] == "172.30.77.10:22"
    assert behind["ssh_gateway_host_key"] == "ssh-ed25519 GWKEY"
    for location in (direct, behind):
        assert location["apt_mirror"] == "http://172.30.77.1:8799/debian"
        assert location["pip_index_url"] == "http://172.30.77.1:8799/simple/"
        # Its links are all the same two CPUs: they carry five acceptance measurements at once
        # (a whole round of ten nodes), not every round of a big cluster.
        assert location["measurements_at_once"] == hostlab.LAB_MEASUREMENTS_AT_ONCE == 5
    types = {t["slug"]: t for t in document["machine_types"]}
    assert set(types) == {"lab-h100x2-vm", "lab-gw-h100x2-vm"}
    for slug, location in (("lab-h100x2-vm", "lab"), ("lab-gw-h100x2-vm", "lab-gw")):
        assert types[slug]["location"] == location
        assert types[slug]["machine_kind"] == "vm"
        assert types[slug]["price_per_hour"] == "2.00"
        assert types[slug]["gpus_per_machine"] == 2
        assert types[slug]["boot_seconds"] == 30
    assert [(h["name"], h["machine_type"]) for h in document["hosts"]] == [
        ("lab-1", "lab-h100x2-vm"),
        ("lab-2", "lab-h100x2-vm"),
        ("lab-3", "lab-gw-h100x2-vm"),
    ]
    first = document["hosts"][0]
    assert first == {
        "name": "lab-1",
        "machine_type": "lab-h100x2-vm",
        "driver": "ssh",
        "address": "172.30.77.11",
        "port": 22,
        "user": "root",
        "host_key": "ssh-ed25519 KEY1",
    }
    json.dumps(document)  # a document, nothing but JSON in it


def test_inventory_puts_every_host_in_the_direct_location_by_default():
    document = _fake_lab().inventory()
    assert {h["machine_type"] for h in document["hosts"]} == {"lab-h100x2-vm"}
    no_gateway = hostlab.Lab(hosts=_fake_lab().hosts, gateway=None, lab_dir=Path("/x"))
    assert [loc["code"] for loc in no_gateway.inventory()["locations"]] == ["lab"]
    with pytest.raises(ValueError):
        no_gateway.inventory(gateway_hosts=1)


def test_the_stand_in_nvidia_smi_says_so():
    script = (Path(hostlab.__file__).parent / "image/nvidia-smi").read_text()
    assert "STAND-IN" in script.splitlines()[1]


# --- real hosts -------------------------------------------------------------------------------


@needs_lab
def test_each_host_has_its_own_hostname_and_host_key(lab):
    assert [h.name for h in lab.hosts] == ["lab-1", "lab-2"]
    assert [h.address for h in lab.hosts] == ["172.30.77.11", "172.30.77.12"]
    assert lab.gateway is not None and lab.gateway.address == "172.30.77.10"
    keys = set()
    for host in [*lab.hosts, lab.gateway]:
        assert lab.exec(host.name, "hostname").stdout.strip() == host.name
        scan = subprocess.run(
            ["ssh-keyscan", "-t", "ed25519", "-T", "5", host.address],
            capture_output=True,
            text=True,
            timeout=30,
        )
        scanned = [line.split(None, 1)[1] for line in scan.stdout.splitlines() if line.strip()]
        assert scanned == [host.host_key]
        assert host.host_key.startswith("ssh-ed25519 AAAA") and len(host.host_key.split()) == 2
        keys.add(host.host_key)
    assert len(keys) == 3
    # and the image's own keys from debootstrap are gone: only the host's one is there
    listing = lab.exec("lab-1", "ls /etc/ssh | grep ssh_host_").stdout.split()
    assert listing == ["ssh_host_ed25519_key", "ssh_host_ed25519_key.pub"]


@needs_lab
def test_sshd_answers_with_the_pinned_key_only(lab, operator_key, tmp_path):
    key, _ = operator_key
    pinned = known_hosts(tmp_path, *lab.hosts, lab.gateway)
    for host in [*lab.hosts, lab.gateway]:
        result = ssh(key, pinned, host.address, "hostname")
        assert result.returncode == 0, result.stderr
        assert result.stdout.strip() == host.name
    # a wrong pinned key is refused: these are the hosts' own keys, not any key
    wrong = tmp_path / "wrong_known_hosts"
    wrong.write_text(f"{lab.hosts[0].address} {lab.hosts[1].host_key}\n")
    refused = ssh(key, wrong, lab.hosts[0].address, "hostname")
    assert refused.returncode != 0
    assert "HOST IDENTIFICATION HAS CHANGED" in refused.stderr
    # no password, no other key
    other = tmp_path / "other"
    subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(other)], check=True)
    assert ssh(other, pinned, lab.hosts[0].address, "true").returncode == 255


@needs_lab
def test_a_host_behind_the_gateway_is_reached_through_it(lab, operator_key, tmp_path):
    key, _ = operator_key
    pinned = known_hosts(tmp_path, *lab.hosts, lab.gateway)
    jump = (
        f"ssh {' '.join(SSH_OPTIONS)} -i {key} -o UserKnownHostsFile={pinned} "
        f"-W %h:%p root@{lab.gateway.address}"
    )
    result = ssh(key, pinned, lab.hosts[1].address, "hostname", "-o", f"ProxyCommand={jump}")
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "lab-2"
    log = lab.exec("lab-gw", "cat /var/log/sshd.log").stdout
    assert "Accepted publickey for root" in log


@needs_lab
def test_a_login_gets_a_pty(lab, operator_key, tmp_path):
    key, _ = operator_key
    pinned = known_hosts(tmp_path, lab.hosts[0])
    result = ssh(key, pinned, lab.hosts[0].address, "tty", "-tt")
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip().startswith("/dev/pts/")


@needs_lab
def test_hosts_reach_each_other_over_the_bridge(lab):
    assert lab.exec("lab-1", "ping -c 1 -W 5 172.30.77.12").returncode == 0
    assert lab.exec("lab-2", "ping -c 1 -W 5 172.30.77.10").returncode == 0
    banner = _connect_from(lab, "lab-1", "172.30.77.12", 22)
    assert banner.startswith("SSH-2.0-")
    # and the dashboard's side: the bridge address answers the mirror
    assert lab.exec("lab-1", "ping -c 1 -W 5 172.30.77.1").returncode == 0


@needs_lab
def test_a_hosts_loopback_is_its_own(lab, listener):
    port = listener("127.0.0.1")
    # on the machine 127.0.0.1:port answers; in a host it is the host's own loopback: nothing
    with socket.create_connection(("127.0.0.1", port), timeout=5) as conn:
        assert conn.recv(16) == b"machine\n"
    assert (
        _connect_from(lab, "lab-1", "127.0.0.1", port)
        == f"ConnectionRefusedError {errno.ECONNREFUSED}"
    )


@needs_lab
def test_a_host_has_no_route_beyond_the_bridge(lab):
    routes = lab.exec("lab-1", "ip -4 route show").stdout.strip().splitlines()
    assert routes == ["172.30.77.0/24 dev eth0 proto kernel scope link src 172.30.77.11"]
    assert lab.exec("lab-1", "ip -6 route show").stdout.strip() == ""
    for address in ("8.8.8.8", "192.0.2.1", "10.0.0.1", "172.30.78.1"):
        probe = lab.exec("lab-1", f"ip route get {address}", check=False)
        assert probe.returncode != 0 and "unreachable" in probe.stderr.lower(), probe
    # connect() fails at once, before any packet exists: there is no route to send it on
    assert _connect_from(lab, "lab-1", "198.51.100.1", 80) == f"OSError {errno.ENETUNREACH}"
    # and the machine forwards nothing from the bridge elsewhere, whatever a host does
    rules = subprocess.run(
        ["nft", "list", "table", "inet", "rclab"], capture_output=True, text=True, check=True
    ).stdout
    assert 'iifname "rclab0" oifname != "rclab0" drop' in rules


@needs_lab
def test_of_the_machine_a_host_reaches_only_the_open_ports(lab, listener):
    closed = listener(hostlab.BRIDGE_ADDRESS)  # an ephemeral port, outside 8000-8999
    assert not 8000 <= closed <= 8999
    assert _connect_from(lab, "lab-1", hostlab.BRIDGE_ADDRESS, closed, 1) == "TimeoutError None"
    for port in range(8990, 9000):
        try:
            opened = listener(hostlab.BRIDGE_ADDRESS, port)
            break
        except OSError:
            continue
    assert _connect_from(lab, "lab-1", hostlab.BRIDGE_ADDRESS, opened) == "machine"


@needs_lab
def test_apt_installs_the_private_network_from_the_lab_mirror(lab):
    assert lab.exec("lab-2", "command -v wg wireguard-go iperf3", check=False).stdout == ""
    assert lab.exec("lab-2", "cat /etc/apt/sources.list | grep -v '^#'", check=False).stdout == ""
    line = f"deb {hostlab.APT_MIRROR} bookworm main"  # no [trusted=yes]: the mirror is signed
    install = (
        f"echo '{line}' > /etc/apt/sources.list.d/runcrate.list"
        " && export DEBIAN_FRONTEND=noninteractive && apt-get -q update"
        " && apt-get install -y -q --no-install-recommends wireguard-tools wireguard-go iperf3"
    )
    try:
        result = lab.exec("lab-2", install, timeout=180)
        assert "NO_PUBKEY" not in result.stdout + result.stderr
        assert lab.exec("lab-2", "wg --version").stdout.startswith("wireguard-tools")
        # the kernel has no WireGuard: `ip link add` fails cleanly; wireguard-go makes it
        probe = lab.exec("lab-2", "ip link add rc-probe type wireguard", check=False)
        assert probe.returncode != 0
        lab.exec("lab-2", "wireguard-go rc0 >/dev/null 2>&1 && wg set rc0 listen-port 51820")
        shown = lab.exec("lab-2", "wg show rc0 listen-port; ip -o link show rc0").stdout
        assert shown.startswith("51820\n") and "rc0" in shown
        assert lab.exec("lab-2", "iperf3 --version").stdout.startswith("iperf 3")
    finally:
        lab.reset("lab-2")
    assert lab.exec("lab-2", "command -v wg", check=False).returncode != 0


@needs_lab
def test_the_stand_in_nvidia_smi_prints_what_set_gpus_set(lab):
    query = (
        "nvidia-smi --query-gpu=name,memory.total,uuid,driver_version --format=csv,noheader,nounits"
    )
    try:
        lines = lab.exec("lab-1", query).stdout.strip().splitlines()
        assert len(lines) == 2
        uuids = []
        for line in lines:
            name, memory, uuid, driver = line.split(", ")
            assert (name, memory, driver) == ("NVIDIA H100 80GB HBM3", "81559", "550.54.15")
            assert uuid.startswith("GPU-") and len(uuid) == 40
            uuids.append(uuid)
        assert len(set(uuids)) == 2
        # UUIDs are the host's own, and stay when the product renames the host
        other = lab.exec("lab-2", query).stdout
        assert not set(uuids) & {line.split(", ")[2] for line in other.splitlines()}
        lab.exec("lab-1", "hostname node-0")
        assert lab.exec("lab-1", query).stdout.strip().splitlines() == lines

        lab.set_gpus("lab-1", model="NVIDIA A100-SXM4-40GB", memory_mib=40960, count=4)
        lines = lab.exec("lab-1", query).stdout.strip().splitlines()
        assert [line.split(", ")[:2] for line in lines] == [["NVIDIA A100-SXM4-40GB", "40960"]] * 4
        assert lab.exec("lab-2", query).stdout.count("\n") == 2  # the other host is untouched
        summary = lab.exec("lab-1", "nvidia-smi").stdout
        assert "STAND-IN" in summary and "NVIDIA A100-SXM4-40GB" in summary
        listing = lab.exec("lab-1", "nvidia-smi -L").stdout.splitlines()
        assert listing[3].startswith("GPU 3: NVIDIA A100-SXM4-40GB (UUID: GPU-")

        lab.set_gpus("lab-1", model="NVIDIA H100 80GB HBM3", memory_mib=81559, count=0)
        none = lab.exec("lab-1", query, check=False)
        assert (none.returncode, none.stdout.strip()) == (6, "No devices were found")
    finally:
        lab.reset("lab-1")
    assert lab.exec("lab-1", query).stdout.count("\n") == 2
    assert lab.exec("lab-gw", query, check=False).returncode == 6  # the gateway has no GPU


@needs_lab
def test_a_write_inside_a_host_changes_nothing_outside_it(lab):
    machine_hostname = socket.gethostname()
    machine_etc_hostname = Path("/etc/hostname").read_bytes()
    forward = Path("/proc/sys/net/ipv4/ip_forward").read_text()
    try:
        lab.exec("lab-1", "echo x > /etc/hostname; hostname node-0")
        lab.exec(
            "lab-1", "echo '10.77.0.1 node-0' >> /etc/hosts; mkdir -p /shared; touch /shared/f"
        )
        lab.exec("lab-1", "sysctl -qw net.ipv4.ip_forward=1; ip addr add 10.77.0.1/24 dev eth0")
        lab.exec("lab-1", "rm -f /usr/bin/tini; echo damaged > /usr/local/bin/nvidia-smi")
        assert lab.exec("lab-1", "hostname; cat /etc/hostname").stdout == "node-0\nx\n"
        # the machine
        assert socket.gethostname() == machine_hostname
        assert Path("/etc/hostname").read_bytes() == machine_etc_hostname
        assert not Path("/shared/f").exists()
        assert Path("/proc/sys/net/ipv4/ip_forward").read_text() == forward
        assert (
            "10.77.0.1"
            not in subprocess.run(["ip", "-4", "addr"], capture_output=True, text=True).stdout
        )
        # the image under every host, and the other host
        state = json.loads((lab.lab_dir / "state.json").read_text())
        base = Path(state["hosts"]["lab-1"]["lower"].split(":")[1])
        assert (base / "usr/bin/tini").exists()
        assert not (base / "etc/hostname").exists()
        assert lab.exec("lab-2", "hostname; cat /etc/hostname").stdout == "lab-2\nlab-2\n"
        assert lab.exec(
            "lab-2", "test -x /usr/bin/tini && head -2 /usr/local/bin/nvidia-smi"
        ).stdout
        assert lab.exec("lab-2", "test -e /shared", check=False).returncode != 0
        # root in a host cannot set the machine's clock nor its kernel settings
        assert lab.exec("lab-1", "date -s 2020-01-01", check=False).returncode != 0
        assert lab.exec("lab-1", "sysctl -w vm.swappiness=1", check=False).returncode != 0
    finally:
        lab.reset("lab-1")


@needs_lab
def test_reset_puts_a_host_back_as_up_made_it(lab, operator_key, tmp_path):
    key, _ = operator_key
    before = json.loads((lab.lab_dir / "state.json").read_text())["hosts"]["lab-1"]
    lab.exec("lab-1", "hostname node-7; echo node-7 > /etc/hostname; touch /root/marker")
    lab.exec("lab-1", "ip link add dummy0 type dummy; rm -rf /etc/ssh/sshd_config.d /root/.ssh")
    lab.exec("lab-1", "sleep 1000 > /dev/null 2>&1 &")
    started = time.monotonic()
    lab.reset("lab-1")
    assert time.monotonic() - started < 10
    after = json.loads((lab.lab_dir / "state.json").read_text())["hosts"]["lab-1"]
    assert after["init_pid"] != before["init_pid"]
    assert after["host_key"] == before["host_key"] == lab.hosts[0].host_key
    assert lab.exec("lab-1", "hostname; cat /etc/hostname").stdout == "lab-1\nlab-1\n"
    assert lab.exec("lab-1", "test -e /root/marker", check=False).returncode != 0
    assert lab.exec("lab-1", "ip link show dummy0", check=False).returncode != 0
    assert lab.exec("lab-1", "pgrep -x sleep", check=False).returncode != 0
    result = ssh(key, known_hosts(tmp_path, lab.hosts[0]), lab.hosts[0].address, "hostname")
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "lab-1"


@needs_lab
def test_exec_runs_inside_the_host_as_root(lab):
    result = lab.exec("lab-1", "id -u; cat /proc/1/cmdline | tr '\\0' ' '; echo; echo $$")
    uid, init, pid = result.stdout.splitlines()
    assert uid == "0" and init.startswith("/usr/bin/tini") and int(pid) < 1000
    assert lab.exec("172.30.77.11", "hostname").stdout == "lab-1\n"  # by address too
    assert lab.exec("lab-1", "cat", input="through stdin\n").stdout == "through stdin\n"
    failed = lab.exec("lab-1", "echo out; echo err >&2; exit 3", check=False)
    assert (failed.returncode, failed.stdout, failed.stderr) == (3, "out\n", "err\n")
    with pytest.raises(hostlab.LabExecError, match="status 3: err"):
        lab.exec("lab-1", "echo err >&2; exit 3")
    with pytest.raises(subprocess.TimeoutExpired):
        lab.exec("lab-1", "sleep 30", timeout=0.5)
    assert lab.exec("lab-1", "pgrep -x sleep", check=False).returncode != 0
    with pytest.raises(hostlab.LabError):
        lab.exec("lab-9", "true")


@needs_lab
def test_up_again_keeps_the_hosts_and_is_quick(lab, operator_key):
    state = json.loads((lab.lab_dir / "state.json").read_text())
    started = time.monotonic()
    again = hostlab.up(2, authorized_key=operator_key[1])
    assert time.monotonic() - started < 5
    assert again.hosts == lab.hosts and again.gateway == lab.gateway
    now = json.loads((lab.lab_dir / "state.json").read_text())
    for name in ("lab-gw", "lab-1", "lab-2"):
        assert now["hosts"][name]["init_pid"] == state["hosts"][name]["init_pid"]
    assert hostlab.current().hosts[:2] == lab.hosts


@needs_lab
def test_down_removes_everything_but_the_cache(lab, lab_before, operator_key):
    if hostlab.others_using():
        pytest.skip("another process that called hostlab.up() runs now: not taking its lab down")
    state = json.loads((lab.lab_dir / "state.json").read_text())
    pids = [h["init_pid"] for h in state["hosts"].values()] + [state["mirror"]["pid"]]
    cache = Path(state["cache"])
    hostlab.down()
    hostlab.down()  # idempotent
    assert hostlab.current() is None
    assert not Path("/sys/class/net/rclab0").exists()
    netns = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True).stdout
    assert "rclab-" not in netns
    links = subprocess.run(["ip", "-o", "link"], capture_output=True, text=True).stdout
    assert "rcl-" not in links
    tables = subprocess.run(["nft", "list", "tables"], capture_output=True, text=True).stdout
    assert "rclab" not in tables
    for pid in pids:
        stat = Path(f"/proc/{pid}/stat")
        assert not stat.exists() or stat.read_text().split(") ")[1][0] in "ZX"
    assert "rclab" not in Path("/proc/self/mountinfo").read_text()
    # what is sent to a lab address now fails here, instead of leaving by the default route
    guard = subprocess.run(["ip", "route", "get", "172.30.77.11"], capture_output=True, text=True)
    assert guard.returncode != 0 and "no route to host" in guard.stderr.lower()
    assert not (lab.lab_dir / "hosts").exists() and not (lab.lab_dir / "state.json").exists()
    assert any(cache.glob("base-bookworm-*/etc/os-release"))
    assert (cache / "mirror/debian/dists/bookworm/InRelease").exists()
    # a lab someone had up before this session comes back, with the same host keys
    if lab_before is not None:
        keys = state.get("authorized_keys", []) or [operator_key[1]]
        for key in keys:
            back = hostlab.up(
                len(lab_before.hosts), authorized_key=key, gateway=lab_before.gateway is not None
            )
        assert back.hosts == lab_before.hosts
    else:
        # and up after down is quick from the cache
        started = time.monotonic()
        back = hostlab.up(1, authorized_key=operator_key[1], gateway=False)
        assert time.monotonic() - started < 20
        assert back.hosts == lab.hosts[:1]  # the same host key as before down
        hostlab.down()
    assert os.geteuid() == 0
