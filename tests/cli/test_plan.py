"""`runcrate clusters create` and `add-workers` show what they cost and ask first: the server's
plan (POST /api/v1/clusters/plan), a question on a terminal, --yes, --dry-run, and no create
at all without a terminal and without --yes."""

from datetime import timedelta

import pytest

from accounts.models import Environment, SshKey
from clusters.models import Cluster
from clusters.web import plans
from tests.cli.kit import assert_no_traceback, ready_cluster, run_cli, run_cli_tty
from tests.clusters.lifecycle_kit import inventory

pytestmark = pytest.mark.django_db(transaction=True)


def create_args(offer, name="train", nodes="2"):
    return ("clusters", "create", "--offer", offer.slug, "--nodes", nodes, "--name", name)


def api_plan(account, offer, name="train", nodes=2):
    response = account.api().post(
        "/api/v1/clusters/plan",
        {"offer_id": offer.slug, "nodes": nodes, "name": name},
        content_type="application/json",
    )
    assert response.status_code == 200, response.content
    return response.json()["data"]


def test_without_a_terminal_or_yes_it_prints_the_plan_and_creates_nothing(env, tmp_path, account):
    offer = inventory(hosts=3, price="20.00")

    result = run_cli(*create_args(offer), env=env, tmp_path=tmp_path)

    assert result.code == 2
    assert not Cluster.objects.filter(project=account.project).exists()
    assert result.stdout == ""  # no JSON: nothing was created
    assert "Plan for cluster train" in result.stderr
    assert "$40.00/h: $20.00/h per machine, $2.50 per GPU-hour" in result.stderr
    assert "16 × H100 SXM 80GB (8 per machine)" in result.stderr
    assert "nothing was created; pass --yes" in result.stderr
    assert_no_traceback(result)


def test_dry_run_prints_the_servers_plan_as_json_and_creates_nothing(env, tmp_path, account):
    offer = inventory(hosts=3, price="20.00")

    result = run_cli(*create_args(offer), "--dry-run", "--json", env=env, tmp_path=tmp_path)

    assert result.code == 0, result.stderr
    assert not Cluster.objects.filter(project=account.project).exists()
    printed, planned = result.json(), api_plan(account, offer)
    for changing in ("plan_token", "plan_expires_at"):
        assert printed.pop(changing) and planned.pop(changing)
    assert printed == planned
    assert printed["price_per_hour"] == "40.00" and printed["gpus_total"] == 16
    assert "Dry run: nothing was changed." in result.stderr


def test_dry_run_on_a_terminal_shows_how_long_the_balance_lasts(env, tmp_path, account, ticker):
    ready_cluster(account, ticker, name="running", hosts=2, price="30.00")  # $60/h runs
    offer = inventory(hosts=2, price="20.00")

    result = run_cli_tty(*create_args(offer), "--dry-run", env=env, tmp_path=tmp_path)

    planned = api_plan(account, offer)
    assert result.code == 0, result.stderr
    assert not Cluster.objects.filter(name="train").exists()
    screen = " ".join(result.stdout.split())
    assert "Plan for cluster train" in screen
    assert (
        f"${planned['balance']} lasts {planned['hours_covered']} h at this cluster's price "
        "beside $60.00/h already running"
    ) in screen
    assert "ready in about" in screen or "ready in under 1 min" in screen
    assert f"network {planned['network']['interconnect']}:" in screen


def test_a_yes_on_the_terminal_creates_the_planned_cluster(env, tmp_path, account):
    offer = inventory(hosts=2, price="20.00")

    result = run_cli_tty(*create_args(offer), env=env, tmp_path=tmp_path, answer="y")

    assert result.code == 0, result.stderr
    assert "Create cluster train for $40.00/h? [y/N]" in result.stdout
    cluster = Cluster.objects.get(project=account.project)
    assert cluster.name == "train" and cluster.nodes.count() == 2


def test_a_no_on_the_terminal_creates_nothing_and_exits_2(env, tmp_path, account):
    offer = inventory(hosts=2)

    result = run_cli_tty(*create_args(offer), env=env, tmp_path=tmp_path, answer="n")

    assert result.code == 2
    assert "nothing was created" in result.stderr
    assert not Cluster.objects.filter(project=account.project).exists()


def test_giving_up_at_the_question_creates_nothing_and_exits_130(env, tmp_path, account):
    offer = inventory(hosts=2)

    # Ctrl-D: the question reads the end of its input.
    result = run_cli_tty(*create_args(offer), env=env, tmp_path=tmp_path, answer="\x04")

    assert result.code == 130
    assert "nothing was created" in result.stderr
    assert not Cluster.objects.filter(project=account.project).exists()
    assert_no_traceback(result)


def test_the_create_carries_the_plan_so_a_stale_one_is_refused(env, tmp_path, account, clock):
    offer = inventory(hosts=2)

    # The question stays open for 11 minutes: the plan it showed is no longer the truth.
    result = run_cli_tty(
        *create_args(offer),
        env=env,
        tmp_path=tmp_path,
        answer="y",
        before_answer=lambda: clock.shift(timedelta(minutes=11)),
    )

    assert result.code == 1
    assert "(plan_expired, HTTP 422)" in result.stderr
    assert "Run the same command again: it plans anew." in result.stderr
    assert not Cluster.objects.filter(project=account.project).exists()


def test_a_refused_plan_is_shown_like_any_refusal_with_the_command_to_run(env, tmp_path, account):
    SshKey.objects.filter(project=account.project).delete()
    offer = inventory(hosts=2)

    result = run_cli(*create_args(offer), "--yes", env=env, tmp_path=tmp_path)

    assert result.code == 1
    assert result.json()["error"]["code"] == "no_ssh_keys"  # the API's code, kept
    assert "Add one: `runcrate ssh-keys add`" in result.stderr
    assert "Plan for cluster" not in result.stderr
    assert not Cluster.objects.filter(project=account.project).exists()


def test_add_workers_shows_the_added_cost_and_asks(env, tmp_path, account, ticker):
    cluster = ready_cluster(account, ticker, hosts=4, price="20.00")

    dry = run_cli(
        "clusters", "add-workers", "train", "--count", "2", "--dry-run", "--json",
        env=env, tmp_path=tmp_path,
    )  # fmt: skip
    refused = run_cli(
        "clusters", "add-workers", "train", "--count", "2", env=env, tmp_path=tmp_path
    )

    assert dry.code == 0, dry.stderr
    printed = dry.json()
    assert printed.pop("plan_token") and printed.pop("plan_expires_at")  # the server's plan
    assert printed == {
        "cluster_id": cluster.pk,
        "name": "train",
        "count": 2,
        "machine_price_per_hour": "20.00",
        "added_price_per_hour": "40.00",
        "machines_now": 2,
        "price_per_hour": "40.00",
        "machines_after": 4,
        "new_price_per_hour": "80.00",
        "balance_needed": "80.00",
        "billing": "+$40.00/h: each is billed from the moment it is up, at $20.00/h like the "
        "others, until the cluster is terminated; the cluster then costs $80.00/h.",
    }
    assert refused.code == 2
    assert "+$40.00/h (2 × $20.00/h)" in refused.stderr
    assert "4 machines, $80.00/h" in refused.stderr
    assert "nothing was added; pass --yes" in refused.stderr
    assert cluster.nodes.count() == 2


def test_add_workers_sends_the_plans_token(env, tmp_path, account, ticker, monkeypatch):
    cluster = ready_cluster(account, ticker, hosts=3, price="20.00")
    checked = []
    check = plans.check_token

    def spy(token, **kwargs):
        checked.append((token, kwargs["body"]))
        return check(token, **kwargs)

    monkeypatch.setattr(plans, "check_token", spy)

    result = run_cli(
        "clusters", "add-workers", "train", "--count", "1", "--yes", env=env, tmp_path=tmp_path
    )

    assert result.code == 0, result.stderr
    assert "+$20.00/h (1 × $20.00/h)" in result.stderr
    assert [body for _, body in checked] == [{"workers": cluster.pk, "count": 1, "machines": 2}]
    assert cluster.nodes.count() == 3


def test_add_workers_says_why_the_plan_refuses_and_adds_nothing(env, tmp_path, account, ticker):
    cluster = ready_cluster(account, ticker, hosts=3, price="20.00")
    Environment.objects.filter(pk=cluster.environment_id).update(monthly_budget=0)

    result = run_cli(
        "clusters", "add-workers", "train", "--count", "1", "--yes", env=env, tmp_path=tmp_path
    )

    assert result.code == 1  # the API refused
    assert "its whole monthly budget of $0.00" in result.stderr
    assert "+$20.00/h" not in result.stderr  # no plan, no price
    assert cluster.nodes.count() == 2
    assert_no_traceback(result)
