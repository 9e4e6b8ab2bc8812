"""Kubernetes on ssh hosts: what the driver gives install-kubernetes.sh (software.env), and the
installer itself up to the download, which is as far as it gets without a k3s release (the
lab's case; docs/drivers.md, "Kubernetes on ssh hosts"). The runs below fail before the
installer touches anything outside its own folder: the release is fetched and checked first."""

import base64
import http.server
import shlex
import shutil
import socket
import subprocess
import threading
from pathlib import Path

import pytest

from clusters import connect
from clusters.machines.base import InstallPlan, PlanNode
from clusters.machines.ssh import SCRIPTS, software_env
from tests.clusters.lifecycle_kit import create, inventory, node

INSTALLER = SCRIPTS / "install-kubernetes.sh"
MACHINE = subprocess.run(["uname", "-m"], capture_output=True, text=True).stdout.strip()
K3S_BINARY = {"x86_64": "k3s", "aarch64": "k3s-arm64"}.get(MACHINE)
needs_a_k3s_machine = pytest.mark.skipif(
    K3S_BINARY is None, reason=f"k3s has no release for {MACHINE}"
)


def plan_for(cluster, software: str = "kubernetes") -> InstallPlan:
    return InstallPlan(
        cluster_name=cluster.name,
        software=software,
        gpus_per_machine=8,
        boot_seconds=180,
        nodes=[
            PlanNode("node-0", "10.77.0.1", 8, is_head=True),
            PlanNode("node-1", "10.77.0.2", 8, is_head=False),
        ],
    )


def variables(env: str) -> dict[str, str]:
    return dict(line.split("=", 1) for line in shlex.split(env, posix=True))


@pytest.fixture
def kubernetes_cluster(project):
    cluster = create(project, inventory(hosts=2), software="kubernetes")
    head = node(cluster, 0)
    head.host.address = head.public_address = "203.0.113.7"  # what the ssh driver reports
    head.host.save()
    head.save()
    return cluster


def test_the_head_gets_the_release_the_admin_token_and_the_clusters_ca(
    kubernetes_cluster, settings
):
    settings.RUNCRATE_K3S_URL = "https://mirror.example/k3s/v1.32.3%2Bk3s1"
    head = node(kubernetes_cluster, 0)
    env = variables(software_env(head, plan_for(kubernetes_cluster)))
    shape = connect.shape_for(kubernetes_cluster, planning=True)
    assert env["K3S_URL"] == "https://mirror.example/k3s/v1.32.3%2Bk3s1"
    assert env["KUBE_ADMIN_TOKEN"] == connect.kube_token(shape)
    assert env["KUBE_API_ADDRESS"] == "203.0.113.7"
    ca = connect.kube_ca(shape)
    assert base64.b64decode(env["KUBE_CA_CERT_B64"]).decode() == ca.certificate
    assert base64.b64decode(env["KUBE_CA_KEY_B64"]).decode() == ca.key
    # The CA the head's k3s gets is the one in the kubeconfig users download.
    kubeconfig = connect.kubeconfig(shape)
    assert env["KUBE_CA_CERT_B64"] in kubeconfig
    assert env["ROLE"] == "head"


def test_other_nodes_and_other_software_get_no_kubernetes_secret(kubernetes_cluster):
    worker = variables(software_env(node(kubernetes_cluster, 1), plan_for(kubernetes_cluster)))
    assert worker["ROLE"] == "worker" and worker["K3S_URL"]
    assert not [name for name in worker if name.startswith("KUBE_")]
    slurm = variables(
        software_env(node(kubernetes_cluster, 0), plan_for(kubernetes_cluster, "slurm"))
    )
    assert not [name for name in slurm if name.startswith("KUBE_")]


# --- the installer -------------------------------------------------------------------------------


def test_the_installer_is_valid_sh_and_passes_shellcheck():
    subprocess.run(["sh", "-n", str(INSTALLER)], check=True)
    if shutil.which("shellcheck") is None:
        pytest.skip("shellcheck is not installed; sh -n passed")
    done = subprocess.run(["shellcheck", "-x", str(INSTALLER)], capture_output=True, text=True)
    assert done.returncode == 0, done.stdout


@pytest.mark.parametrize("script", sorted(INSTALLER.parent.glob("*.sh")), ids=lambda p: p.name)
def test_every_host_script_is_valid_sh_without_shellcheck_warnings(script):
    subprocess.run(["sh", "-n", str(script)], check=True)
    if shutil.which("shellcheck") is None:
        pytest.skip("shellcheck is not installed (CI installs it); sh -n passed")
    done = subprocess.run(
        ["shellcheck", "-x", "-s", "sh", "-S", "warning", str(script)],
        capture_output=True,
        text=True,
    )
    assert done.returncode == 0, done.stdout


def closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def run_installer(folder: Path, env: str) -> subprocess.CompletedProcess:
    """The installer from its own folder, as root would run it: `id` answers 0, so it gets as
    far as it would on a host (the runs here all stop at the release, before any change)."""
    shutil.copy(INSTALLER, folder / INSTALLER.name)
    shutil.copy(INSTALLER.parent / "installer.sh", folder / "installer.sh")
    (folder / "software.env").write_text(env)
    stubs = folder / "stubs"
    stubs.mkdir()
    (stubs / "id").write_text("#!/bin/sh\necho 0\n")
    (stubs / "id").chmod(0o755)
    path = f"{stubs}:/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
    return subprocess.run(
        ["sh", str(folder / INSTALLER.name)],
        capture_output=True,
        text=True,
        timeout=60,
        env={"PATH": path, "LANG": "C.UTF-8"},
    )


def worker_env(k3s_url: str) -> str:
    return (
        "SOFTWARE=kubernetes\nCLUSTER_NAME=train\nNODE_NAME=node-1\nROLE=worker\n"
        "HEAD_NAME=node-0\nHEAD_IP=10.77.0.1\nPRIVATE_IP=10.77.0.2\nNODES='node-0 node-1'\n"
        f"GPUS_PER_NODE=8\nCLUSTER_SECRET_B64=c2VjcmV0\nK3S_URL={k3s_url}\n"
    )


def verdict(done: subprocess.CompletedProcess) -> str:
    return done.stdout.strip().splitlines()[-1]


@needs_a_k3s_machine
def test_a_release_it_cannot_reach_fails_the_install_with_the_url_and_the_reason(
    kubernetes_cluster, settings, tmp_path
):
    port = closed_port()
    settings.RUNCRATE_K3S_URL = f"http://127.0.0.1:{port}/k3s/v1.32.3%2Bk3s1"
    # The head's own software.env, as the driver writes it.
    env = software_env(node(kubernetes_cluster, 0), plan_for(kubernetes_cluster))
    done = run_installer(tmp_path, env)
    assert done.returncode == 4, done.stdout + done.stderr
    assert verdict(done) == (
        f"runcrate: failed: could not fetch k3s from http://127.0.0.1:{port}/k3s/"
        f"v1.32.3%2Bk3s1/{K3S_BINARY}: [Errno 111] Connection refused"
    )
    # Nothing fetched is left behind.
    assert sorted(p.name for p in tmp_path.iterdir()) == [
        INSTALLER.name,
        "installer.sh",
        "software.env",
        "stubs",
    ]


@pytest.fixture
def mirror(tmp_path):
    """A release folder served on 127.0.0.1."""
    folder = tmp_path / "mirror"
    folder.mkdir()

    class Quiet(http.server.SimpleHTTPRequestHandler):
        def __init__(self, *args, **kwargs):
            super().__init__(*args, directory=str(folder), **kwargs)

        def log_message(self, *args):
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Quiet)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    yield folder, f"http://127.0.0.1:{server.server_address[1]}"
    server.shutdown()
    server.server_close()


@needs_a_k3s_machine
def test_a_mirror_without_k3s_says_so(mirror, tmp_path):
    folder, url = mirror
    host = tmp_path / "host"
    host.mkdir()
    done = run_installer(host, worker_env(url + "/"))
    assert done.returncode == 4
    assert verdict(done) == (
        f"runcrate: failed: could not fetch k3s from {url}/{K3S_BINARY}: HTTP 404 File not found"
    )


@needs_a_k3s_machine
def test_a_binary_that_does_not_match_its_checksum_is_never_installed(mirror, tmp_path):
    folder, url = mirror
    (folder / K3S_BINARY).write_bytes(b"#!/bin/sh\necho tampered\n")
    arch = "amd64" if K3S_BINARY == "k3s" else "arm64"
    (folder / f"sha256sum-{arch}.txt").write_text(f"{'0' * 64}  {K3S_BINARY}\n")
    host = tmp_path / "host"
    host.mkdir()
    done = run_installer(host, worker_env(url))
    assert done.returncode == 4
    assert verdict(done) == (
        f"runcrate: failed: {url}/{K3S_BINARY} does not match its sha256 in sha256sum-{arch}.txt"
    )
    assert not (host / "download").exists()
