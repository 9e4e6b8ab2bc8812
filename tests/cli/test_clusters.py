"""`runcrate clusters …` against a live server while the simulated data center runs: create and
wait until ready (exit 0), a failed cluster (exit 3, its node and step), list, show, events,
terminate (confirmation), names for ids."""

import contextlib
import signal
import subprocess
import sys
import time

import pytest

from accounts import keys
from clusters.models import Cluster
from tests.cli.kit import REPO, assert_no_traceback, ready_cluster, run_cli
from tests.clusters.lifecycle_kit import create, inventory

pytestmark = pytest.mark.django_db(transaction=True)


def test_it_creates_a_cluster_and_waits_until_it_is_ready(env, tmp_path, account, ticker):
    offer = inventory(hosts=3, boot_seconds=180, price="20.00")

    result = run_cli(
        "clusters",
        "create",
        "--offer",
        offer.slug,
        "--nodes",
        "2",
        "--name",
        "train",
        "--wait",
        "--yes",
        "--json",
        env=env,
        tmp_path=tmp_path,
        drive=ticker,
    )

    assert result.code == 0, result.stderr
    cluster = Cluster.objects.get(project=account.project)
    assert cluster.status == Cluster.Status.READY and cluster.name == "train"
    printed = result.json()
    assert printed["id"] == cluster.pk and printed["status"] == "ready"
    assert [m["status"] for m in printed["machines"]] == ["joined", "joined"]
    assert printed["price_per_hour"] == "40.00"
    assert "is ready" in result.stderr
    assert ticker.ticks > 1  # it waited through the machines' steps, not a single answer


def test_it_exits_non_zero_naming_the_failed_node_and_step(env, tmp_path, account, ticker):
    offer = inventory(hosts=3, boot_seconds=180, faults={1: "boot"})

    result = run_cli(
        "clusters",
        "create",
        "--offer",
        offer.slug,
        "--nodes",
        "2",
        "--name",
        "broken",
        "--wait",
        "--yes",
        env=env,
        tmp_path=tmp_path,
        drive=ticker,
    )

    assert result.code == 3, result.stderr
    cluster = Cluster.objects.get(project=account.project)
    assert cluster.status == Cluster.Status.FAILED
    assert "is failed: boot_timeout on node-1 at step running" in result.stderr
    assert cluster.failure_message in result.stderr
    assert result.json()["failure"]["node"] == "node-1"
    assert_no_traceback(result)


def test_it_exits_4_when_the_wait_times_out(env, tmp_path, account):
    offer = inventory(hosts=2)
    cluster = create(account.project, offer, name="slow")  # nothing ticks: it stays put

    result = run_cli("clusters", "wait", "slow", "--timeout", "1", env=env, tmp_path=tmp_path)

    assert result.code == 4
    assert result.json()["id"] == cluster.pk
    assert "still provisioning after 1 s" in result.stderr


def test_it_lists_shows_and_reads_events_as_json(env, tmp_path, account):
    offer = inventory(hosts=4)
    first = create(account.project, offer, name="alpha")
    second = create(account.project, offer, name="beta")

    listed = run_cli("clusters", "list", env=env, tmp_path=tmp_path)
    shown = run_cli("clusters", "show", "beta", "--json", env=env, tmp_path=tmp_path)
    events = run_cli("clusters", "events", str(first.pk), env=env, tmp_path=tmp_path)

    assert [c["name"] for c in listed.json()] == ["beta", "alpha"]  # newest first
    assert shown.json() == account.api_data(f"/clusters/{second.pk}")
    assert events.json() == account.api_data(f"/clusters/{first.pk}")["events"]
    assert events.json()[0]["reason"]


def test_it_refuses_to_terminate_without_a_terminal_or_yes(env, tmp_path, account):
    offer = inventory(hosts=2)
    cluster = create(account.project, offer, name="keep")

    refused = run_cli("clusters", "terminate", "keep", env=env, tmp_path=tmp_path)
    cluster.refresh_from_db()
    assert refused.code == 2 and "--yes" in refused.stderr
    assert cluster.status == Cluster.Status.PROVISIONING

    done = run_cli("clusters", "terminate", "keep", "--yes", env=env, tmp_path=tmp_path)
    cluster.refresh_from_db()
    assert done.code == 0, done.stderr
    # Nothing ticks here (the clock is frozen, no beat): the machines are still stopping.
    assert cluster.status == Cluster.Status.TERMINATING
    assert done.json()["status"] == "terminating"


def test_it_says_when_no_cluster_has_that_name(env, tmp_path, account):
    result = run_cli("clusters", "show", "nobody", env=env, tmp_path=tmp_path)

    assert result.code == 1
    assert result.json()["error"]["code"] == "not_found"
    assert "no cluster named 'nobody'" in result.stderr


def test_it_passes_the_apis_refusal_of_a_create_through(env, tmp_path, account):
    offer = inventory(hosts=1)

    result = run_cli(
        "clusters",
        "create",
        "--offer",
        offer.slug,
        "--nodes",
        "2",
        "--name",
        "big",
        env=env,
        tmp_path=tmp_path,
    )

    assert result.code == 1
    error = result.json()["error"]
    assert (error["code"], error["status"]) == ("not_enough_machines", 409)
    assert error["message"] in result.stderr
    assert not Cluster.objects.filter(project=account.project).exists()


def test_a_degraded_cluster_exits_3_and_its_install_can_be_retried(env, tmp_path, account, ticker):
    offer = inventory(hosts=2, faults={1: "install"})

    waited = run_cli(
        "clusters", "create", "--offer", offer.slug, "--nodes", "2", "--name", "slurmy",
        "--software", "slurm", "--wait", "--yes", env=env, tmp_path=tmp_path, drive=ticker,
    )  # fmt: skip

    assert waited.code == 3, waited.stderr
    cluster = Cluster.objects.get(project=account.project)
    assert cluster.status == Cluster.Status.DEGRADED
    assert cluster.failure_message == (
        "Installing Slurm failed on node-1: slurm service exited with status 1."
    )
    assert f"is degraded: install_failed on node-1 at step install: {cluster.failure_message}" in (
        waited.stderr
    )
    assert f"runcrate clusters retry-install {cluster.pk}" in waited.stderr

    retried = run_cli("clusters", "retry-install", "slurmy", env=env, tmp_path=tmp_path)

    assert retried.code == 0, retried.stderr
    cluster.refresh_from_db()
    assert cluster.status == Cluster.Status.INSTALLING
    assert retried.json()["status"] == "installing"


def test_it_adds_workers_to_a_ready_cluster(env, tmp_path, account, ticker):
    cluster = ready_cluster(account, ticker, hosts=3)

    result = run_cli(
        "clusters", "add-workers", "train", "--count", "1", "--yes", env=env, tmp_path=tmp_path
    )

    assert result.code == 0, result.stderr
    assert cluster.nodes.count() == 3
    assert [m["name"] for m in result.json()["machines"]] == ["node-0", "node-1", "node-2"]


def test_ctrl_c_stops_the_wait_not_the_cluster(env, tmp_path, account):
    offer = inventory(hosts=2)
    err_path = tmp_path / "wait.err"
    with err_path.open("w") as err:
        process = subprocess.Popen(
            [sys.executable, "-m", "runcrate_cli", "clusters", "create", "--offer", offer.slug,
             "--nodes", "2", "--name", "patient", "--wait", "--yes"],
            cwd=REPO, env=env, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=err,
        )  # fmt: skip
        try:
            deadline = time.monotonic() + 30
            while "Waiting for it" not in err_path.read_text():  # bounded: it is waiting
                assert time.monotonic() < deadline and process.poll() is None
                with contextlib.suppress(subprocess.TimeoutExpired):
                    process.wait(timeout=0.05)
            process.send_signal(signal.SIGINT)
            code = process.wait(timeout=10)
        finally:
            if process.poll() is None:
                process.kill()

    assert code == 130
    cluster = Cluster.objects.get(project=account.project)
    assert cluster.status == Cluster.Status.PROVISIONING
    assert f"Stopped waiting; cluster patient (id {cluster.pk}) goes on" in err_path.read_text()
    assert "Traceback" not in err_path.read_text()


def test_the_same_idempotency_key_twice_creates_one_cluster(env, tmp_path, account):
    offer = inventory(hosts=4)
    args = ("clusters", "create", "--offer", offer.slug, "--nodes", "2", "--name", "once", "--yes")

    first = run_cli(*args, "--idempotency-key", "run-42", env=env, tmp_path=tmp_path)
    again = run_cli(*args, "--idempotency-key", "run-42", env=env, tmp_path=tmp_path)

    assert first.code == again.code == 0, again.stderr
    assert first.json()["id"] == again.json()["id"]
    assert Cluster.objects.filter(project=account.project).count() == 1


def test_a_read_only_key_is_refused_a_create_with_the_apis_message(env, tmp_path, account):
    offer = inventory(hosts=2)
    _, read_only = keys.issue_api_key(
        user=account.user, project=account.project, name="reader", scopes=["read"]
    )

    result = run_cli(
        "clusters", "create", "--offer", offer.slug, "--nodes", "2", "--name", "nope",
        env={**env, "RUNCRATE_API_KEY": read_only}, tmp_path=tmp_path,
    )  # fmt: skip

    assert result.code == 1
    error = result.json()["error"]
    assert (error["code"], error["status"]) == ("scope_missing", 403)
    # The plan is refused as the create would be; stderr names the command, not the API call.
    assert error["message"].startswith("POST /api/v1/clusters needs")
    assert error["message"].replace("POST /api/v1/clusters", "`runcrate clusters create`") in (
        result.stderr
    )
    assert "runcrate auth status" in result.stderr
    assert not Cluster.objects.filter(project=account.project).exists()
