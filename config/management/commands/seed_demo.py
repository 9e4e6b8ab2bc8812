"""`manage.py seed_demo`: the demo inventory and user, into an empty database only, with a
first screen that is alive: a ready cluster, billed from its start by the meter, and a month
of history (two ended clusters with their usage lines, the credit that paid for them)."""

import time
from datetime import datetime, timedelta
from decimal import Decimal

from django.conf import settings
from django.core.management.base import BaseCommand
from django.db import transaction
from django.utils import timezone

from accounts.keys import add_ssh_key
from accounts.models import Environment, Project, SshKey, User
from accounts.projects import DEFAULT_ENVIRONMENT, create_project
from billing import ledger, metering
from clusters import lifecycle
from clusters.demo_history import seed_demo_history
from clusters.models import Cluster, Event, Node, give_up_after
from offers.inventory import DEMO_INVENTORY, load_inventory_file
from offers.models import GpuModel, Host, MachineType

DEMO_EMAIL = "demo@runcrate.localhost"
DEMO_PASSWORD = "demo-gpus-2026"
DEMO_PROJECT = "Demo project"
DEMO_CREDIT = "500.00"  # USD on the demo project's ledger, so it can create clusters
# A public key whose private half was thrown away: the demo's machines are simulated.
DEMO_SSH_KEY = (
    "ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIDD8+xmlj4frlpgDkwNxIiR2+9AnwmyF9NfqT8mNEme+ "
    "demo@runcrate.localhost"
)
# The ready cluster the demo user finds: 2 machines of 2× H100, simulated.
LIVE_OFFER = "cac1-h100x2-vm"
LIVE_NAME = "llama-finetune"
LIVE_MACHINES = 2
# The ended ones, in the last month: (name, offer, machines, days ago it started, hours run).
ENDED = (
    ("bert-sweep", "euc1-a100x2-vm", 2, 12, 5),
    ("eval-h100", "cac1-h100x2-vm", 2, 1, 3),
)
# The simulated machines of the ready cluster boot in their boot time divided by this while
# the command drives them (the worker is not running yet): a 600 s boot takes a second.
SEED_SIM_SPEED = 600
READY_WITHIN_SECONDS = 60


class Command(BaseCommand):
    help = (
        "Into an empty database only (no GPU models, no users), and only with DEBUG on: load the "
        f"demo inventory ({DEMO_INVENTORY.name}) and create the demo user, with a ready cluster "
        "and some history. Anything else is left alone."
    )

    def handle(self, *args, **options):
        if not settings.DEBUG:
            # Its password is in the README: never an account on a deployment.
            self.stdout.write(
                "DEBUG is off: seed_demo made no demo account and loaded nothing (its password "
                "is published). Load your inventory with manage.py load_inventory FILE."
            )
            return
        if GpuModel.objects.exists() or User.objects.exists():
            self.stdout.write("The database already has data: seed_demo left it alone.")
            return
        now = timezone.now()
        with transaction.atomic():
            report = load_inventory_file(DEMO_INVENTORY)
            user = User.objects.create_user(DEMO_EMAIL, DEMO_PASSWORD, name="Demo user")
            project = create_project(owner=user, name=DEMO_PROJECT)
            ledger.credit(project=project, amount=DEMO_CREDIT, note="Demo credit")
            key = add_ssh_key(
                project=project, user=user, name="demo laptop", public_key=DEMO_SSH_KEY
            )
            history = seed_demo_history()
            ended = [_ended_cluster(project, user, key, *row, now=now) for row in ENDED]
        # The ended clusters' usage, charged onto the ledger as the meter does.
        metering.charge_accrued(now=timezone.now())
        live = _ready_cluster(project, user, key)
        self.stdout.write(str(report))
        self.stdout.write(
            f"A made-up month of {history} ended clusters (project 'Demo history', no members) "
            "gives the offers their track record."
        )
        self.stdout.write(
            f"The demo user has {len(ended)} ended clusters this month and {live.name}, "
            f"{live.get_status_display().lower()}, billed by the meter. Its node-1 has a GPU "
            "that fails 10 minutes after it joined: watch it marked unhealthy, then replaced "
            "by the cluster's repair policy (auto) 5 minutes later."
        )
        self.stdout.write(f"Demo login: {DEMO_EMAIL} / {DEMO_PASSWORD}")
        self.stdout.write("A staff account for /admin/: manage.py createsuperuser")


def _ended_cluster(
    project: Project,
    user: User,
    key: SshKey,
    name: str,
    offer: str,
    machines: int,
    days_ago: int,
    hours: int,
    *,
    now: datetime,
) -> Cluster:
    """A cluster that ran `hours` from `days_ago` days ago, with the events the lifecycle
    writes, billed through billing's own functions from when it joined to its end."""
    machine_type = MachineType.objects.get(slug=offer)
    created = (now - timedelta(days=days_ago)).replace(microsecond=0)
    joined = created + timedelta(seconds=machine_type.boot_seconds + 120)
    ready = joined + timedelta(seconds=30)
    ended = joined + timedelta(hours=hours)
    cluster = Cluster.objects.create(
        project=project,
        environment=Environment.objects.get(project=project, name=DEFAULT_ENVIRONMENT),
        created_by=user,
        name=name,
        machine_type=machine_type,
        size=machines,
        status=Cluster.Status.TERMINATED,
        authorized_keys=key.public_key,
        created_at=created,
        joined_at=joined,
        ready_at=ready,
        ended_at=ended,
        give_up_at=created + give_up_after(machine_type.slow_boot),
    )
    nodes = Node.objects.bulk_create(
        _ended_nodes(cluster, created=created, joined=joined, ended=ended)
    )
    Event.objects.bulk_create(_ended_events(cluster, created=created, ready=ready, ended=ended))
    metering.open_machines(
        project_id=project.pk,
        cluster_id=cluster.pk,
        node_ids=[node.pk for node in nodes],
        price_per_hour=Decimal(machine_type.price_per_hour),
        at=joined,
    )
    metering.close_cluster(cluster_id=cluster.pk, at=ended)
    return cluster


def _ended_nodes(
    cluster: Cluster, *, created: datetime, joined: datetime, ended: datetime
) -> list[Node]:
    """An ended cluster's machines, each through every step by the time it joined."""
    return [
        Node(
            cluster=cluster,
            index=index,
            status=Node.Status.ENDED,
            step=Node.Step.DONE,
            step_started_at=joined,
            reserved_at=created,
            running_at=joined - timedelta(seconds=60),
            agent_at=joined - timedelta(seconds=40),
            network_at=joined,
            ended_at=ended,
        )
        for index in range(cluster.size)
    ]


def _ended_events(
    cluster: Cluster, *, created: datetime, ready: datetime, ended: datetime
) -> list[Event]:
    """The events the lifecycle writes for a cluster created, ready, then terminated."""
    return [
        Event(cluster=cluster, at=created, reason=Event.Reason.CREATED, message="Created."),
        Event(cluster=cluster, at=ready, reason=Event.Reason.READY, message="Ready."),
        Event(
            cluster=cluster,
            at=ended,
            reason=Event.Reason.TERMINATE_REQUESTED,
            message="Terminate requested.",
        ),
        Event(cluster=cluster, at=ended, reason=Event.Reason.TERMINATED, message="Ended."),
    ]


def _ready_cluster(project: Project, user: User, key: SshKey) -> Cluster:
    """The demo user's cluster, created and driven to ready by the lifecycle itself (the
    simulated machines, sped up while no worker runs), so it is billed from its start."""
    cluster = lifecycle.create_cluster(
        project=project,
        user=user,
        environment=Environment.objects.get(project=project, name=DEFAULT_ENVIRONMENT),
        offer_slug=LIVE_OFFER,
        nodes=LIVE_MACHINES,
        name=LIVE_NAME,
        software=Cluster.Software.NONE,
        ssh_key_ids=[key.pk],
        repair_policy=Cluster.RepairPolicy.AUTO,
    )
    # The demo's sick node (docs/lifecycle.md, "Repair"): node-1's GPU 0 fails 10 minutes after
    # the cluster joined (the simulated data center's `gpu` fault); the repair policy replaces
    # it, from a sound host, once it stayed unhealthy for the grace period.
    Host.objects.filter(nodes__cluster=cluster, nodes__index=1).update(fault=Host.Fault.GPU)
    speed = settings.RUNCRATE_SIM_SPEED
    settings.RUNCRATE_SIM_SPEED = max(speed, SEED_SIM_SPEED)
    deadline = time.monotonic() + READY_WITHIN_SECONDS
    try:
        work = lifecycle.CollectingDispatcher()
        with lifecycle.dispatching_to(work):
            while time.monotonic() < deadline:
                work.run()
                lifecycle.advance(cluster_id=cluster.pk)
                work.run()
                cluster.refresh_from_db()
                if cluster.status != Cluster.Status.PROVISIONING:
                    break
                time.sleep(0.05)
    finally:
        settings.RUNCRATE_SIM_SPEED = speed
    # Not ready in time (a slow machine): the worker that `make run` starts carries on.
    return cluster
