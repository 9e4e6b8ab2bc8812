"""`runcrate clusters network-test` starts the server's network test and, with --wait, prints
its result; `clusters show` prints the events and the last network test for a person."""

import pytest

from tests.cli.kit import assert_no_traceback, ready_cluster, run_cli, run_cli_tty

pytestmark = pytest.mark.django_db(transaction=True)


def test_it_runs_the_network_test_and_waits_for_its_result(env, tmp_path, account, ticker, sim):
    cluster = ready_cluster(account, ticker)

    result = run_cli(
        "clusters", "network-test", "train", "--wait",
        env=env, tmp_path=tmp_path, drive=sim.dispatcher.run,
    )  # fmt: skip

    assert result.code == 0, result.stderr
    printed = result.json()
    assert printed["state"] == "done"
    assert printed == account.api_data(f"/clusters/{cluster.pk}")["network_test"]
    assert printed["machines"] == ["node-0", "node-1"]
    assert_no_traceback(result)


def test_without_wait_it_answers_the_running_test_at_once(env, tmp_path, account, ticker):
    ready_cluster(account, ticker)

    result = run_cli("clusters", "network-test", "train", env=env, tmp_path=tmp_path)

    assert result.code == 0, result.stderr
    assert result.json()["state"] == "running"
    assert "`runcrate clusters show train` shows its result" in result.stderr


def test_show_prints_the_events_and_the_last_network_test(env, tmp_path, account, ticker, sim):
    cluster = ready_cluster(account, ticker, name="seen")
    before = run_cli_tty("clusters", "show", "seen", env=env, tmp_path=tmp_path)
    run_cli("clusters", "network-test", "seen", env=env, tmp_path=tmp_path)
    sim.dispatcher.run()

    after = run_cli_tty("clusters", "show", "seen", env=env, tmp_path=tmp_path)

    assert before.code == after.code == 0, after.stderr
    assert "None yet: `runcrate clusters network-test" in before.stdout
    test = account.api_data(f"/clusters/{cluster.pk}")["network_test"]
    assert test["state"] == "done"
    screen = after.stdout
    assert "Events" in screen and "network_test_started" in screen
    assert "Network test" in screen and "done" in screen
    assert f"Expected: {test['expected']}"[:60] in " ".join(screen.split())
    assert test["verdict"] in ("passed", "below what Ethernet should give")
    assert f"Verdict: {test['verdict']}" in screen  # the server's verdict, as the API says it
