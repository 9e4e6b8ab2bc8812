"""How the CLI words a cluster's one cost (docs/billing.md, "One cost"): the API's figures
with a `$` in front and its words for the time billed, nothing computed. `clusters show` has a
cost line, `clusters list` a cost column, and terminate prints one line with the final cost."""

from io import StringIO

from rich.console import Console

from runcrate_cli import output

RUNNING = {
    "id": 7,
    "name": "train",
    "status": "ready",
    "offer_id": "use2-h100x8-bm",
    "gpus_per_machine": 8,
    "gpu": "h100-sxm",
    "location": "us-east-2",
    "nodes": 5,
    "software": "none",
    "price_per_hour": "111.60",
    "machine_price_per_hour": "22.32",
    "environment": "default",
    "created_at": "2026-03-02T12:00:00Z",
    "machines": [],
    "cost_so_far": "1234.56",
    "final_cost": None,
    "billed_seconds": 7980,
    "billed_for": "2 h 13 min",
}
ENDED = {**RUNNING, "status": "terminating", "nodes": 4, "final_cost": "96.12"}
ENDED["cost_so_far"] = "96.12"


def printed(render, data) -> str:
    console = Console(file=StringIO(), width=120, color_system=None)
    render(console, data)
    return console.file.getvalue()


def test_it_prints_the_final_cost_as_terminates_last_line():
    assert printed(output.terminated, ENDED) == "Terminated: 4 machines for 2 h 13 min, $96.12\n"
    one = {**ENDED, "nodes": 1}
    assert output.terminated_line(one).startswith("Terminated: 1 machine for ")


def test_it_shows_the_cost_so_far_and_then_the_cost_in_all():
    assert "cost        $1234.56 so far, billed 2 h 13 min" in printed(output.cluster, RUNNING)
    assert "cost        $96.12 in all, billed 2 h 13 min" in printed(output.cluster, ENDED)


def test_the_list_has_a_cost_column():
    screen = printed(output.clusters, [RUNNING, ENDED])
    assert "$1234.56 so far" in screen and "$96.12 in all" in screen
    assert "cost" in screen.splitlines()[1]
