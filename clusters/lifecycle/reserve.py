"""Creating a cluster: SPEC §2's refusals in order, then every host reserved in one transaction
with row locks (all or none)."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from decimal import Decimal

from django.db import IntegrityError, connection, transaction
from django.db.models import QuerySet, Sum
from django.utils import timezone

import audit
from accounts import keys
from accounts.models import ApiKey, Environment, Membership, Project, SshKey, User
from billing import balances, budgets, ledger
from clusters import connect, volumes
from clusters.errors import ClusterRefused
from clusters.lifecycle import dispatch
from clusters.lifecycle.rules import agent_token, running_deadline, token_hash
from clusters.models import (
    NAME_RE,
    QUOTED_MAX_NODES,
    Cluster,
    DueCluster,
    Event,
    Node,
    Volume,
    give_up_after,
)
from offers.models import (
    MAX_NODES,
    MIN_NODES,
    TOO_FEW_NODES,
    Host,
    MachineType,
    QuoteRequest,
)
from offers.offers import Availability, Offer, get_offer, offered_hosts
from offers.visibility import sees_drills
from runcrate.money import usd

Status = Cluster.Status
Step = Node.Step
NodeStatus = Node.Status
Reason = Event.Reason

# --- reservation ---------------------------------------------------------------------------


class _TooFewUnlocked(Exception):
    """Fewer free hosts than asked for were not locked by others: look again, waiting."""


def reserve_hosts(
    *, machine_type: MachineType, count: int, now: datetime, among: QuerySet[Host] | None = None
) -> list[Host]:
    """Take `count` free hosts of `machine_type`, all or none. Call inside a transaction.

    On PostgreSQL the rows are locked (`FOR UPDATE SKIP LOCKED`): two requests racing for the
    last machines never get the same one, and neither waits on the other. A request that finds
    too few unlocked rows lets go of what it locked (a savepoint) and asks again, this time
    waiting for the rows others hold (in the same order, so no two waiters deadlock): it is
    refused only when, after everyone ahead of it has committed or given up, too few are free,
    so N racing requests for a pool of P get exactly min(N, P // size) clusters. SQLite has no
    row locks; its IMMEDIATE transactions (see settings) already let one writer in at a time.
    The conditional update is checked either way. `among` narrows the hosts drawn from (a
    replacement's: none quarantined lately); by default, every offered one.
    """
    offered = offered_hosts() if among is None else among
    free = offered.filter(machine_type=machine_type).order_by("pk")
    hosts: list[Host] = []
    if connection.features.has_select_for_update_skip_locked:
        try:
            with transaction.atomic():
                hosts = list(free.select_for_update(skip_locked=True)[:count])
                if len(hosts) < count:
                    raise _TooFewUnlocked
        except _TooFewUnlocked:
            hosts = list(free.select_for_update()[:count])
    else:
        hosts = list(free[:count])
    taken = 0
    if len(hosts) == count:
        taken = Host.objects.filter(pk__in=[h.pk for h in hosts], state=Host.State.FREE).update(
            state=Host.State.RESERVED, state_changed_at=now
        )
    if taken != count:
        raise ClusterRefused(
            "not_enough_machines",
            f"Only {len(hosts) if taken == 0 else taken} machines of this type are free right "
            f"now and this needs {count}; nothing was reserved. Pick another offer or fewer "
            "machines.",
            field="nodes",
        )
    return hosts


def new_nodes(
    *, cluster: Cluster, hosts: list[Host], first_index: int, is_worker: bool, now: datetime
) -> list[Node]:
    machine_type = cluster.machine_type
    nodes = []
    for offset, host in enumerate(hosts):
        node = Node(
            cluster=cluster,
            index=first_index + offset,
            host=host,
            holds_host=True,
            is_worker=is_worker,
            status=NodeStatus.STARTING,
            step=Step.RUNNING,
            step_started_at=now,
            reserved_at=now,
            version=cluster.version,
        )
        node.step_deadline = running_deadline(node, machine_type, start=now)
        node.agent_token_hash = token_hash(agent_token(node))
        nodes.append(node)
    return Node.objects.bulk_create(nodes)


# --- create ------------------------------------------------------------------------------------


def _resolve_ssh_keys(
    *,
    project: Project,
    user: User | None,
    ssh_key_ids: list[int] | None,
    member_ids: list[int] | None,
) -> list[SshKey]:
    """The keys a new cluster gets (docs/accounts.md, "SSH keys on clusters"): the keys asked for
    by id and every key of the members asked for; with neither, the creator's own and the
    project's shared ones (accounts/keys.py `default_cluster_keys`)."""
    if ssh_key_ids is None and member_ids is None:
        found = keys.default_cluster_keys(project=project, user=user)
        if not found:
            raise ClusterRefused(
                "no_ssh_keys",
                "Add an SSH public key first (or choose one): every node needs a key to let you in."
                if user is None or not SshKey.objects.filter(project=project).exists()
                else "You have no SSH key in this project: add yours, or choose the keys of the "
                "members who will log in.",
                field="ssh_keys",
            )
        return found
    chosen: dict[int, SshKey] = {}
    if member_ids:
        chosen.update(_members_keys(project=project, member_ids=member_ids))
    if ssh_key_ids:
        wanted = set(ssh_key_ids)
        by_id = SshKey.objects.filter(project=project, pk__in=wanted).select_related("created_by")
        chosen.update((key.pk, key) for key in by_id)
        missing = wanted - set(chosen)
        if missing:
            raise ClusterRefused(
                "unknown_ssh_key",
                f"SSH key {', '.join(str(m) for m in sorted(missing))} is not one of this "
                "project's keys.",
                field="ssh_keys",
            )
    if not chosen:
        raise ClusterRefused(
            "no_ssh_keys",
            "Add an SSH public key first (or choose one): every node needs a key to let you in."
            if member_ids is None
            else "The members chosen have no SSH key in this project: choose keys or members "
            "who have one.",
            field="ssh_keys",
        )
    return [chosen[pk] for pk in sorted(chosen)]


def _members_keys(*, project: Project, member_ids: list[int]) -> dict[int, SshKey]:
    """Every key of the members asked for, by id; refused when one is not in the project."""
    wanted_members = set(member_ids)
    known = set(
        Membership.objects.filter(project=project, pk__in=wanted_members).values_list(
            "pk", flat=True
        )
    )
    if wanted_members - known:
        raise ClusterRefused(
            "unknown_member",
            f"Member {', '.join(str(m) for m in sorted(wanted_members - known))} is not in "
            "this project (GET /api/v1/members lists its members).",
            field="members",
        )
    return {
        key.pk: key for key in keys.members_cluster_keys(project=project, member_ids=wanted_members)
    }


@dataclass(frozen=True)
class Quoted:
    """Staff's terms for a quoted cluster (SPEC §7): the won quote request it comes from and
    the price per machine-hour agreed with the requester. Given to `create_cluster`, it lifts
    only the self-serve rules (listed offers, Ethernet only, at most MAX_NODES machines, the
    cap of a location that only says whether it has machines); every other rule stands."""

    quote: QuoteRequest
    price_per_machine_hour: Decimal


def _self_serve_offer(*, offer_slug: str, nodes: int, drills: bool) -> Offer:
    """A listed offer that can start `nodes` machines now (a failure-drill location's only with
    `drills`: to anyone else it does not exist)."""
    offer = get_offer(slug=offer_slug, nodes=nodes, include_drills=drills)
    if offer is None:
        raise ClusterRefused(
            "unknown_offer", f"There is no self-serve offer {offer_slug!r}.", field="offer"
        )
    machine_type = offer.machine_type
    assert isinstance(machine_type, MachineType)  # get_offer's offer holds the model
    if offer.availability is Availability.RESERVED_AHEAD:
        raise ClusterRefused(
            "invalid_nodes",
            f"{machine_type.location.name} only says whether it has machines, so self-serve "
            f"clusters there stop at {offer.max_nodes} machines; request a quote for {nodes}.",
            field="nodes",
        )
    if not offer.is_available:
        free = f"only {offer.free_hosts} are free" if offer.counts_capacity else "none are free"
        raise ClusterRefused(
            "not_enough_machines",
            f"This offer cannot start {nodes} machines now: {free}. Pick fewer machines or "
            "another offer.",
            field="nodes",
        )
    return offer


def _quoted_type(*, quoted: Quoted, project: Project, offer_slug: str) -> MachineType:
    """Any machine type, listed or not (InfiniBand, RoCE), for a won quote of this project."""
    quote = quoted.quote
    if quote.project_id != project.pk:
        raise ClusterRefused("unknown_quote", "That quote request is not this project's.")
    if quote.status != QuoteRequest.Status.WON:
        raise ClusterRefused(
            "quote_not_won",
            f"Quote request {quote.pk} is {quote.status}; a quoted cluster comes from a won one.",
            field="quote",
        )
    price = quoted.price_per_machine_hour
    if not isinstance(price, Decimal) or not price.is_finite() or price <= 0:
        raise ClusterRefused(
            "invalid_price",
            "The agreed price per machine-hour is a positive amount in USD.",
            field="agreed_price_per_machine_hour",
        )
    machine_type = (
        MachineType.objects.select_related("location", "gpu").filter(slug=offer_slug).first()
    )
    if machine_type is None:
        raise ClusterRefused(
            "unknown_offer", f"There is no machine type {offer_slug!r}.", field="machine_type"
        )
    return machine_type


def size_refusal(nodes: object, *, max_nodes: int = MAX_NODES) -> ClusterRefused | None:
    """Why `nodes` is not a size a cluster may have (None when it is): MIN_NODES to `max_nodes`
    machines (MAX_NODES self-serve, QUOTED_MAX_NODES on a quote). The create's rule, which the
    create page asks too."""
    if isinstance(nodes, int) and not isinstance(nodes, bool) and nodes < MIN_NODES:
        return ClusterRefused("invalid_nodes", TOO_FEW_NODES, field="nodes")
    if isinstance(nodes, bool) or not isinstance(nodes, int) or not MIN_NODES <= nodes <= max_nodes:
        return ClusterRefused(
            "invalid_nodes",
            f"A cluster has {MIN_NODES} to {max_nodes} machines; {nodes!r} is not in that range.",
            field="nodes",
        )
    return None


@dataclass(frozen=True)
class Checked:
    """What the checks before a reservation found: the offer (None for a quoted cluster), the
    machine type, the price per machine-hour the cluster is billed at, the volume to attach and
    the SSH keys to install."""

    offer: Offer | None
    machine_type: MachineType
    price_per_machine_hour: Decimal
    volume: Volume | None
    keys: list[SshKey]


def check_create(
    *,
    project: Project,
    environment: Environment,
    offer_slug: str,
    nodes: int,
    name: str,
    software: str,
    ssh_key_ids: list[int] | None = None,
    volume_id: int | None = None,
    quoted: Quoted | None = None,
    user: User | None = None,
    member_ids: list[int] | None = None,
) -> Checked:
    """The create's checks that need no lock, in SPEC §2's order: the environment, the size,
    the offer and its capacity, the name and its uniqueness, the software, the volume, the SSH
    keys, then the balance. Raises ClusterRefused; writes nothing."""
    if environment.project_id != project.pk:
        raise ClusterRefused("unknown_environment", "No such environment in this project.")
    refusal = size_refusal(nodes, max_nodes=MAX_NODES if quoted is None else QUOTED_MAX_NODES)
    if refusal is not None:
        raise refusal
    offer = None
    if quoted is None:
        drills = sees_drills(user=user, project=project)
        offer = _self_serve_offer(offer_slug=offer_slug, nodes=nodes, drills=drills)
        machine_type = offer.machine_type
        assert isinstance(machine_type, MachineType)  # get_offer's offer holds the model
        price_per_machine_hour = machine_type.price_per_hour
    else:
        machine_type = _quoted_type(quoted=quoted, project=project, offer_slug=offer_slug)
        price_per_machine_hour = quoted.price_per_machine_hour
    _require_name(name, environment)
    _require_software(software, machine_type)
    volume = None
    if volume_id is not None:
        volume = volumes.volume_to_attach(
            project=project, volume_id=volume_id, machine_type=machine_type
        )
    chosen_keys = _resolve_ssh_keys(
        project=project, user=user, ssh_key_ids=ssh_key_ids, member_ids=member_ids
    )
    require_balance(
        project=project,
        price_per_hour=price_per_machine_hour * nodes,
        doing="creating this cluster",
    )
    return Checked(
        offer=offer,
        machine_type=machine_type,
        price_per_machine_hour=price_per_machine_hour,
        volume=volume,
        keys=chosen_keys,
    )


def _require_name(name: object, environment: Environment) -> None:
    """Refuse a name that is not a DNS label, or that a live cluster of the environment has."""
    if not isinstance(name, str) or not NAME_RE.fullmatch(name):
        raise ClusterRefused(
            "invalid_name",
            "A cluster name is a DNS label: 1-63 lowercase letters, digits and hyphens, starting "
            "and ending with a letter or digit.",
            field="name",
        )
    if Cluster.objects.filter(environment=environment, name=name, status__in=Cluster.LIVE).exists():
        raise _name_taken(name, environment)


def _require_software(software: str, machine_type: MachineType) -> None:
    """Refuse software that is not offered, or Kubernetes on containers."""
    if software not in Cluster.Software.values:
        raise ClusterRefused(
            "software_not_offered",
            f"Software {software!r} is not offered; choose none, slurm, kubernetes or ray.",
            field="software",
        )
    if software == Cluster.Software.KUBERNETES and not machine_type.supports_kubernetes:
        raise ClusterRefused(
            "software_not_offered",
            "Kubernetes needs virtual machines or bare metal; this offer runs containers.",
            field="software",
        )


def check_locked(
    *,
    environment: Environment,
    api_key: ApiKey | None,
    machine_type: MachineType,
    nodes: int,
    now: datetime,
) -> None:
    """The create's checks that hold a lock until its transaction ends: the environment's
    budget (its row locked, see `create_cluster`) and the key's limits (its row locked). Call
    inside a transaction."""
    require_budget(environment=budgets.lock_environment(environment), now=now)
    require_key_limits(api_key=api_key, machine_type=machine_type, machines=nodes, adding=nodes)


def plan_create(
    *,
    project: Project,
    environment: Environment,
    offer_slug: str,
    nodes: int,
    name: str,
    software: str,
    ssh_key_ids: list[int] | None = None,
    volume_id: int | None = None,
    api_key: ApiKey | None = None,
    user: User | None = None,
    member_ids: list[int] | None = None,
) -> Checked:
    """Every check `create_cluster` runs, in its order, reserving and writing nothing: what
    the create would find, or the refusal it would give at this moment (clusters/web/plans.py)."""
    checked = check_create(
        project=project,
        environment=environment,
        offer_slug=offer_slug,
        nodes=nodes,
        name=name,
        software=software,
        ssh_key_ids=ssh_key_ids,
        volume_id=volume_id,
        user=user,
        member_ids=member_ids,
    )
    with transaction.atomic():  # the locks of check_locked, let go at once
        check_locked(
            environment=environment,
            api_key=api_key,
            machine_type=checked.machine_type,
            nodes=nodes,
            now=timezone.now(),
        )
    return checked


def _name_taken(name: str, environment: Environment) -> ClusterRefused:
    return ClusterRefused(
        "name_taken",
        f"A live cluster named {name!r} already exists in {environment.name}; pick another name.",
        field="name",
    )


def create_cluster(
    *,
    project: Project,
    user: User | None,
    environment: Environment,
    offer_slug: str,
    nodes: int,
    name: str,
    software: str,
    ssh_key_ids: list[int] | None = None,
    volume_id: int | None = None,
    api_key: ApiKey | None = None,
    quoted: Quoted | None = None,
    member_ids: list[int] | None = None,
    repair_policy: str = Cluster.RepairPolicy.ASK,
) -> Cluster:
    """Validate a request (SPEC §2, in this order: `check_create`, then `check_locked`), reserve
    every host, create the cluster, attach the volume `volume_id` if one is asked for. Made
    with `api_key`, the cluster is recorded as its own and must fit the key's limits
    (`require_key_limits`).

    With `quoted` (staff, from a won quote request: `Quoted`), `offer_slug` names any machine
    type, listed or not, the size may reach QUOTED_MAX_NODES, and the cluster is billed at the
    agreed price; the balance, budget, name, software and SSH key rules are the same.

    Raises ClusterRefused before anything is reserved or written.
    """
    now = timezone.now()
    require_repair_policy(repair_policy)
    checked = check_create(
        project=project,
        environment=environment,
        offer_slug=offer_slug,
        nodes=nodes,
        name=name,
        software=software,
        ssh_key_ids=ssh_key_ids,
        volume_id=volume_id,
        quoted=quoted,
        user=user,
        member_ids=member_ids,
    )
    create = _Create(
        project=project,
        environment=environment,
        user=user,
        api_key=api_key,
        quoted=quoted,
        name=name,
        nodes=nodes,
        software=software,
        checked=checked,
        repair_policy=repair_policy,
    )
    return _create_checked(create, now=now)


@dataclass(frozen=True)
class _Create:
    """A create whose checks without a lock passed (`check_create`): what it writes."""

    project: Project
    environment: Environment
    user: User | None
    api_key: ApiKey | None
    quoted: Quoted | None
    name: str
    nodes: int
    software: str
    checked: Checked
    repair_policy: str = Cluster.RepairPolicy.ASK


def require_repair_policy(policy: object) -> None:
    """A repair policy is `ask` or `auto` (docs/lifecycle.md, "Repair")."""
    if policy not in Cluster.RepairPolicy.values:
        raise ClusterRefused(
            "invalid_repair_policy",
            "The repair policy is ask (replace a lost or unhealthy machine when you say so) or "
            "auto (replace it automatically).",
            field="repair_policy",
        )


def _create_checked(create: _Create, *, now: datetime) -> Cluster:
    """Check what needs the environment's lock (`check_locked`), reserve every host, write the
    cluster, its nodes, its volume and its Created event, and hand it to the tick."""
    machine_type, volume, chosen = (
        create.checked.machine_type,
        create.checked.volume,
        create.checked.keys,
    )
    environment, name, nodes, quoted = create.environment, create.name, create.nodes, create.quoted
    try:
        with transaction.atomic():
            # The environment's row, locked until the cluster is committed: a budget change
            # (billing.budgets.set_budget) locks it too, so it either waits for this create and
            # then counts the cluster among those it stops, or is seen here and refuses it.
            check_locked(
                environment=environment,
                api_key=create.api_key,
                machine_type=machine_type,
                nodes=nodes,
                now=now,
            )
            hosts = reserve_hosts(machine_type=machine_type, count=nodes, now=now)
            cluster = Cluster.objects.create(
                project=create.project,
                environment=environment,
                created_by=create.user,
                created_by_key=create.api_key,
                name=name,
                machine_type=machine_type,
                size=nodes,
                software=create.software,
                repair_policy=create.repair_policy,
                status=Status.PROVISIONING,
                authorized_keys="\n".join(k.public_key.strip() for k in chosen) + "\n",
                key_holders=[keys.key_holder(key) for key in chosen],
                created_at=now,
                give_up_at=now + give_up_after(machine_type.slow_boot),
                quote=quoted.quote if quoted else None,
                agreed_price_per_machine_hour=quoted.price_per_machine_hour if quoted else None,
                needs_work=True,
            )
            DueCluster.objects.create(cluster=cluster)  # with needs_work: the tick advances it
            cluster.ssh_keys.set(chosen)
            if volume is not None:
                volumes.attach(volume=volume, cluster=cluster, now=now)
            new_nodes(cluster=cluster, hosts=hosts, first_index=0, is_worker=False, now=now)
            Event.objects.create(
                cluster=cluster, at=now, reason=Reason.CREATED, message=_created_message(create)
            )
            audit.note(summary=_created_words(cluster), obj=cluster)
            dispatch.current().advance(cluster.pk)
    except IntegrityError:
        # Another request took the name between the check above and this insert.
        if Cluster.objects.filter(
            environment=environment, name=name, status__in=Cluster.LIVE
        ).exists():
            raise _name_taken(name, environment) from None
        raise
    return cluster


def _created_words(cluster: Cluster) -> str:
    """The audit log's words: created cluster `devs` (4 × 8×H100, Slurm) in Columbus, Ohio."""
    machine_type = cluster.machine_type
    return (
        f"created cluster `{cluster.name}` ({cluster.size} × {machine_type.gpus_per_machine}×"
        f"{machine_type.gpu.name}, {cluster.get_software_display()}) in "
        f"{machine_type.location.name}"
    )


def _created_message(create: _Create) -> str:
    """The Created event's words: the machines reserved, the volume attached, the quoted price."""
    machine_type, volume, quoted = create.checked.machine_type, create.checked.volume, create.quoted
    nodes = create.nodes
    attached = (
        f" Volume {volume.name} attached at {connect.VOLUME_DIR} on node-0." if volume else ""
    )
    terms = (
        f" Quoted: billed at the agreed {usd(quoted.price_per_machine_hour)} per "
        f"machine-hour (quote request {quoted.quote.pk})."
        if quoted
        else ""
    )
    return (
        f"Created: {nodes} × {machine_type.gpus_per_machine} {machine_type.gpu.name} "
        f"in {machine_type.location.name}; {nodes} machines reserved.{attached}{terms}"
    )


def require_budget(*, environment: Environment, now: datetime) -> None:
    """An environment whose month-to-date spend reached its budget takes no new cluster
    (billing.budgets.is_reached). Call with the environment's row locked."""
    if environment.monthly_budget is None:
        return  # no budget: no spend to read
    spent = budgets.month_to_date_spend(environment=environment, now=now)
    if budgets.is_reached(spent=spent, budget=environment.monthly_budget):
        raise ClusterRefused(
            "budget_reached",
            f"The {environment.name} environment has spent {usd(spent)} this month, its "
            f"whole monthly budget of {usd(environment.monthly_budget)}; raise the budget "
            "to create clusters here.",
        )


def require_balance(*, project: Project, price_per_hour: Decimal, doing: str) -> None:
    """The balance must cover one hour of the whole cluster (`price_per_hour`, at the size
    `doing` makes it), and never less than the minimum (`billing.balances.balance_needed`)."""
    needed = balances.balance_needed(price_per_hour)
    balance = ledger.balance(project=project)
    if balance < needed:
        raise ClusterRefused(
            "insufficient_balance",
            balances.short_of_balance(balance=balance, needed=needed, doing=doing),
            staff_message=balances.short_of_balance(
                balance=balance, needed=needed, doing=doing, staff=True
            ),
        )


def key_spend_per_hour(api_key: ApiKey) -> Decimal:
    """USD per hour of the machines up or coming up in the live clusters `api_key` created."""
    total = Node.objects.filter(
        cluster__created_by_key=api_key,
        # Machines held for the cluster and billed as they join; a terminating one's billing
        # has ended (`Cluster.TERMINABLE`).
        cluster__status__in=Cluster.TERMINABLE,
        status__in=Node.LIVE,
    ).aggregate(total=Sum("cluster__machine_type__price_per_hour"))["total"]
    return total or Decimal("0.00")


def require_key_limits(
    *, api_key: ApiKey | None, machine_type: MachineType, machines: int, adding: int
) -> None:
    """A narrowed API key's limits: a cluster of at most `max_machines_per_cluster` machines
    (`machines`: its size once `adding` more are up), and the live clusters the key created
    costing at most `max_usd_per_hour` with `adding` more machines of `machine_type`.

    Call inside the transaction that reserves: the key's row is locked first, so two creates
    with one key cannot both pass the hourly limit. Raises ClusterRefused
    (`key_limit_exceeded`, 403) naming the limit and the figures.
    """
    if api_key is None or not api_key.has_limits:
        return
    named = f"The API key '{api_key.name}' ({api_key.prefix}…)"
    limit = api_key.max_machines_per_cluster
    if limit is not None and machines > limit:
        raise ClusterRefused(
            "key_limit_exceeded",
            f"{named} may make clusters of at most {limit} machines (max_machines_per_cluster); "
            f"the cluster would have {machines}. Nothing was reserved.",
            field="nodes",
        )
    if api_key.max_usd_per_hour is None:
        return
    ApiKey.objects.select_for_update().filter(pk=api_key.pk).values_list("pk").first()
    running = key_spend_per_hour(api_key)
    added = machine_type.price_per_hour * adding
    if running + added > api_key.max_usd_per_hour:
        raise ClusterRefused(
            "key_limit_exceeded",
            f"{named} may run at most {usd(api_key.max_usd_per_hour)} per hour of clusters "
            f"(max_usd_per_hour): the live clusters it created cost {usd(running)} per hour "
            f"and this adds {usd(added)}, {usd(running + added)} in all. Nothing was "
            "reserved.",
            field="nodes",
        )
