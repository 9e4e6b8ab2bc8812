"""What the CLI prints: JSON (with `--json`, or whenever stdout is not a terminal, so a script
or an agent reading a pipe always gets JSON) or rich tables for a person.

In JSON mode a command prints the API's `data` (an object or a list), unchanged; an error is
the API's envelope, `{"error": {"code", "message", "status"}}`, on stdout, with the sentence on
stderr too.
"""

from __future__ import annotations

import json
import sys
from collections.abc import Callable
from typing import Any

from rich.console import Console, Group
from rich.panel import Panel
from rich.table import Table
from rich.text import Text

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


class Output:
    def __init__(self, *, json_flag: bool) -> None:
        self.json = json_flag or not sys.stdout.isatty()
        self.console = Console(highlight=False)

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


def status_text(status: str) -> Text:
    return Text(status, style=STATUS_STYLE.get(status, ""))


def money(value: str | None, suffix: str = "") -> str:
    return "—" if value is None else f"${value}{suffix}"


def _table(*columns: str, title: str | None = None) -> Table:
    table = Table(title=title, title_justify="left", header_style="bold")
    for column in columns:
        table.add_column(column)
    return table


# --- the catalog -------------------------------------------------------------------------------


def gpus(console: Console, rows: list[dict]) -> None:
    table = _table("GPU", "name", "memory", "from (machine)", "GPUs per machine")
    for gpu in rows:
        table.add_row(
            gpu["slug"],
            gpu["name"],
            f"{gpu['memory_gib']} GiB",
            money(gpu["lowest_machine_price_per_hour"], "/h"),
            ", ".join(str(n) for n in gpu["gpu_counts"]) or "none on offer",
        )
    console.print(table)


def offers(console: Console, rows: list[dict]) -> None:
    if not rows:
        console.print("No offer can start that many machines now.")
        return
    table = _table(
        "offer", "location", "GPUs", "kind", "network", "machine", "cluster", "free", "now"
    )
    for offer in rows:
        free = "some" if offer["nodes_available"] is None else str(offer["nodes_available"])
        kind = offer["machine_kind"] + (" (community)" if offer["community"] else "")
        table.add_row(
            offer["id"],
            offer["location"],
            f"{offer['gpus_per_machine']}× {offer['gpu']}",
            kind,
            offer["interconnect"],
            money(offer["machine_price_per_hour"], "/h"),
            money(offer["price_per_hour"], "/h"),
            free,
            status_text(offer["availability"].replace("_", " ")),
        )
    console.print(table)
    if any(offer["community"] for offer in rows):
        console.print("Community offers run on independent operators' hosts: keep secrets off.")


# --- clusters ---------------------------------------------------------------------------------


def clusters(console: Console, rows: list[dict]) -> None:
    if not rows:
        console.print("No clusters yet: `runcrate offers --gpu SLUG --nodes N` to pick one.")
        return
    table = _table("id", "name", "status", "nodes", "GPU", "location", "price", "created")
    for cluster in rows:
        table.add_row(
            str(cluster["id"]),
            cluster["name"],
            status_text(cluster["status"]),
            str(cluster["nodes"]),
            f"{cluster['gpus_per_machine']}× {cluster['gpu']}",
            cluster["location"],
            money(cluster["price_per_hour"], "/h"),
            str(cluster["created_at"])[:19].replace("T", " "),
        )
    console.print(table)


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


def machines_table(cluster: dict) -> Table:
    # The steps a machine passes before `done`: no install step without software.
    gates = [s for s in STEPS[:-1] if s != "install" or cluster.get("software") != "none"]
    table = _table("node", "status", "step", "progress", "private IP")
    for machine in cluster["machines"]:
        step = machine["step"]
        passed = len(gates) if step == "done" else gates.index(step) if step in gates else 0
        table.add_row(
            machine["name"],
            status_text(machine["status"]),
            step,
            "█" * passed + "░" * (len(gates) - passed),
            machine["private_ip"],
        )
    return table


def progress(cluster: dict) -> Group:
    """The live `--wait` display: the cluster's status and one row per machine."""
    header = Text.assemble(
        ("cluster ", "bold"),
        (f"{cluster['name']} ", "bold"),
        f"(id {cluster['id']}) ",
        status_text(cluster["status"]),
        f"  {cluster['nodes']}× {cluster['gpus_per_machine']} {cluster['gpu']} in "
        f"{cluster['location']}, {money(cluster['price_per_hour'], '/h')}",
    )
    parts: list[Any] = [header, machines_table(cluster)]
    sentence = failure_sentence(cluster)
    if sentence:
        parts.append(Text(sentence, style="red"))
    return Group(*parts)


def cluster(console: Console, data: dict) -> None:
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
    if data.get("ready_at"):
        lines.append(f"ready       {data['ready_at']}")
    if data.get("ended_at"):
        lines.append(f"ended       {data['ended_at']}")
    if data.get("volume"):
        lines.append(f"volume      {data['volume']['name']} (id {data['volume']['id']})")
    sentence = failure_sentence(data)
    if sentence:
        lines.append(f"failure     {sentence}")
    console.print(Panel("\n".join(lines), title=f"{data['name']} (id {data['id']})"))
    console.print(machines_table(data))


def events(console: Console, rows: list[dict]) -> None:
    table = _table("at", "node", "step", "reason", "message")
    for event in rows:
        table.add_row(
            str(event["at"])[:19].replace("T", " "),
            event.get("node") or "",
            event.get("step") or "",
            event["reason"],
            event["message"],
        )
    console.print(table)


# --- volumes, billing, quotes -------------------------------------------------------------------


def volumes(console: Console, rows: list[dict]) -> None:
    if not rows:
        console.print("No volumes.")
        return
    table = _table("id", "name", "location", "size", "per month", "attached to")
    for volume in rows:
        attached = volume.get("attached_to")
        table.add_row(
            str(volume["id"]),
            volume["name"],
            volume["location"],
            f"{volume['size_gb']} GB",
            money(volume["price_per_month"]),
            f"{attached['name']} (id {attached['id']})" if attached else "",
        )
    console.print(table)


def volume(console: Console, data: dict) -> None:
    volumes(console, [data])


def balance(console: Console, data: dict) -> None:
    hours = data.get("hours_remaining")
    console.print(f"Balance      {money(data['balance'])} {data.get('currency', 'USD')}")
    console.print(f"Burn rate    {money(data['burn_rate'], '/h')}")
    console.print(f"Lasts        {hours + ' h' if hours else 'while nothing runs: indefinitely'}")


def usage(console: Console, data: dict) -> None:
    meta = data["meta"]
    table = _table("cluster", "machine-hours", "total", title=f"Usage in {meta['month']}")
    for line in data["data"]:
        name = f"{line['name']} (id {line['cluster_id']})"
        total = money(line["total"]) + (" (accumulating)" if line["accumulating"] else "")
        table.add_row(name, line["hours"], total)
    console.print(table)
    console.print(f"Total usage  {money(meta['total_usage'])}")


def quotes(console: Console, rows: list[dict]) -> None:
    if not rows:
        console.print("No quote requests.")
        return
    table = _table("id", "status", "GPU", "nodes", "network", "location", "start", "weeks")
    for quote in rows:
        table.add_row(
            str(quote["id"]),
            quote["status"],
            quote["gpu"],
            str(quote["nodes"]),
            quote["interconnect"],
            quote.get("location") or "any",
            str(quote["start_date"]),
            str(quote["duration_weeks"]),
        )
    console.print(table)


def quote(console: Console, data: dict) -> None:
    quotes(console, [data])
