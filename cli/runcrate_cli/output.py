"""What the CLI prints: JSON (with `--json`, or whenever stdout is not a terminal, so a script
or an agent reading a pipe always gets JSON) or rich tables for a person.

In JSON mode a command prints the API's `data` (an object or a list), unchanged; an error is
the API's envelope, `{"error": {"code", "message", "status"}}`, on stdout, with the sentence on
stderr too.
"""

from __future__ import annotations

import json
import re
import sys
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from rich import box
from rich.cells import cell_len
from rich.console import Console, Group, RenderableType
from rich.panel import Panel
from rich.table import Table
from rich.text import Text

from runcrate_cli.client import utilization_summary

STEPS = ("running", "agent", "network", "install", "done")
STATUS_STYLE = {
    "ready": "green",
    "degraded": "yellow",
    "failed": "red",
    "terminating": "magenta",
    "terminated": "dim",
    "stopped": "red",
    "provisioning": "cyan",
    "installing": "cyan",
    "joined": "green",
    "starting": "cyan",
    "ended": "dim",
    "lost": "red",
}


# Whether the running command prints JSON, for the error handler (one command per process):
# set by every Output, whichever module made it (cli.py, keys.py).
json_mode: dict[str, bool] = {}


class Output:
    def __init__(self, *, json_flag: bool) -> None:
        self.json = json_flag or not sys.stdout.isatty()
        json_mode["json"] = self.json
        self.console = Console(highlight=False)
        # What a person reads beside JSON on stdout (a plan before a create, say): stderr.
        self.err_console = Console(stderr=True, highlight=False)

    @property
    def human(self) -> Console:
        """Where text for a person goes: stdout on a terminal, stderr beside JSON."""
        return self.err_console if self.json else self.console

    def emit(self, data: Any, render: Callable[[Console, Any], None] | None = None) -> None:
        if self.json or render is None:
            print_json(data)
        else:
            render(self.console, data)

    def note(self, message: str) -> None:
        """A sentence for the person at the terminal; stderr, so JSON on stdout stays pure.
        Never wrapped: a script may read it too."""
        sys.stderr.write(message + "\n")
        sys.stderr.flush()


def print_json(data: Any) -> None:
    sys.stdout.write(json.dumps(data, indent=2) + "\n")
    sys.stdout.flush()


# --- errors -----------------------------------------------------------------------------------

# What to run next, for the refusals a terminal user meets: said after the API's message.
HINTS = {
    "no_ssh_keys": "Add one: `runcrate ssh-keys add` (it reads ~/.ssh/id_ed25519.pub).",
    "unauthenticated": "Log in with a working key: `runcrate login`.",
    "scope_missing": "`runcrate auth status` shows this key's scopes; `runcrate login` with a "
    "key that has the scope.",
    "key_limit_exceeded": "`runcrate auth status` shows this key's limits.",
    "insufficient_balance": "`runcrate balance` shows it; add credit on the dashboard's Billing "
    "page.",
    "budget_reached": "`runcrate usage` shows this month's spend.",
    "name_taken": "`runcrate clusters list` shows the names in use; choose another --name.",
    "not_enough_machines": "`runcrate offers --gpu GPU --nodes N` lists the offers that can "
    "start them now.",
    "unknown_offer": "`runcrate offers --gpu GPU --nodes N` lists the offers and their ids.",
    "unknown_environment": "`runcrate auth status` lists your project's environments.",
    "plan_expired": "Run the same command again: it plans anew.",
    "plan_mismatch": "Run the same command again: it plans anew.",
}
# The API's paths that its messages cite, as the commands that do the same (most specific
# first); a path not here is left as the API wrote it.
_COMMANDS: tuple[tuple[str, str, str], ...] = (
    ("GET", r"/me", "runcrate auth status"),
    ("GET", r"/gpus", "runcrate gpus"),
    ("GET", r"/offers", "runcrate offers"),
    ("POST", r"/quotes", "runcrate quote request"),
    ("GET", r"/quotes/(\d+)", r"runcrate quote show \1"),
    ("GET", r"/quotes", "runcrate quote list"),
    ("POST", r"/clusters/plan", "runcrate clusters create"),
    ("POST", r"/clusters/(\d+)/terminate", r"runcrate clusters terminate \1"),
    ("POST", r"/clusters/(\d+)/workers/plan", r"runcrate clusters add-workers \1"),
    ("POST", r"/clusters/(\d+)/workers", r"runcrate clusters add-workers \1"),
    ("POST", r"/clusters/(\d+)/retry-install", r"runcrate clusters retry-install \1"),
    ("POST", r"/clusters/(\d+)/network-test", r"runcrate clusters network-test \1"),
    ("POST", r"/clusters/(\d+)/nodes/([\w-]+)/replace/plan", r"runcrate clusters replace \1 \2"),
    ("POST", r"/clusters/(\d+)/nodes/([\w-]+)/replace", r"runcrate clusters replace \1 \2"),
    ("GET", r"/clusters/(\d+)/connect", r"runcrate ssh \1"),
    ("GET", r"/clusters/(\d+)", r"runcrate clusters show \1"),
    ("GET", r"/clusters", "runcrate clusters list"),
    ("POST", r"/clusters", "runcrate clusters create"),
    ("GET", r"/ssh-keys", "runcrate ssh-keys list"),
    ("POST", r"/ssh-keys", "runcrate ssh-keys add"),
    ("DELETE", r"/ssh-keys/(\d+)", r"runcrate ssh-keys remove \1"),
    ("GET", r"/volumes", "runcrate volumes list"),
    ("POST", r"/volumes", "runcrate volumes create"),
    ("DELETE", r"/volumes/(\d+)", r"runcrate volumes delete \1"),
    ("GET", r"/billing/balance", "runcrate balance"),
    ("GET", r"/billing/usage", "runcrate usage"),
)
_API_CALL = re.compile(r"\b(GET|POST|DELETE|PATCH|PUT) /api/v1(/[\w\-/{}]*?)/?(?=[\s,;:.)'\"]|$)")


def _as_command(match: re.Match[str]) -> str:
    method, path = match.group(1), match.group(2)
    for wanted, pattern, command in _COMMANDS:
        found = re.fullmatch(pattern, path)
        if wanted == method and found:
            return f"`{found.expand(command)}`"
    return match.group(0)


def in_cli_words(message: str) -> str:
    """The API's message with the API calls it cites named as the commands that make them."""
    return _API_CALL.sub(_as_command, message)


def error_sentence(code: str, message: str) -> str:
    """A refusal for a person at a terminal: the API's message in the CLI's words, and what to
    run next where there is a command for it."""
    hint = HINTS.get(code)
    sentence = in_cli_words(message)
    return f"{sentence} {hint}" if hint and hint not in sentence else sentence


def status_text(status: str) -> Text:
    return Text(status, style=STATUS_STYLE.get(status, ""))


def money(value: str | None, suffix: str = "") -> str:
    return "—" if value is None else f"${value}{suffix}"


def _table(*columns: str, title: str | None = None) -> Table:
    table = Table(title=title, title_justify="left", header_style="bold")
    for column in columns:
        table.add_column(column)
    return table


Cell = str | Text


@dataclass(frozen=True)
class Column:
    """A table's column. A `whole` one holds what a person copies or compares (an id, a name,
    a status, a price): it is never cut, nor wrapped inside a value; the others wrap."""

    header: str
    whole: bool = False
    prose: bool = False  # sentences (a message): a word longer than the column may break


# The least width of a prose column, whose words may break (an email address in a message).
PROSE_MIN = 12
# What each column adds to the table's width: a space either side and a border; plus one edge.
COLUMN_EXTRA = 3


def _text(cell: Cell) -> str:
    return cell.plain if isinstance(cell, Text) else cell


def _width(cell: Cell) -> int:
    return max((cell_len(line) for line in _text(cell).splitlines()), default=0)


def _longest_word(cell: Cell) -> int:
    return max((cell_len(word) for word in _text(cell).split()), default=0)


def fit_table(
    width: int, columns: list[Column], rows: list[list[Cell]], *, title: str | None = None
) -> RenderableType:
    """The rows as a table at most `width` wide (the terminal's): its whole columns at their
    full width, the others narrowed (never below their longest word) and wrapping; where even
    that does not fit, one block per row (`header  value` lines). A whole value is never cut,
    at 80 columns or fewer."""
    needs = [
        max([_width(column.header), *(_width(row[i]) for row in rows)])
        for i, column in enumerate(columns)
    ]
    least = [
        need
        if column.whole
        else min(need, PROSE_MIN)
        if column.prose
        else max([_longest_word(column.header), *(_longest_word(row[i]) for row in rows)])
        for i, (column, need) in enumerate(zip(columns, needs, strict=True))
    ]
    room = width - COLUMN_EXTRA * len(columns) - 1
    if sum(least) > room:
        return _blocks(columns, rows, title=title)
    widths = _share(room, least, needs)
    table = Table(title=title, title_justify="left", header_style="bold")
    for column, column_width in zip(columns, widths, strict=True):
        table.add_column(
            column.header,
            width=column_width,
            no_wrap=column.whole,
            overflow="fold" if column.prose else "ellipsis",
        )
    for row in rows:
        table.add_row(*row)
    return table


def _share(room: int, least: list[int], needs: list[int]) -> list[int]:
    """Each column's width: all it needs where the room allows, else its least and a share of
    what is left in proportion to what it lacks."""
    if sum(needs) <= room:
        return needs
    spare = room - sum(least)
    lacking = [need - low for need, low in zip(needs, least, strict=True)]
    shares = [spare * lack // sum(lacking) for lack in lacking]
    return [low + share for low, share in zip(least, shares, strict=True)]


def _blocks(columns: list[Column], rows: list[list[Cell]], *, title: str | None) -> Group:
    blocks: list[RenderableType] = [Text(title, style="bold")] if title else []
    label = max(_width(column.header) for column in columns)
    for row in rows:
        grid = Table.grid(padding=(0, 2))
        grid.add_column(no_wrap=True, min_width=label, style="bold")
        grid.add_column()
        for column, cell in zip(columns, row, strict=True):
            grid.add_row(column.header, cell)
        blocks += [grid, Text("")]
    return Group(*blocks)


def track_record_badge(record: dict | None) -> str:
    """The offers page's track-record badge, in words: how many of the last 30 days' clusters
    started, and their median time to ready."""
    if not record:
        return "no track record yet"
    if record.get("ready_median_seconds") is None:
        return f"none of {record['clusters']} started"
    percent = record["started"] * 100 // record["clusters"]  # 199 of 200 reads 99%, never 100%
    ready = record["ready_median_minutes"]  # the server's rounding (half up)
    return f"{percent}% started · " + (f"~{ready} min" if ready else "<1 min")


# --- the catalog -------------------------------------------------------------------------------


def gpus(console: Console, rows: list[dict]) -> None:
    columns = [
        Column("GPU", whole=True),
        Column("name"),
        Column("memory"),
        Column("from (machine)", whole=True),
        Column("GPUs per machine"),
    ]
    table = [
        [
            gpu["slug"],
            gpu["name"],
            f"{gpu['memory_gib']} GiB",
            money(gpu["lowest_machine_price_per_hour"], "/h"),
            ", ".join(str(n) for n in gpu["gpu_counts"]) or "none on offer",
        ]
        for gpu in rows
    ]
    console.print(fit_table(console.width, columns, table))


def offers(console: Console, rows: list[dict]) -> None:
    if not rows:
        console.print("No offer can start that many machines now.")
        return
    columns = [
        Column("offer", whole=True),
        Column("machines"),
        Column("price", whole=True),
        Column("now"),
    ]
    table: list[list[Cell]] = []
    for offer in rows:
        free = "some" if offer["nodes_available"] is None else str(offer["nodes_available"])
        kind = offer["machine_kind"] + (" (community)" if offer["community"] else "")
        table.append(
            [
                offer["id"],
                f"{offer['gpus_per_machine']}× {offer['gpu']} in {offer['location']}, {kind}, "
                f"{offer['interconnect']}{_specs_line(offer)}\n"
                f"{track_record_badge(offer.get('track_record'))}",
                f"{money(offer['price_per_hour'], '/h')}\n"
                f"{money(offer['machine_price_per_hour'], '/h')} each\n"
                f"{money(offer['price_per_gpu_hour'], '/GPU-h')}",
                # The API's word (not_in_stock): one word, which a narrow column never splits.
                Text.assemble(status_text(offer["availability"]), f"\n{free} free"),
            ]
        )
    console.print(fit_table(console.width, columns, table))
    console.print(
        "price: the whole cluster, each machine and one GPU, per hour; the track record is how "
        "its clusters of the last 30 days started."
    )
    if any(offer["community"] for offer in rows):
        console.print("Community offers run on independent operators' hosts: keep secrets off.")


def _specs_line(data: dict) -> str:
    """Each machine's specs as the server words them, on a line of its own ("" when none)."""
    summary = (data.get("specs") or {}).get("summary")
    return f"\n{summary}" if summary else ""


# --- clusters ---------------------------------------------------------------------------------


def clusters(console: Console, rows: list[dict]) -> None:
    if not rows:
        console.print("No clusters yet: `runcrate offers --gpu SLUG --nodes N` to pick one.")
        return
    columns = [
        Column("id", whole=True),
        Column("name", whole=True),
        Column("status", whole=True),
        Column("machines"),
        Column("price", whole=True),
        Column("cost", whole=True),
    ]
    table = [
        [
            str(cluster["id"]),
            cluster["name"],
            status_text(cluster["status"]),
            f"{cluster['nodes']} × {cluster['gpus_per_machine']}× {cluster['gpu']} in "
            f"{cluster['location']}",
            money(cluster["price_per_hour"], "/h"),
            cost_words(cluster),
        ]
        for cluster in rows
    ]
    console.print(fit_table(console.width, columns, table))


def cost_words(cluster: dict) -> str:
    """A cluster's one cost as the API gives it (docs/billing.md, "One cost"): `$12.34 so far`
    while it may be billed, `$96.12 in all` once its machines are gone."""
    if cluster.get("final_cost") is not None:
        return f"{money(cluster['final_cost'])} in all"
    if cluster.get("cost_so_far") is None:
        return "—"
    return f"{money(cluster['cost_so_far'])} so far"


def terminated_line(cluster: dict) -> str:
    """Terminate's last line: "Terminated: 4 machines for 2 h 13 min, $96.12", from the API's
    count, its words for the time billed and the final cost."""
    count = cluster["nodes"]
    machines = f"{count} machine{'s' if count != 1 else ''}"
    if cluster.get("final_cost") is None:
        return f"Terminating: {machines}."
    return f"Terminated: {machines} for {cluster['billed_for']}, {money(cluster['final_cost'])}"


def terminated(console: Console, data: dict) -> None:
    console.print(terminated_line(data), markup=False, highlight=False)


def when(value: str | None) -> str:
    """An API time (ISO 8601, UTC) as `2026-03-01 10:00:00`."""
    return "" if value is None else str(value)[:19].replace("T", " ")


def failure_sentence(cluster: dict) -> str | None:
    """The failure as one line: which node, at which step, and the API's message. A degraded
    cluster's `failure` says why; from a server that sends none for it, its newest event naming
    a node does."""
    failure = cluster.get("failure")
    if not failure and cluster.get("status") == "degraded":
        failure = next(
            (e for e in reversed(cluster.get("events") or []) if e.get("node") and e.get("step")),
            None,
        )
    if not failure:
        return None
    where = " ".join(
        part
        for part in (
            failure.get("node") or "",
            f"at step {failure['step']}" if failure.get("step") else "",
        )
        if part
    )
    return f"{failure['reason']}" + (f" on {where}" if where else "") + f": {failure['message']}"


REPAIR_POLICIES = {
    "ask": "you replace a lost or unhealthy worker",
    "auto": "the product replaces a lost or unhealthy worker",
}


def repair_words(policy: str) -> str:
    """A cluster's repair policy, and what it means."""
    meaning = REPAIR_POLICIES.get(policy)
    return f"{policy}: {meaning}" if meaning else policy


def machine_name(machine: dict) -> str:
    """A machine's name, `node-2 (replaced)` for one a replacement took the place of: the
    cluster lists both under the name."""
    return machine["name"] + (" (replaced)" if machine.get("replaced_by") else "")


def machine_notes(machine: dict) -> str:
    """What a person should know of a machine beside its step: which machine it replaces or
    was replaced by (by id: both have the name), and why it was drained."""
    notes = []
    if machine.get("replaces"):
        notes.append(f"#{machine['id']}, replaces #{machine['replaces']}")
    if machine.get("replaced_by"):
        notes.append(f"#{machine['id']}, replaced by #{machine['replaced_by']}")
    if machine.get("drained"):
        notes.append(f"drained: {machine['drained']}")
    return "; ".join(notes)


def machines_table(cluster: dict, *, width: int) -> RenderableType:
    # The steps a machine passes before `done`: no install step without software.
    gates = [s for s in STEPS[:-1] if s != "install" or cluster.get("software") != "none"]
    columns = [
        Column("node", whole=True),
        Column("status", whole=True),
        Column("step", whole=True),
        Column("progress", whole=True),
        Column("private IP", whole=True),
    ]
    rows: list[list[Cell]] = []
    for machine in cluster["machines"]:
        step = machine["step"]
        passed = len(gates) if step == "done" else gates.index(step) if step in gates else 0
        rows.append(
            [
                machine_name(machine),
                status_text(machine["status"]),
                step,
                "█" * passed + "░" * (len(gates) - passed),
                machine["private_ip"] or "",
            ]
        )
    notes = [machine_notes(machine) for machine in cluster["machines"]]
    if any(notes):  # the column only for a cluster that has something to say
        columns.append(Column("notes", prose=True))
        rows = [[*row, Text(note)] for row, note in zip(rows, notes, strict=True)]
    return fit_table(width, columns, rows)


def progress(cluster: dict, *, width: int) -> Group:
    """The live `--wait` display: the cluster's status and one row per machine."""
    header = Text.assemble(
        ("cluster ", "bold"),
        (f"{cluster['name']} ", "bold"),
        f"(id {cluster['id']}) ",
        status_text(cluster["status"]),
        f"  {cluster['nodes']}× {cluster['gpus_per_machine']} {cluster['gpu']} in "
        f"{cluster['location']}, {money(cluster['price_per_hour'], '/h')}",
    )
    parts: list[Any] = [header, machines_table(cluster, width=width)]
    sentence = failure_sentence(cluster)
    if sentence:
        parts.append(Text(sentence, style="red"))
    return Group(*parts)


def cluster(console: Console, data: dict) -> None:
    """A cluster: its facts, its machines and, when the API gave them (`clusters show`), its
    events and its last network test."""
    lines = [
        f"status      {data['status']}",
        f"offer       {data['offer_id']} ({data['gpus_per_machine']}× {data['gpu']}, "
        f"{data['location']})",
        f"nodes       {data['nodes']}",
        f"software    {data['software']}",
        f"price       {money(data['price_per_hour'], '/h')} "
        f"({money(data['machine_price_per_hour'], '/h')} per machine)",
        f"environment {data['environment']}",
        f"created     {data['created_at']}",
    ]
    if "cost_so_far" in data:
        billed = f", billed {data['billed_for']}" if data.get("billed_seconds") else ""
        lines.append(f"cost        {cost_words(data)}{billed}")
    if data.get("ready_at"):
        lines.append(f"ready       {data['ready_at']}")
    if data.get("ended_at"):
        lines.append(f"ended       {data['ended_at']}")
    if data.get("volume"):
        lines.append(f"volume      {data['volume']['name']} (id {data['volume']['id']})")
    if data.get("repair_policy"):
        lines.append(f"repair      {repair_words(data['repair_policy'])}")
    sentence = failure_sentence(data)
    if sentence:
        lines.append(f"failure     {sentence}")
    console.print(Panel("\n".join(lines), title=f"{data['name']} (id {data['id']})"))
    console.print(machines_table(data, width=console.width))
    if data.get("events"):
        console.print(Text("Events", style="bold"))
        events(console, data["events"])
    if "network_test" in data:
        console.print(Text("Network test", style="bold"))
        if data["network_test"] is None:
            console.print(
                f"None yet: `runcrate clusters network-test {data['id']}` measures the private "
                "network between the machines."
            )
        else:
            network_test(console, data["network_test"])


def events(console: Console, rows: list[dict]) -> None:
    columns = [
        Column("at"),
        Column("node", whole=True),
        Column("step"),
        Column("reason", whole=True),
        Column("message", prose=True),
    ]
    table = [
        [
            when(event["at"]),
            event.get("node") or "",
            event.get("step") or "",
            event["reason"],
            event["message"],
        ]
        for event in rows
    ]
    console.print(fit_table(console.width, columns, table))


def network_test(console: Console, data: dict) -> None:
    """The last network test: its state, its figures (per message size for nccl, per machine
    to node-0 for the agent's test) and what the Ethernet network should give."""
    method = {"nccl": "all_reduce_perf (nccl-tests)", "agent": "each machine to node-0"}.get(
        data.get("method") or "", data.get("method") or "not measured yet"
    )
    state = Text.assemble(
        status_text(data["state"]),
        f"  {method}, started {when(data['started_at'])}",
        f", finished {when(data['finished_at'])}" if data.get("finished_at") else "",
        " (simulated figures)" if data.get("simulated") else "",
    )
    console.print(state)
    if data.get("error"):
        console.print(Text(data["error"], style="red"))
    if data.get("avg_busbw_gbs") is not None:
        console.print(
            f"Bus bandwidth {data['avg_busbw_gbs']:.3g} GB/s on average, "
            f"{data.get('peak_busbw_gbs')} GB/s at its peak."
        )
    if data.get("sizes"):
        columns = [Column("size", whole=True), Column("time"), Column("bus GB/s", whole=True)]
        rows: list[list[Cell]] = [
            [row["size"], _microseconds(row["time_us"]), str(row["busbw_gbs"])]
            for row in data["sizes"]
        ]
        console.print(fit_table(console.width, columns, rows))
    if data.get("pairs"):
        columns = [
            Column("node", whole=True),
            Column("to", whole=True),
            Column("Gbit/s", whole=True),
            Column("latency"),
            Column("tool"),
        ]
        rows = [
            [
                pair["node"],
                pair["to"],
                "—" if pair.get("gbit_s") is None else str(pair["gbit_s"]),
                "" if pair.get("latency_ms") is None else f"{pair['latency_ms']} ms",
                pair.get("error") or pair.get("tool") or "",
            ]
            for pair in data["pairs"]
        ]
        console.print(fit_table(console.width, columns, rows))
    if data.get("expected"):
        console.print(f"Expected: {data['expected']}", markup=False)
    if data.get("verdict"):  # the server's, by its verdict_rule
        style = "green" if data["verdict"] == "passed" else "yellow"
        console.print(Text.assemble("Verdict: ", (data["verdict"], style)))


def _microseconds(value: float) -> str:
    if value >= 1_000_000:
        return f"{value / 1_000_000:.2f} s"
    if value >= 1_000:
        return f"{value / 1_000:.1f} ms"
    return f"{value:g} µs"


# --- the plan -----------------------------------------------------------------------------------


def _facts(rows: list[tuple[str, Cell]]) -> Table:
    grid = Table.grid(padding=(0, 2))
    grid.add_column(no_wrap=True, style="bold")
    grid.add_column()
    for label, value in rows:
        grid.add_row(label, value)
    return grid


def plan(console: Console, data: dict) -> None:
    """What creating the cluster would do, as the server planned it (POST /clusters/plan)."""
    community = " (community: an independent operator's hosts, keep secrets off)"
    rows: list[tuple[str, Cell]] = [
        (
            "machines",
            f"{data['nodes']} × {data['offer_id']} in {data['location']}"
            + (community if data.get("community") else ""),
        ),
        (
            "GPUs",
            f"{data['gpus_total']} × {data['gpu']} ({data['gpus_per_machine']} per machine)",
        ),
        ("per machine", (data.get("specs") or {}).get("summary") or "specs not stated"),
        (
            "price",
            f"{money(data['price_per_hour'], '/h')}: "
            f"{money(data['machine_price_per_hour'], '/h')} per machine, "
            f"{money(data['price_per_gpu_hour'])} per GPU-hour",
        ),
        ("balance", _balance_line(data)),
        ("ready in", _ready_line(data)),
    ]
    network = data.get("network") or {}
    if network:
        rows.append(("network", f"{network.get('interconnect', '')}: {network.get('expected')}"))
        rows += [
            (label, network[key])
            for label, key in (("suits", "suits"), ("not for", "not_for"))
            if network.get(key)
        ]
    keys = data.get("ssh_key_ids") or []
    rows.append(
        (
            "software",
            f"{data['software']}; environment {data['environment']}; "
            f"{len(keys)} SSH key{'' if len(keys) == 1 else 's'}"
            + (f"; volume {data['volume_id']}" if data.get("volume_id") else ""),
        )
    )
    console.print(Text(f"Plan for cluster {data['name']}", style="bold"))
    console.print(_facts(rows))


def _balance_line(data: dict) -> str:
    if data.get("balance") is None:
        return "not shown to this key or role"
    running = data.get("running_price_per_hour")
    beside = (
        f" beside {money(running, '/h')} already running"
        if running and running not in ("0", "0.00")
        else ""
    )
    hours = data.get("hours_covered")
    lasts = f"lasts {hours} h" if hours is not None else "lasts indefinitely"
    return f"{money(data['balance'])} {lasts} at this cluster's price{beside}"


def _ready_line(data: dict) -> str:
    line = data.get("ready_estimate") or "—"  # the server's words: "about 4 min"
    if data.get("track_record"):
        line += f" (track record: {track_record_badge(data['track_record'])})"
    return line


def workers_plan(console: Console, data: dict) -> None:
    """What adding workers costs: the machines added × the cluster's machine price."""
    count = data["count"]
    console.print(
        Text(
            f"Add {count} machine{'' if count == 1 else 's'} to {data['name']} "
            f"(id {data['cluster_id']})",
            style="bold",
        )
    )
    console.print(
        _facts(
            [
                (
                    "added",
                    f"+{money(data['added_price_per_hour'], '/h')} "
                    f"({count} × {money(data['machine_price_per_hour'], '/h')})",
                ),
                ("now", f"{data['machines_now']} machines, {money(data['price_per_hour'], '/h')}"),
                (
                    "after",
                    f"{data['machines_after']} machines, {money(data['new_price_per_hour'], '/h')}",
                ),
            ]
        )
    )


def replace_plan(console: Console, data: dict, cluster: str) -> None:
    """What replacing a machine would do, as the server planned it (POST
    /clusters/{id}/nodes/{name}/replace/plan)."""
    console.print(
        Text(
            f"Replace {data['node']} of {cluster} (id {data['cluster_id']})",
            style="bold",
        )
    )
    console.print(
        _facts(
            [
                ("why", Text(data["why"])),
                ("address", f"{data['private_ip']}, kept by the new machine under its name"),
                (
                    "price",
                    f"{money(data['price_per_hour'], '/h')} for the new machine; the cluster "
                    f"{money(data['cluster_price_per_hour'], '/h')} once it is up",
                ),
                ("billing", Text(data["billing"])),
            ]
        )
    )


def auth_status(console: Console, data: dict) -> None:
    key = data["api_key"]
    limits = [
        f"{key['max_machines_per_cluster']} machines per cluster"
        if key.get("max_machines_per_cluster")
        else "",
        f"{money(key['max_usd_per_hour'], '/h')}" if key.get("max_usd_per_hour") else "",
    ]
    console.print(
        _facts(
            [
                ("user", f"{data['email']}" + (f" ({data['name']})" if data.get("name") else "")),
                ("project", f"{data['project']['name']} (id {data['project']['id']})"),
                (
                    "environments",
                    ", ".join(data["project"].get("environments") or []) or "default",
                ),
                ("key", f"{key['name']} ({key['prefix']}…) from {data['key_source']}"),
                ("scopes", ", ".join(key.get("scopes") or []) or "none"),
                ("limits", ", ".join(x for x in limits if x) or "none"),
                ("API", data["api_url"]),
            ]
        )
    )


# --- volumes, billing, quotes -------------------------------------------------------------------


def volumes(console: Console, rows: list[dict]) -> None:
    if not rows:
        console.print("No volumes.")
        return
    columns = [
        Column("id", whole=True),
        Column("name", whole=True),
        Column("location"),
        Column("size"),
        Column("per month", whole=True),
        Column("attached to"),
    ]
    table = []
    for volume in rows:
        attached = volume.get("attached_to")
        table.append(
            [
                str(volume["id"]),
                volume["name"],
                volume["location"],
                f"{volume['size_gb']} GB",
                money(volume["price_per_month"]),
                f"{attached['name']} (id {attached['id']})" if attached else "",
            ]
        )
    console.print(fit_table(console.width, columns, table))


def volume(console: Console, data: dict) -> None:
    volumes(console, [data])


def balance(console: Console, data: dict) -> None:
    hours = data.get("hours_remaining")
    console.print(f"Balance      {money(data['balance'])} {data.get('currency', 'USD')}")
    console.print(f"Burn rate    {money(data['burn_rate'], '/h')}")
    console.print(f"Lasts        {hours + ' h' if hours else 'while nothing runs: indefinitely'}")


def usage(console: Console, data: dict) -> None:
    meta = data["meta"]
    columns = [Column("cluster", whole=True), Column("machine-hours"), Column("total", whole=True)]
    table: list[list[Cell]] = [
        [
            f"{line['name']} (id {line['cluster_id']})",
            line["hours"],
            money(line["total"]) + (" (accumulating)" if line["accumulating"] else ""),
        ]
        for line in data["data"]
    ]
    console.print(fit_table(console.width, columns, table, title=f"Usage in {meta['month']}"))
    console.print(f"Total usage  {money(meta['total_usage'])}")


def quotes(console: Console, rows: list[dict]) -> None:
    if not rows:
        console.print("No quote requests.")
        return
    columns = [
        Column("id", whole=True),
        Column("status", whole=True),
        Column("GPU"),
        Column("nodes"),
        Column("network"),
        Column("location"),
        Column("start"),
        Column("weeks"),
    ]
    table = [
        [
            str(quote["id"]),
            quote["status"],
            quote["gpu"],
            str(quote["nodes"]),
            quote["interconnect"],
            quote.get("location") or "any",
            str(quote["start_date"]),
            str(quote["duration_weeks"]),
        ]
        for quote in rows
    ]
    console.print(fit_table(console.width, columns, table))


def quote(console: Console, data: dict) -> None:
    quotes(console, [data])


# --- metrics (`clusters top`) -------------------------------------------------------------------


def _figure(value: float | int | None, unit: str, *, digits: int = 0) -> str:
    return "—" if value is None else f"{value:.{digits}f}{unit}"


def _memory(gpu: dict) -> str:
    used, total = gpu.get("memory_used_mib"), gpu.get("memory_total_mib")
    if used is None and total is None:
        return "—"
    gib = [("—" if v is None else f"{v / 1024:.0f}") for v in (used, total)]
    return f"{gib[0]}/{gib[1]} GiB"


def _power(gpu: dict) -> str:
    draw, limit = gpu.get("power_w"), gpu.get("power_limit_w")
    if draw is None:
        return "—"
    return f"{draw:.0f}" + ("" if limit is None else f"/{limit:.0f}") + " W"


def _throttle(gpu: dict) -> str:
    reasons = gpu.get("throttle")
    if reasons is None:
        return "—"
    return ", ".join(reason for reason in reasons if reason != "gpu_idle") or "none"


def health_text(health: dict) -> Text:
    return Text(health["status"], style="green" if health["status"] == "healthy" else "red")


def _span_text(span: dict) -> str:
    mean, high = span["mean"], span["max"]
    if mean is None and high is None:
        return "—"
    return f"{_figure(mean, '')}/{_figure(high, '%')}"


def _node_cell(node: dict, position: int, count: int) -> Cell:
    """The node column: its name on its first GPU's row and its health on the second (both on
    the first with one GPU), so the table stays within 80 columns at 8 GPUs."""
    health = health_text(node["health"])
    if count <= 1:
        return Text.assemble(node["name"], "\n", health) if position == 0 else ""
    return node["name"] if position == 0 else health if position == 1 else ""


TOP_COLUMNS = ("node", "GPU", "util", "avg/max", "memory", "temp", "power", "throttle")


def top(name: str, cluster_id: int, data: dict, *, width: int, note: str | None = None) -> Group:
    """The live `clusters top` display: one row per GPU of each node from its latest report
    (utilisation, its mean and highest over the window, memory used/total, temperature, power
    draw/limit, throttle reasons), the node's health under its name, and what each unhealthy
    node's problems say under the table. Columns apart by two spaces, no borders: a monitor
    read at a glance, within 80 columns."""
    header = Text.assemble(
        ("cluster ", "bold"),
        (f"{name} ", "bold"),
        f"(id {cluster_id})  avg/max: utilisation over {data['window']}",
    )
    table = Table(box=box.SIMPLE_HEAD, padding=(0, 1, 0, 0), pad_edge=False, header_style="bold")
    for column in TOP_COLUMNS:
        table.add_column(column, no_wrap=column != "throttle", overflow="fold")
    problems: list[str] = []
    for node in data["nodes"]:
        problems += node["health"]["problems"]
        if not node["gpus"]:
            table.add_row(_node_cell(node, 0, 1), "—", "no report yet", *[""] * 5)
            continue
        for position, gpu in enumerate(node["gpus"]):
            table.add_row(
                _node_cell(node, position, len(node["gpus"])),
                str(gpu["index"]),
                _figure(gpu.get("utilization_percent"), "%"),
                _span_text(utilization_summary(node["series"], index=gpu["index"])),
                _memory(gpu),
                _figure(gpu.get("temperature_c"), " °C"),
                _power(gpu),
                _throttle(gpu),
            )
    parts: list[Any] = [header]
    if data.get("idle_notice") or data.get("idle_since"):
        notice = data.get("idle_notice") or f"Every GPU idle since {when(data['idle_since'])}"
        parts.append(Text(f"{notice} (nothing is stopped).", style="yellow"))
    parts.append(table if data["nodes"] else Text("No live machines."))
    parts += [Text(problem, style="red") for problem in problems]
    parts.append(Text(note or "Ctrl-C to stop.", style="dim"))
    return Group(*parts)
