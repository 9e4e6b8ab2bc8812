"""`runcrate`: GPU clusters from a terminal, over the public API (docs/cli.md).

Exit codes (docs/cli.md, "Errors and exit codes"): 0 done; 1 the API refused (its message is
printed); 2 a usage error (a bad option, a confirmation not given); 3 a cluster (or a network
test) waited for settled in a state other than ready (failed, degraded, ended); 4 the wait
timed out; 5 no key, or a key the API refuses; 6 the API cannot be reached; 130 Ctrl-C (a wait
stops, the cluster goes on). No traceback reaches the user: an unexpected error is one sentence
(RUNCRATE_DEBUG=1 shows the traceback).
"""

from __future__ import annotations

import importlib.metadata
import os
import shutil
import sys
import time
from collections.abc import Callable, Sequence
from datetime import date
from typing import Annotated, Any, Literal

import typer
from rich.live import Live
from typer.core import TyperGroup

from runcrate_cli import config, output, ssh
from runcrate_cli.client import ApiClient, ApiError, configured_client, is_joining
from runcrate_cli.keys import keys_app
from runcrate_cli.output import Output

EXIT_REFUSED = 1
EXIT_USAGE = 2
EXIT_NOT_READY = 3
EXIT_TIMED_OUT = 4
EXIT_AUTH = 5
EXIT_UNREACHABLE = 6
EXIT_INTERRUPTED = 130
DISTRIBUTION = "runcrate-clusters-cli"


class RuncrateGroup(TyperGroup):
    """Turns every `ApiError` of every command into the API's message and its exit code
    (`exit_code`): one place, so no command can leak a traceback for a refusal."""

    # TyperGroup.invoke takes the Context of typer's private, vendored click (typer._click),
    # which typer exports only as its subclass typer.Context: what it passes here.
    def invoke(self, ctx: typer.Context) -> Any:  # type: ignore[override]
        output.json_mode.clear()
        try:
            return super().invoke(ctx)
        except (ApiError, config.ConfigError) as error:
            if isinstance(error, config.ConfigError):
                error = ApiError("bad_config", str(error))
            report(error, as_json=output.json_mode.get("json", not sys.stdout.isatty()))
            raise typer.Exit(exit_code(error)) from None


def exit_code(error: ApiError) -> int:
    """5 for a missing or refused key, 6 for an API that did not answer (or answered something
    that is not the API), 1 for any other refusal."""
    if error.status == 401 or error.code in ("no_api_key", "unauthenticated"):
        return EXIT_AUTH
    if error.transient or error.code == "not_the_api" or error.code.startswith("http_"):
        return EXIT_UNREACHABLE
    return EXIT_REFUSED


def report(error: ApiError, *, as_json: bool) -> None:
    """JSON mode: the API's envelope (its code and message, unchanged) on stdout. Always: the
    message on stderr in the CLI's words, naming the command to run next."""
    if as_json:
        output.print_json({"error": error.as_dict()})
    where = f" ({error.code}, HTTP {error.status})" if error.status else f" ({error.code})"
    sys.stderr.write(f"runcrate: {output.error_sentence(error.code, error.message)}{where}\n")


def _version(show: bool) -> None:
    if show:
        sys.stdout.write(f"runcrate {importlib.metadata.version(DISTRIBUTION)}\n")
        raise typer.Exit(0)


app = typer.Typer(
    cls=RuncrateGroup,
    name="runcrate",
    help="GPU clusters from a terminal: offers, clusters, SSH, volumes and billing over the "
    "Runcrate API. JSON with --json, or whenever stdout is not a terminal.",
    no_args_is_help=True,
    pretty_exceptions_enable=False,
)


@app.callback()
def _root(
    version: Annotated[
        bool,
        typer.Option(
            "--version", help="Print the version and exit.", is_eager=True, callback=_version
        ),
    ] = False,
) -> None:
    # The root's own options (--version); the help is the app's.
    return None


clusters_app = typer.Typer(
    no_args_is_help=True, help="Create, list, read, wait for and terminate clusters."
)
volumes_app = typer.Typer(
    no_args_is_help=True, help="Volumes: storage billed per GB-month, attached to a cluster."
)
quote_app = typer.Typer(
    no_args_is_help=True, help="Quotes: reserved capacity, more than 64 machines, InfiniBand."
)
auth_app = typer.Typer(
    no_args_is_help=True, help="Who the saved key is, and forgetting it (login saves one)."
)
app.add_typer(clusters_app, name="clusters")
app.add_typer(volumes_app, name="volumes")
app.add_typer(quote_app, name="quote")
app.add_typer(keys_app, name="ssh-keys")
app.add_typer(auth_app, name="auth")

Json = Annotated[
    bool, typer.Option("--json", help="Print JSON (the default when stdout is not a terminal).")
]
ClusterRef = Annotated[str, typer.Argument(help="The cluster's id or name.", show_default=False)]
Timeout = Annotated[
    float, typer.Option("--timeout", help="Give up waiting after this many seconds.", min=1)
]
Yes = Annotated[bool, typer.Option("--yes", "-y", help="Do not ask to confirm.")]
DryRun = Annotated[
    bool,
    typer.Option("--dry-run", help="Print the plan (JSON with --json) and change nothing."),
]


def _session(json_flag: bool) -> tuple[Output, ApiClient]:
    return _output(json_flag), configured_client()


def _output(json_flag: bool) -> Output:
    return Output(json_flag=json_flag)


def _usage_error(message: str) -> typer.Exit:
    sys.stderr.write(f"runcrate: {message}\n")
    return typer.Exit(EXIT_USAGE)


def _confirm(question: str, *, yes: bool, untouched: str = "Nothing was changed") -> None:
    """Ask on a terminal; without one, refuse (exit 2) unless --yes was given."""
    if yes:
        return
    if not sys.stdin.isatty():
        raise _usage_error(f"{question} Not asked without a terminal: {untouched}; pass --yes.")
    try:
        confirmed = typer.confirm(question, default=False)
    except typer.Abort:  # Ctrl-C or Ctrl-D at the question
        sys.stderr.write(f"\nruncrate: {untouched}.\n")
        raise typer.Exit(EXIT_INTERRUPTED) from None
    if not confirmed:
        sys.stderr.write(f"runcrate: {untouched}.\n")
        raise typer.Exit(EXIT_USAGE)


# --- login ----------------------------------------------------------------------------------


@app.command()
def login(
    url: Annotated[
        str | None,
        typer.Option(
            help="The dashboard's address (default: RUNCRATE_API_URL, the saved one, "
            f"or {config.DEFAULT_API_URL})."
        ),
    ] = None,
    key: Annotated[
        str | None,
        typer.Option(help="The API key (rc_live_…); asked for, or read from stdin, if left out."),
    ] = None,
    json_flag: Json = False,
) -> None:
    """Check an API key and save it, with the URL, for the other commands.

    Saved in ~/.config/runcrate/config.toml (mode 0600); RUNCRATE_API_URL and RUNCRATE_API_KEY
    override it.
    """
    out = _output(json_flag)
    api_url = config.normalise_url(url or config.load().api_url)
    if key is None:
        if sys.stdin.isatty():
            key = typer.prompt("API key (from the Account page)", hide_input=True)
        else:
            key = sys.stdin.readline()
    key = key.strip()
    if not key:
        raise _usage_error("Give an API key: --key rc_live_…, or paste it when asked.")
    with ApiClient(api_url=api_url, api_key=key) as client:
        me = client.me()
    path = config.save(api_url=api_url, api_key=key)
    result = {
        "api_url": api_url,
        "config_file": str(path),
        "email": me["email"],
        "project": me["project"]["name"],
        "api_key": me["api_key"]["prefix"],
    }
    out.emit(
        result,
        lambda console, r: console.print(
            f"Logged in to {r['api_url']} as {r['email']} (project {r['project']}); "
            f"saved to {r['config_file']}."
        ),
    )
    if os.environ.get("RUNCRATE_API_KEY"):
        out.note("Note: RUNCRATE_API_KEY is set and overrides the saved key.")


auth_app.command("login")(login)


@auth_app.command("status")
def auth_status(json_flag: Json = False) -> None:
    """Who the key is: its user, project, prefix, scopes and limits (GET /api/v1/me), and the
    URL. Exit 5 when no key is saved or the API refuses it."""
    out = _output(json_flag)
    settings = config.load()
    if not settings.api_key:
        raise ApiError(
            "no_api_key", "Not logged in: run `runcrate login`, or set RUNCRATE_API_KEY."
        )
    with ApiClient(api_url=settings.api_url, api_key=settings.api_key) as client:
        me = client.me()
    out.emit({**me, "api_url": settings.api_url, "key_source": settings.source}, output.auth_status)


@auth_app.command("logout")
def auth_logout(json_flag: Json = False) -> None:
    """Remove the saved key from the config file (the URL stays for the next login)."""
    out = _output(json_flag)
    path, removed = config.forget_key()
    result = {"config_file": str(path), "removed": removed}
    out.emit(
        result,
        lambda console, r: console.print(
            f"Removed the saved key from {r['config_file']}."
            if r["removed"]
            else f"No key was saved in {r['config_file']}.",
            markup=False,
        ),
    )
    if os.environ.get("RUNCRATE_API_KEY"):
        out.note("Note: RUNCRATE_API_KEY is still set: commands go on sending it.")


# --- the catalog ---------------------------------------------------------------------------


IncludeCommunity = Annotated[
    bool,
    typer.Option(
        "--include-community", help="Also show independent operators' hosts (keep secrets off)."
    ),
]


@app.command()
def gpus(include_community: IncludeCommunity = False, json_flag: Json = False) -> None:
    """The GPU models, with the lowest machine price and the GPU counts on offer."""
    out, client = _session(json_flag)
    with client:
        out.emit(client.gpus(include_community=include_community), output.gpus)


@app.command()
def offers(
    gpu: Annotated[str, typer.Option(help="A GPU's slug, from `runcrate gpus`.")],
    nodes: Annotated[int, typer.Option(help="How many machines: 2 to 64.")],
    include_community: IncludeCommunity = False,
    json_flag: Json = False,
) -> None:
    """The offers that can start NODES machines of GPU now, the best first."""
    out, client = _session(json_flag)
    with client:
        found = client.offers(gpu=gpu, nodes=nodes, include_community=include_community)
    out.emit(found, output.offers)


# --- clusters -------------------------------------------------------------------------------


def _lost_api(
    out: Output, client: ApiClient, cluster: dict, timeout: float
) -> Callable[[ApiError | None], None]:
    """What a wait says when the API stops answering, and when it answers again."""

    def said(error: ApiError | None) -> None:
        if error is None:
            out.note("The Runcrate API answers again; still waiting.")
            return
        answer = f", HTTP {error.status}" if error.status else ""
        out.note(
            f"Lost the Runcrate API at {client.api_url} ({error.code}{answer}); cluster "
            f"{cluster['name']} (id {cluster['id']}) goes on. Asking again, less and less "
            f"often, until the wait's limit ({timeout:g} s)..."
        )

    return said


def _wait(
    out: Output, client: ApiClient, cluster: dict, *, timeout: float, added: Sequence[str] = ()
) -> int:
    """Wait for the cluster to settle, live on a terminal; print it; return the exit code.
    `added`: the workers just added, which must have joined for a 0."""
    lost = _lost_api(out, client, cluster, timeout)
    try:
        if out.json:
            final, settled = client.wait_for_cluster(cluster["id"], timeout=timeout, on_lost=lost)
        else:
            width = out.console.width
            display = output.progress(cluster, width=width)
            with Live(display, console=out.console, refresh_per_second=4) as live:
                final, settled = client.wait_for_cluster(
                    cluster["id"],
                    timeout=timeout,
                    on_update=lambda current: live.update(output.progress(current, width=width)),
                    on_lost=lost,
                )
    except KeyboardInterrupt:
        out.note(
            f"Stopped waiting; cluster {cluster['name']} (id {cluster['id']}) goes on: "
            f"`runcrate clusters wait {cluster['id']}` to wait again."
        )
        return EXIT_INTERRUPTED
    except ApiError as error:
        if error.transient:
            out.note(
                f"Stopped waiting: the API did not answer again within {timeout:g} s. Cluster "
                f"{cluster['name']} (id {cluster['id']}) goes on: `runcrate clusters wait "
                f"{cluster['id']}` to wait again."
            )
        raise
    if out.json:
        output.print_json(final)
    return _verdict(out, final, settled=settled, timeout=timeout, added=added)


def _verdict(
    out: Output, cluster: dict, *, settled: bool, timeout: float, added: Sequence[str] = ()
) -> int:
    name, status = f"{cluster['name']} (id {cluster['id']})", cluster["status"]
    if not settled:
        starting = [m["name"] for m in cluster["machines"] if is_joining(cluster, m)]
        still = f"still {status}"
        if cluster["running"] and starting:
            are = "is" if len(starting) == 1 else "are"
            still = f"{status}, but {', '.join(starting)} {are} still starting"
        out.note(f"Cluster {name} is {still} after {timeout:g} s; it goes on without you.")
        return EXIT_TIMED_OUT
    missing = [m for m in cluster["machines"] if m["name"] in added and m["status"] != "joined"]
    if cluster["running"] and missing:
        why = [_machine_failure(cluster, machine) for machine in missing]
        out.note(f"Cluster {name} is {status}, but not every machine added joined: {' '.join(why)}")
        return EXIT_NOT_READY
    if status == "ready":
        joined = f" with {', '.join(added)}" if added else ""
        out.note(f"Cluster {name} is ready{joined}: `runcrate ssh {cluster['name']}` to log in.")
        return 0
    sentence = output.failure_sentence(cluster)
    message = f"Cluster {name} is {status}" + (f": {sentence}" if sentence else ".")
    if status == "degraded":
        message += _degraded_remedy(cluster)
    out.note(message)
    return EXIT_NOT_READY


# The failures of a machine, not of the install: a worker with one is replaced, not reinstalled.
MACHINE_FAILURES = frozenset({"machine_lost", "node_unhealthy"})


def _degraded_remedy(cluster: dict) -> str:
    """What to run for a degraded cluster: replace the lost or unhealthy worker, or install
    the software again (nothing for a head that was lost: it cannot be replaced)."""
    failure = cluster.get("failure") or {}
    if failure.get("reason") not in MACHINE_FAILURES:
        return f" `runcrate clusters retry-install {cluster['id']}` installs again."
    node = failure.get("node")
    if not node or node == "node-0":
        return ""
    return f" `runcrate clusters replace {cluster['id']} {node}` replaces it."


def _machine_failure(cluster: dict, machine: dict) -> str:
    """One added machine that did not join: its status and its newest event's message."""
    event = next(
        (e for e in reversed(cluster.get("events") or []) if e.get("node") == machine["name"]),
        None,
    )
    return f"{machine['name']} is {machine['status']}" + (
        f" ({event['message']})." if event else "."
    )


def _show_plan(out: Output, plan: dict, *, render: Any, dry_run: bool) -> None:
    """The plan for a person (on stderr beside JSON), or with --dry-run --json the plan itself
    as JSON on stdout."""
    if dry_run and out.json:
        output.print_json(plan)
    else:
        render(out.human, plan)
    if dry_run:
        out.note("Dry run: nothing was changed.")


# `clusters create`'s options.
SshKeys = Annotated[
    list[str] | None,
    typer.Option(
        "--ssh-key",
        help="An SSH key's id or name (repeat it); default: yours and the shared ones.",
    ),
]
VolumeOption = Annotated[
    str | None, typer.Option(help="A volume's id or name, mounted at /shared/volume.")
]
IdempotencyKey = Annotated[
    str | None,
    typer.Option(
        help="Running the same create again with this key (24 hours) answers the first "
        "one's cluster instead of renting a second: for scripts that retry."
    ),
]
WaitFlag = Annotated[
    bool, typer.Option("--wait", help="Show each machine's progress until it settles.")
]
# The API's repair policies (docs/lifecycle.md, "Repair").
RepairPolicy = Literal["ask", "auto"]
RepairPolicyOption = Annotated[
    RepairPolicy,
    typer.Option(
        "--repair-policy",
        help="Who replaces a lost or unhealthy worker: ask (you, with `runcrate clusters "
        "replace`) or auto (the product, by itself).",
    ),
]


def _plan_create(
    out: Output,
    client: ApiClient,
    fields: dict[str, Any],
    *,
    idempotency_key: str | None,
    yes: bool,
    dry_run: bool,
) -> str | None:
    """Show the server's plan for the create and ask to confirm its price: the plan's token.
    None when the create is a script's retry (sent again with its key); with --dry-run the
    plan is shown and nothing more."""
    name = fields["name"]
    try:
        plan = client.plan_cluster(client.cluster_body(**fields))
    except ApiError as error:
        # A script's retry of a create that happened: the name is its cluster's now, and
        # the create with the same key answers that cluster, renting nothing.
        if not (idempotency_key and error.code == "name_taken") or dry_run:
            raise
        out.note(f"A cluster is named {name}: sending the create again with its key.")
        return None
    _show_plan(out, plan, render=output.plan, dry_run=dry_run)
    if dry_run:
        return None
    _confirm(
        f"Create cluster {name} for {output.money(plan['price_per_hour'], '/h')}?",
        yes=yes,
        untouched="nothing was created",
    )
    return plan["plan_token"]


@clusters_app.command("create")
def clusters_create(
    offer: Annotated[str, typer.Option(help="The offer's id, from `runcrate offers`.")],
    nodes: Annotated[int, typer.Option(help="How many machines: 2 to the offer's max.")],
    name: Annotated[str, typer.Option(help="A DNS label, unique among your live clusters.")],
    software: Annotated[str, typer.Option(help="none, slurm, kubernetes or ray.")] = "none",
    ssh_key: SshKeys = None,
    volume: VolumeOption = None,
    environment: Annotated[str | None, typer.Option(help="An environment's name.")] = None,
    repair_policy: RepairPolicyOption = "ask",
    idempotency_key: IdempotencyKey = None,
    yes: Yes = False,
    dry_run: DryRun = False,
    wait: WaitFlag = False,
    timeout: Timeout = 1800,
    json_flag: Json = False,
) -> None:
    """Create a cluster: every machine at once, or none.

    Prints the server's plan first (machines, GPUs, price per hour and per GPU-hour, how long
    the balance lasts, time to ready, the network) and asks to confirm; --yes skips the
    question, --dry-run prints the plan and creates nothing. Without a terminal it creates
    only with --yes. Billing starts when every machine has joined. With --wait, each
    machine's progress is shown until the cluster is ready (exit 0), failed or degraded
    (exit 3). --repair-policy auto lets the product replace a lost or unhealthy worker by
    itself; change it later with `runcrate clusters repair-policy`.
    """
    out, client = _session(json_flag)
    with client:
        key_ids = client.resolve_ssh_keys(ssh_key) if ssh_key else None
        volume_id = client.resolve_volume(volume) if volume else None
        fields: dict[str, Any] = {
            "offer_id": offer,
            "nodes": nodes,
            "name": name,
            "software": software,
            "ssh_key_ids": key_ids,
            "volume_id": volume_id,
            "environment": environment,
            "repair_policy": repair_policy,
        }
        plan_token = _plan_create(
            out, client, fields, idempotency_key=idempotency_key, yes=yes, dry_run=dry_run
        )
        if dry_run:
            return
        created = client.create_cluster(
            **fields, idempotency_key=idempotency_key, plan_token=plan_token
        )
        if not wait:
            out.emit(created, output.cluster)
            return
        out.note(
            f"Created {created['name']} (id {created['id']}), {created['price_per_hour']} USD "
            "an hour once every machine joined. Waiting for it (Ctrl-C stops waiting, not "
            "the cluster)..."
        )
        code = _wait(out, client, created, timeout=timeout)
    raise typer.Exit(code)


@clusters_app.command("list")
def clusters_list(json_flag: Json = False) -> None:
    """Your project's clusters, newest first."""
    out, client = _session(json_flag)
    with client:
        out.emit(client.clusters(), output.clusters)


@clusters_app.command("show")
def clusters_show(cluster: ClusterRef, json_flag: Json = False) -> None:
    """A cluster: its status, failure, machines, events and its last network test."""
    out, client = _session(json_flag)
    with client:
        out.emit(client.cluster(client.resolve_cluster(cluster)), output.cluster)


@clusters_app.command("wait")
def clusters_wait(cluster: ClusterRef, timeout: Timeout = 1800, json_flag: Json = False) -> None:
    """Wait until the cluster is ready, degraded or ended; exit 0 only for ready."""
    out, client = _session(json_flag)
    with client:
        code = _wait(out, client, client.cluster(client.resolve_cluster(cluster)), timeout=timeout)
    raise typer.Exit(code)


@clusters_app.command("events")
def clusters_events(cluster: ClusterRef, json_flag: Json = False) -> None:
    """Every transition and failure of the cluster, oldest first."""
    out, client = _session(json_flag)
    with client:
        out.emit(client.cluster(client.resolve_cluster(cluster))["events"], output.events)


@clusters_app.command("terminate")
def clusters_terminate(cluster: ClusterRef, yes: Yes = False, json_flag: Json = False) -> None:
    """Stop every machine together and end billing now. Asks to confirm; --yes skips it."""
    out, client = _session(json_flag)
    with client:
        cluster_id = client.resolve_cluster(cluster)
        _confirm(
            f"Terminate cluster {cluster} (id {cluster_id})? Its machines and their disks go.",
            yes=yes,
        )
        out.emit(client.terminate(cluster_id), output.terminated)


@clusters_app.command("add-workers")
def clusters_add_workers(
    cluster: ClusterRef,
    count: Annotated[int, typer.Option(help="How many machines to add.", min=1)],
    yes: Yes = False,
    dry_run: DryRun = False,
    wait: Annotated[
        bool, typer.Option("--wait", help="Show each machine's progress until the new ones joined.")
    ] = False,
    timeout: Timeout = 1800,
    json_flag: Json = False,
) -> None:
    """Add machines to a ready cluster; each is billed from the moment it is up.

    Prints the server's plan (what they add to the price, COUNT × the machine price, and the
    new total, checked by the add's own rules) and asks to confirm; --yes skips the question,
    --dry-run changes nothing. The add carries the plan's token: the server refuses it for
    another count, or 10 minutes after the plan. With --wait, waits until
    every machine added has joined (exit 0), or one failed (exit 3).
    """
    out, client = _session(json_flag)
    with client:
        cluster_id = client.resolve_cluster(cluster)
        plan = client.plan_add_workers(cluster_id, count=count)
        _show_plan(out, plan, render=output.workers_plan, dry_run=dry_run)
        if dry_run:
            return
        _confirm(
            f"Add {count} machine{'' if count == 1 else 's'} to {plan['name']} for "
            f"+{output.money(plan['added_price_per_hour'], '/h')}?",
            yes=yes,
            untouched="nothing was added",
        )
        # The machines before, so a wait names the ones added.
        before = {machine["name"] for machine in client.cluster(cluster_id)["machines"]}
        grown = client.add_workers(cluster_id, count=count, plan_token=plan["plan_token"])
        if not wait:
            out.emit(grown, output.cluster)
            return
        added = [m["name"] for m in grown["machines"] if m["name"] not in before]
        out.note(
            f"Adding {', '.join(added)} to {grown['name']} (id {grown['id']}). Waiting until "
            "they joined (Ctrl-C stops waiting, not the machines)..."
        )
        code = _wait(out, client, grown, timeout=timeout, added=added)
    raise typer.Exit(code)


@clusters_app.command("replace")
def clusters_replace(
    cluster: ClusterRef,
    node: Annotated[
        str,
        typer.Argument(
            help="The lost or unhealthy worker: node-1 … node-N-1, or its number.",
            show_default=False,
        ),
    ],
    yes: Yes = False,
    dry_run: DryRun = False,
    json_flag: Json = False,
) -> None:
    """Replace a lost or unhealthy worker in place: a new machine takes its name and address.

    Prints the server's plan first (why the machine may be replaced, the private address the
    new one keeps, the new machine's price and the cluster's, what happens to the bill) and
    asks to confirm; --yes skips the question, --dry-run prints the plan and replaces
    nothing. Without a terminal it replaces only with --yes. node-0, the head, is never
    replaced. The new machine starts at once: `runcrate clusters wait CLUSTER` waits for it.
    """
    out, client = _session(json_flag)
    target = _node_name(node)
    with client:
        cluster_id = client.resolve_cluster(cluster)
        plan = client.plan_replace(cluster_id, target)
        _show_plan(
            out,
            plan,
            render=lambda console, planned: output.replace_plan(console, planned, cluster),
            dry_run=dry_run,
        )
        if dry_run:
            return
        _confirm(
            f"Replace {target} of {cluster} with a new machine at "
            f"{output.money(plan['price_per_hour'], '/h')}?",
            yes=yes,
            untouched="nothing was replaced",
        )
        replaced = client.replace_node(cluster_id, target, plan_token=plan["plan_token"])
    out.emit(replaced, output.cluster)
    out.note(
        f"A new machine is starting as {target} of {replaced['name']} (id {replaced['id']}), "
        f"at {plan['private_ip']}; it is billed from the moment it is up. "
        f"`runcrate clusters show {replaced['name']}` follows it; `runcrate clusters wait "
        f"{replaced['name']}` waits until it joined."
    )


@clusters_app.command("repair-policy")
def clusters_repair_policy(
    cluster: ClusterRef,
    policy: Annotated[
        RepairPolicy,
        typer.Argument(
            help="ask: you replace a lost or unhealthy worker (`runcrate clusters replace`); "
            "auto: the product replaces it by itself.",
            show_default=False,
        ),
    ],
    json_flag: Json = False,
) -> None:
    """Change who replaces a lost or unhealthy worker of a cluster that runs: ask or auto."""
    out, client = _session(json_flag)
    with client:
        changed = client.set_repair_policy(client.resolve_cluster(cluster), policy)
    out.emit(changed, output.cluster)
    out.note(f"Cluster {changed['name']} (id {changed['id']}): {output.repair_words(policy)}.")


@clusters_app.command("network-test")
def clusters_network_test(
    cluster: ClusterRef,
    wait: Annotated[bool, typer.Option("--wait", help="Wait for its result and print it.")] = False,
    timeout: Timeout = 900,
    json_flag: Json = False,
) -> None:
    """Measure the private network between the machines of a ready or degraded cluster.

    all_reduce_perf across them where nccl-tests is installed, otherwise each machine's
    bandwidth to node-0. It runs on the server; --wait prints the result once it finished
    (exit 0, or 3 when it failed; 4 past --timeout). `runcrate clusters show` shows the last
    one too.
    """
    out, client = _session(json_flag)
    with client:
        cluster_id = client.resolve_cluster(cluster)
        try:
            test = client.network_test(cluster_id)
        except ApiError as error:
            if not (wait and error.code == "network_test_running"):
                raise
            out.note("A network test already runs on it; waiting for that one.")
            test = {"state": "running"}
        if not wait:
            out.emit(test, output.network_test)
            out.note(
                f"It runs on: `runcrate clusters show {cluster}` shows its result once it finished."
            )
            return
        out.note("Measuring (Ctrl-C stops waiting, not the test)...")
        target = {"id": cluster_id, "name": cluster}
        try:
            final, finished = client.poll_until(
                lambda: client.cluster(cluster_id)["network_test"] or {"state": "running"},
                lambda current: current["state"] != "running",
                timeout=timeout,
                on_lost=_lost_api(out, client, target, timeout),
            )
        except KeyboardInterrupt:
            out.note("Stopped waiting; the network test goes on.")
            raise typer.Exit(EXIT_INTERRUPTED) from None
    out.emit(final, output.network_test)
    if not finished:
        out.note(f"The network test still runs after {timeout:g} s.")
        raise typer.Exit(EXIT_TIMED_OUT)
    raise typer.Exit(0 if final["state"] == "done" else EXIT_NOT_READY)


TOP_SECONDS = 3.0  # how often `clusters top` reads the metrics again (an agent reports every 15 s)


@clusters_app.command("top")
def clusters_top(
    cluster: ClusterRef,
    window: Annotated[
        str,
        typer.Option(
            help="The series' window: 15m, 1h, 24h or 7d (the mean/max column, and --json's "
            "series)."
        ),
    ] = "15m",
    every: Annotated[
        float, typer.Option("--every", help="Seconds between refreshes.", min=0.1)
    ] = TOP_SECONDS,
    json_flag: Json = False,
) -> None:
    """Each node's GPUs, live: utilisation, memory, temperature, power, throttle and health.

    Refreshes every few seconds until Ctrl-C (exit 0). With --json (or without a terminal),
    prints the metrics answer once: the latest figures per GPU and the window's series.
    """
    out, client = _session(json_flag)
    with client:
        cluster_id = client.resolve_cluster(cluster)
        data = client.metrics(cluster_id, window=window)  # a refusal (404, 422) ends it here
        if out.json:
            output.print_json(data)
            return
        width = out.console.width

        def frame(answer: dict, note: str | None = None) -> Any:
            return output.top(cluster, cluster_id, answer, width=width, note=note)

        try:
            with Live(frame(data), console=out.console, refresh_per_second=4) as live:
                while True:
                    time.sleep(every)
                    try:
                        data = client.metrics(cluster_id, window=window)
                    except ApiError as error:
                        if not error.transient:
                            raise
                        note = f"Lost the Runcrate API ({error.code}); figures as last read."
                        live.update(frame(data, note))
                        continue
                    live.update(frame(data))
        except KeyboardInterrupt:
            raise typer.Exit(0) from None


@clusters_app.command("retry-install")
def clusters_retry_install(cluster: ClusterRef, json_flag: Json = False) -> None:
    """Install the software again on a degraded cluster."""
    out, client = _session(json_flag)
    with client:
        out.emit(client.retry_install(client.resolve_cluster(cluster)), output.cluster)


# --- connecting -----------------------------------------------------------------------------


def _node_name(node: str) -> str:
    return f"node-{node}" if node.isdigit() else node


@app.command("ssh")
def ssh_command(
    cluster: ClusterRef,
    node: Annotated[
        str, typer.Argument(help="node-0 (the head) … node-N-1, or its number; default the head.")
    ] = "node-0",
    command: Annotated[
        list[str] | None, typer.Argument(help="A command to run there (after --).")
    ] = None,
    json_flag: Annotated[
        bool, typer.Option("--json", help="Print the ssh command and its files; run nothing.")
    ] = False,
) -> None:
    """Log in to a machine with your own ssh and the cluster's SSH config.

    The config and known_hosts are written to ~/.config/runcrate/ssh/ID/ (private), where
    the machine is `NAME-node-i`; run a command with `runcrate ssh CLUSTER 1 -- nvidia-smi`.
    """
    out, client = _session(json_flag)
    with client:
        cluster_id = client.resolve_cluster(cluster)
        connect = client.connect(cluster_id)
    if connect.get("simulated"):
        # Before any file or `ssh`: its addresses answer nowhere, and its gateway's name is a
        # reserved one (.invalid) that no resolver should be asked about.
        raise ApiError(
            "simulated",
            f"Cluster {cluster} runs on the simulated data center (the demo): its machines do "
            "not exist, so there is nothing to log in to and no ssh was run. The cluster "
            "page's Connect tab shows the commands as they would be on real machines.",
        )
    target = _node_name(node)
    entries = {entry["node"]: entry for entry in connect["ssh"]}
    if target not in entries:
        raise ApiError(
            "unknown_node",
            f"Cluster {cluster} has no machine {target}: it has {', '.join(entries) or 'none'}.",
        )
    if entries[target]["command"] is None:
        raise ApiError(
            "no_address",
            f"{target} has no address yet (its machine is still starting); try again soon.",
        )
    written = ssh.private_copy(cluster_id, connect)
    program = shutil.which("ssh")
    argv = ["ssh", "-F", str(written.config), entries[target]["hosts"][0], *(command or [])]
    if json_flag:  # only when asked: `runcrate ssh c -- hostname | grep …` must run ssh
        output.print_json(
            {
                "argv": argv,
                "config": str(written.config),
                "known_hosts": str(written.known_hosts) if written.known_hosts else None,
            }
        )
        return
    if program is None:
        raise ApiError("no_ssh", "There is no `ssh` on this computer's PATH: install OpenSSH.")
    sys.stdout.flush()
    os.execv(program, argv)  # noqa: S606 - the user's own ssh, with the arguments they gave


@app.command("ssh-config")
def ssh_config(cluster: ClusterRef, json_flag: Json = False) -> None:
    """Save the cluster's SSH config under ~/.ssh/config.d/ for your own ssh.

    Written as ~/.ssh/config.d/runcrate-NAME; add the `Include` line it prints to
    ~/.ssh/config, then `ssh NAME` reaches the head and `ssh NAME-node-1` … each node (never a
    bare `node-1`, so two clusters' configs never collide).
    """
    out, client = _session(json_flag)
    with client:
        cluster_id = client.resolve_cluster(cluster)
        connect = client.connect(cluster_id)
        name = client.cluster(cluster_id)["name"]
    written, include, included = ssh.user_config(name, connect)
    result = {
        "config": str(written.config),
        "known_hosts": str(written.known_hosts) if written.known_hosts else None,
        "include": include,
        "included": included,
        "ssh_names": connect["ssh_names"],
    }

    def show(console: Any, r: dict) -> None:
        console.print(f"Wrote {r['config']}.", markup=False)
        if r["included"]:
            console.print("~/.ssh/config already includes it.")
        else:
            console.print("Add this line at the top of ~/.ssh/config:", markup=False)
            console.print(f"    {r['include']}", markup=False)
        console.print(r["ssh_names"], markup=False)

    out.emit(result, show)


def _connect_for(cluster: str, client: ApiClient) -> dict:
    return client.connect(client.resolve_cluster(cluster))


@app.command()
def hostfile(
    cluster: ClusterRef,
    json_flag: Annotated[bool, typer.Option("--json", help="Print {path, content} as JSON.")] = (
        False
    ),
) -> None:
    """Print the cluster's MPI hostfile (node-i slots=GPUS).

    The file itself, even into a pipe (`runcrate hostfile c > hostfile`); --json gives
    {path, content}.
    """
    out, client = _session(json_flag)
    with client:
        data = _connect_for(cluster, client)["hostfile"]
    if json_flag:
        output.print_json(data)
    else:
        sys.stdout.write(data["content"])


@app.command()
def kubeconfig(
    cluster: ClusterRef,
    json_flag: Annotated[bool, typer.Option("--json", help="Print {kubeconfig} as JSON.")] = (
        False
    ),
) -> None:
    """Print the admin kubeconfig of a Kubernetes cluster.

    The file itself, even into a pipe (`runcrate kubeconfig c > kubeconfig.yaml`); --json gives
    {kubeconfig, api_server, tunnel}.
    """
    out, client = _session(json_flag)
    with client:
        connect = _connect_for(cluster, client)
    software = connect.get("software") or {}
    if software.get("name") != "kubernetes":
        raise ApiError(
            "not_kubernetes",
            f"Cluster {cluster} runs {software.get('name') or 'no software'}, not Kubernetes: "
            "it has no kubeconfig.",
        )
    if not software.get("kubeconfig"):
        raise ApiError(
            "no_address",
            "node-0 has no address yet, so there is no kubeconfig; try again once it runs.",
        )
    if json_flag:
        output.print_json(
            {key: software.get(key) for key in ("kubeconfig", "api_server", "tunnel")}
        )
        return
    sys.stdout.write(software["kubeconfig"])
    if software.get("tunnel"):
        out.note(f"Open the tunnel to node-0's API first: {software['tunnel']}")


# --- volumes ----------------------------------------------------------------------------------


@volumes_app.command("list")
def volumes_list(json_flag: Json = False) -> None:
    """Your project's volumes."""
    out, client = _session(json_flag)
    with client:
        out.emit(client.volumes(), output.volumes)


@volumes_app.command("create")
def volumes_create(
    name: Annotated[str, typer.Option(help="A DNS label, unique among your volumes.")],
    location: Annotated[str, typer.Option(help="A location's code, e.g. us-east-2.")],
    size_gb: Annotated[int, typer.Option("--size-gb", help="Its size in GB.")],
    json_flag: Json = False,
) -> None:
    """Create a volume, billed per GB-month from now, attached or not."""
    out, client = _session(json_flag)
    with client:
        out.emit(client.create_volume(name=name, location=location, size_gb=size_gb), output.volume)


@volumes_app.command("delete")
def volumes_delete(
    volume: Annotated[str, typer.Argument(help="The volume's id or name.", show_default=False)],
    yes: Yes = False,
    json_flag: Json = False,
) -> None:
    """Delete a volume and its files, and end its billing. Asks to confirm; --yes skips it."""
    out, client = _session(json_flag)
    with client:
        volume_id = client.resolve_volume(volume)
        _confirm(f"Delete volume {volume} (id {volume_id}) and every file on it?", yes=yes)
        client.delete_volume(volume_id)
    out.emit(
        {"id": volume_id, "deleted": True},
        lambda console, r: console.print(f"Deleted volume {volume} (id {r['id']})."),
    )


# --- billing ----------------------------------------------------------------------------------


@app.command()
def balance(json_flag: Json = False) -> None:
    """The project's balance, what runs burns per hour, and how long the balance lasts."""
    out, client = _session(json_flag)
    with client:
        out.emit(client.balance(), output.balance)


@app.command()
def usage(
    month: Annotated[str | None, typer.Option(help="YYYY-MM; this month by default.")] = None,
    json_flag: Json = False,
) -> None:
    """Usage of a month, per cluster (JSON: {data, meta} as the API gives it)."""
    out, client = _session(json_flag)
    with client:
        out.emit(client.usage(month=month), output.usage)


# --- quotes ----------------------------------------------------------------------------------


@quote_app.command("request")
def quote_request(
    gpu: Annotated[str, typer.Option(help="A GPU's slug.")],
    nodes: Annotated[int, typer.Option(help="How many machines.")],
    start_date: Annotated[str, typer.Option(help="YYYY-MM-DD.")],
    weeks: Annotated[int, typer.Option(help="How many weeks.")],
    contact_name: Annotated[str, typer.Option(help="Who sales should write to.")],
    contact_email: Annotated[str, typer.Option(help="Their email address.")],
    interconnect: Annotated[str, typer.Option(help="ethernet, infiniband or roce.")] = "ethernet",
    location: Annotated[str | None, typer.Option(help="A location's code; any if left out.")] = (
        None
    ),
    notes: Annotated[str, typer.Option(help="Anything sales should know.")] = "",
    json_flag: Json = False,
) -> None:
    """Ask sales for reserved capacity, more than 64 machines, or InfiniBand/RoCE."""
    try:
        date.fromisoformat(start_date)
    except ValueError:
        raise _usage_error(f"--start-date must be YYYY-MM-DD; got {start_date!r}.") from None
    out, client = _session(json_flag)
    with client:
        created = client.request_quote(
            gpu=gpu,
            nodes=nodes,
            interconnect=interconnect,
            location=location,
            start_date=start_date,
            duration_weeks=weeks,
            contact_name=contact_name,
            contact_email=contact_email,
            notes=notes,
        )
    out.emit(created, output.quote)


@quote_app.command("list")
def quote_list(json_flag: Json = False) -> None:
    """Your project's quote requests."""
    out, client = _session(json_flag)
    with client:
        out.emit(client.quotes(), output.quotes)


@quote_app.command("show")
def quote_show(
    quote_id: Annotated[int, typer.Argument(help="The quote request's id.")],
    json_flag: Json = False,
) -> None:
    """One quote request."""
    out, client = _session(json_flag)
    with client:
        out.emit(client.quote(quote_id), output.quote)


# --- the MCP server ---------------------------------------------------------------------------


@app.command()
def mcp(
    http: Annotated[
        bool, typer.Option("--http", help="Serve streamable HTTP instead of stdio.")
    ] = False,
    host: Annotated[str, typer.Option(help="--http: the address to bind.")] = "127.0.0.1",
    port: Annotated[int, typer.Option(help="--http: the port.")] = 8765,
) -> None:
    """Run the MCP server for AI agents (stdio, or streamable HTTP with --http).

    An MCP client starts `runcrate mcp` itself; --http serves http://HOST:PORT/mcp for hosted
    agents. See docs/mcp.md.
    """
    from runcrate_cli import mcp_server  # the SDK is only imported when serving

    # mcp_server.main reads the config itself: over stdio nothing but protocol messages may
    # reach stdout, not even a damaged config file's error.
    mcp_server.main(http=http, host=host, port=port)


def main(args: Sequence[str] | None = None, *, prog_name: str | None = None) -> None:
    """The `runcrate` console script: the command line's arguments by default, or `args` (the
    tests run the CLI in their own process with them, tests/cli/in_process.py)."""
    try:
        app(args=args, prog_name=prog_name)
    except KeyboardInterrupt:
        sys.stderr.write("\nruncrate: interrupted.\n")
        sys.exit(130)
    except Exception as error:  # the last guard: a sentence, never a traceback
        if os.environ.get("RUNCRATE_DEBUG"):
            raise
        sys.stderr.write(
            f"runcrate: unexpected error: {type(error).__name__}: {error}. "
            "Set RUNCRATE_DEBUG=1 to see where.\n"
        )
        sys.exit(1)


if __name__ == "__main__":
    main()
