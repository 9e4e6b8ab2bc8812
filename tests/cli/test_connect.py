"""`runcrate ssh`, `ssh-config`, `hostfile` and `kubeconfig`: the connect API's files, written
where OpenSSH reads them, and the system ssh run with them."""

import stat
import textwrap

import paramiko
import pytest

from tests.cli.kit import assert_no_traceback, ready_cluster, run_cli

pytestmark = pytest.mark.django_db(transaction=True)


def real_cluster(account, ticker):
    """A ready cluster whose machines are real ones (ssh hosts) as far as the API can tell:
    `runcrate ssh` logs in to those; a simulated one it refuses (below)."""
    from offers.models import Host

    cluster = ready_cluster(account, ticker)
    Host.objects.filter(nodes__cluster=cluster).update(driver=Host.Driver.SSH)
    return cluster


@pytest.fixture
def fake_ssh(tmp_path, env):
    """An `ssh` first on PATH that prints its arguments and the config it was given, and exits
    7, so the test sees that runcrate ran it (and passed its exit code on, by exec)."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    script = bin_dir / "ssh"
    script.write_text(
        textwrap.dedent(
            """\
            #!/bin/sh
            touch "$(dirname "$0")/ran"
            echo "ARGS $*"
            cat "$2"
            exit 7
            """
        )
    )
    script.chmod(0o755)
    return {**env, "PATH": f"{bin_dir}:{env['PATH']}"}


def test_ssh_runs_the_system_ssh_with_the_clusters_config(fake_ssh, tmp_path, account, ticker):
    cluster = real_cluster(account, ticker)

    result = run_cli("ssh", "train", "1", "--", "nvidia-smi", "-L", env=fake_ssh, tmp_path=tmp_path)

    assert result.code == 7  # ssh's own exit code: runcrate became ssh
    config_path = tmp_path / "home" / ".config" / "runcrate" / "ssh" / str(cluster.pk) / "config"
    assert result.stdout.splitlines()[0] == f"ARGS -F {config_path} train-node-1 nvidia-smi -L"
    assert stat.S_IMODE(config_path.stat().st_mode) == 0o600
    assert stat.S_IMODE(config_path.parent.stat().st_mode) == 0o700
    connect = account.api_data(f"/clusters/{cluster.pk}/connect")
    assert config_path.read_text() == connect["ssh_config"]  # no pinned keys: as the API gave it
    parsed = paramiko.SSHConfig.from_text(config_path.read_text()).lookup("train-node-1")
    assert parsed["hostname"] == connect["ssh"][1]["address"]
    assert parsed["user"] == "root"


def test_ssh_names_the_nodes_there_are_for_one_that_is_not(fake_ssh, tmp_path, account, ticker):
    real_cluster(account, ticker)

    result = run_cli("ssh", "train", "node-5", env=fake_ssh, tmp_path=tmp_path)

    assert result.code == 1
    assert "has no machine node-5: it has node-0, node-1" in result.stderr
    assert "ARGS" not in result.stdout
    assert_no_traceback(result)


def test_ssh_json_prints_the_command_instead_of_running_it(fake_ssh, tmp_path, account, ticker):
    real_cluster(account, ticker)

    result = run_cli("ssh", "train", "--json", env=fake_ssh, tmp_path=tmp_path)

    assert result.code == 0, result.stderr
    printed = result.json()
    assert printed["argv"] == ["ssh", "-F", printed["config"], "train"]
    assert not (tmp_path / "bin" / "ran").exists()


@pytest.mark.parametrize("json_flag", [False, True])
def test_ssh_refuses_a_simulated_cluster_and_never_starts_ssh(
    fake_ssh, tmp_path, account, ticker, json_flag
):
    # The demo's machines: the API says so (one field), and the CLI says why and runs no ssh,
    # so the user's machine never looks the gateway's name up (issue 37).
    cluster = ready_cluster(account, ticker)
    assert account.api_data(f"/clusters/{cluster.pk}/connect")["simulated"] is True

    args = ("ssh", "train", "1", *(["--json"] if json_flag else []), "--", "hostname")
    result = run_cli(*args, env=fake_ssh, tmp_path=tmp_path)

    assert result.code == 1
    assert "runs on the simulated data center (the demo)" in result.stderr
    assert "nothing to log in to and no ssh was run" in result.stderr
    assert not (tmp_path / "bin" / "ran").exists()  # the fake ssh was never started
    assert "ARGS" not in result.stdout
    assert not (tmp_path / "home" / ".config" / "runcrate" / "ssh" / str(cluster.pk)).exists()
    assert_no_traceback(result)


def test_ssh_config_points_each_host_at_the_pinned_keys(env, tmp_path, account, ticker):
    cluster = ready_cluster(account, ticker)
    # The simulated data center pins no key; a real driver does, as the connect API lists.
    cluster.nodes.filter(index=0).update(
        host_key="ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIOMqqnkVzrm0SdG6UOoqKLsabgH5C9okWi0dh2l9GKJl"
    )

    result = run_cli("ssh-config", "train", env=env, tmp_path=tmp_path)

    assert result.code == 0, result.stderr
    printed = result.json()
    ssh_dir = tmp_path / "home" / ".ssh" / "config.d"
    assert printed["config"] == str(ssh_dir / "runcrate-train")
    assert printed["include"] == "Include config.d/runcrate-train"
    assert printed["included"] is False
    known = ssh_dir / "runcrate-train.known_hosts"
    connect = account.api_data(f"/clusters/{cluster.pk}/connect")
    assert connect["known_hosts"] and known.read_text() == connect["known_hosts"]
    for path in (ssh_dir / "runcrate-train", known):
        assert stat.S_IMODE(path.stat().st_mode) == 0o600
    parsed = paramiko.SSHConfig.from_text((ssh_dir / "runcrate-train").read_text())
    entry = parsed.lookup("train-node-0")
    assert entry["userknownhostsfile"] == f"{known} ~/.ssh/known_hosts"
    assert entry["hostkeyalias"] == f"runcrate-c{cluster.pk}-node-0"


def test_ssh_config_knows_when_the_config_is_already_included(env, tmp_path, account, ticker):
    ready_cluster(account, ticker)
    ssh_dir = tmp_path / "home" / ".ssh"
    ssh_dir.mkdir(parents=True)
    (ssh_dir / "config").write_text("Include config.d/*\n\nHost *\n    ServerAliveInterval 30\n")

    result = run_cli("ssh-config", "train", env=env, tmp_path=tmp_path)

    assert result.json()["included"] is True


def test_hostfile_prints_the_file_itself_even_into_a_pipe(env, tmp_path, account, ticker):
    cluster = ready_cluster(account, ticker)

    result = run_cli("hostfile", "train", env=env, tmp_path=tmp_path)

    assert result.code == 0, result.stderr
    assert result.stdout == "node-0 slots=8\nnode-1 slots=8\n"
    as_json = run_cli("hostfile", str(cluster.pk), "--json", env=env, tmp_path=tmp_path)
    assert as_json.json() == account.api_data(f"/clusters/{cluster.pk}/connect")["hostfile"]


def test_kubeconfig_refuses_a_cluster_without_kubernetes(env, tmp_path, account, ticker):
    ready_cluster(account, ticker)

    result = run_cli("kubeconfig", "train", env=env, tmp_path=tmp_path)

    assert result.code == 1
    assert "runs no software, not Kubernetes" in result.stderr


def test_connect_details_wait_for_the_machines(env, tmp_path, account):
    from tests.clusters.lifecycle_kit import create, inventory

    create(account.project, inventory(hosts=2), name="early")

    result = run_cli("hostfile", "early", env=env, tmp_path=tmp_path)

    assert result.code == 1
    assert result.json()["error"]["code"] == "invalid_state"
