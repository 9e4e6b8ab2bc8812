import re
from datetime import datetime, timedelta
from decimal import Decimal
from typing import TYPE_CHECKING, ClassVar

from django.conf import settings
from django.core.validators import MaxValueValidator, MinValueValidator
from django.db import models
from django.db.models import Q
from django.utils import timezone

if TYPE_CHECKING:
    from offers.models import Host

# A cluster's name is a DNS label: lowercase letters, digits and hyphens, 1-63 characters,
# starting and ending with a letter or digit. `\Z`, not `$`: `$` also matches before a
# trailing newline, so "web\n" was a name; with `\Z` both match() and fullmatch() are whole.
NAME_RE = re.compile(r"[a-z0-9](?:[a-z0-9-]{0,61}[a-z0-9])?\Z")
PRIVATE_NETWORK = "10.77.0.0/24"
# node-i is 10.77.0.{i+1}, so the /24 holds 254 machines: the largest a (quoted) cluster gets.
QUOTED_MAX_NODES = 254


def private_ip(index: int) -> str:
    return f"10.77.0.{index + 1}"


class IllegalTransition(RuntimeError):
    """A status change the lifecycle never makes: a bug, not a user's mistake."""


class Cluster(models.Model):
    class Status(models.TextChoices):
        PROVISIONING = "provisioning"
        INSTALLING = "installing"
        READY = "ready"
        DEGRADED = "degraded"
        FAILED = "failed"
        TERMINATING = "terminating"
        TERMINATED = "terminated"
        STOPPED = "stopped"

    # Statuses the reconciler still works on, and the ones nothing changes any more.
    LIVE = {
        Status.PROVISIONING,
        Status.INSTALLING,
        Status.READY,
        Status.DEGRADED,
        Status.TERMINATING,
    }
    TERMINAL = {Status.FAILED, Status.TERMINATED, Status.STOPPED}
    # Statuses in which machines are up and billed.
    BILLED = {Status.INSTALLING, Status.READY, Status.DEGRADED}
    # What a user may terminate, what a stop for balance or budget ends
    # (clusters/lifecycle/stops.py) and
    # what an API key's hourly limit counts: everything live but what is already terminating
    # (whose billing has ended). A provisioning cluster would start billing the moment it joins.
    TERMINABLE = LIVE - {Status.TERMINATING}
    # Running: the software is settled and the machines that joined are up (ready, or degraded
    # with what is wrong said). The one spelling of it: clusters/policy.py is what others ask.
    RUNNING = frozenset({Status.READY, Status.DEGRADED})
    # Statuses in which the network test may run: the running ones (a degraded cluster's too:
    # the test helps tell why).
    NETWORK_TESTABLE = RUNNING

    # Every legal move; anything else is a bug and raises (`move_to`).
    TRANSITIONS: ClassVar[dict[str, set[Status]]] = {
        Status.PROVISIONING: {Status.INSTALLING, Status.READY, Status.FAILED, Status.TERMINATING},
        Status.INSTALLING: {Status.READY, Status.DEGRADED, Status.TERMINATING},
        Status.READY: {Status.DEGRADED, Status.TERMINATING},  # degraded: a machine was lost
        # ready: a degraded cluster whose only trouble was an unhealthy machine that recovered.
        Status.DEGRADED: {Status.INSTALLING, Status.READY, Status.TERMINATING},
        Status.TERMINATING: {Status.TERMINATED, Status.STOPPED},
    }

    class Software(models.TextChoices):
        NONE = "none", "None"
        SLURM = "slurm", "Slurm"
        KUBERNETES = "kubernetes", "Kubernetes"
        RAY = "ray", "Ray"

    class RepairPolicy(models.TextChoices):
        # docs/lifecycle.md, "Repair": who decides to replace a lost or unhealthy worker.
        ASK = "ask", "Ask me"
        AUTO = "auto", "Replace automatically"

    class StopReason(models.TextChoices):
        BALANCE = "balance", "the balance ran out"
        BUDGET = "budget", "the environment reached its monthly budget"

    project = models.ForeignKey(
        "accounts.Project", on_delete=models.CASCADE, related_name="clusters"
    )
    environment = models.ForeignKey(
        "accounts.Environment", on_delete=models.PROTECT, related_name="clusters"
    )
    created_by = models.ForeignKey(
        settings.AUTH_USER_MODEL, null=True, on_delete=models.SET_NULL, related_name="+"
    )
    created_by_key = models.ForeignKey(
        "accounts.ApiKey",
        null=True,
        blank=True,
        on_delete=models.SET_NULL,
        related_name="clusters",
        help_text="The API key that created it (its hourly limit counts this cluster); null "
        "from the dashboard.",
    )
    name = models.CharField(max_length=63)
    machine_type = models.ForeignKey(
        "offers.MachineType", on_delete=models.PROTECT, related_name="clusters"
    )
    size = models.PositiveSmallIntegerField(help_text="Machines asked for at creation.")
    software = models.CharField(max_length=12, choices=Software.choices, default=Software.NONE)
    status = models.CharField(
        max_length=14, choices=Status.choices, default=Status.PROVISIONING, db_index=True
    )
    repair_policy = models.CharField(
        max_length=4,
        choices=RepairPolicy.choices,
        default=RepairPolicy.ASK,
        help_text="Whether a lost or unhealthy worker is replaced only when a user asks, or "
        "automatically (clusters/lifecycle/repair.py).",
    )
    authorized_keys = models.TextField(
        help_text="The SSH public keys installed on every node, fixed at creation."
    )
    ssh_keys = models.ManyToManyField("accounts.SshKey", blank=True, related_name="clusters")
    key_holders = models.JSONField(
        default=list,
        blank=True,
        help_text="Each key installed at creation, as it was then: name, fingerprint and the "
        "email of the member who added it (empty for a shared key). It stays true after the key "
        "is removed from the project, as the key stays on the machines until the cluster ends.",
    )

    created_at = models.DateTimeField(default=timezone.now)
    joined_at = models.DateTimeField(
        null=True, blank=True, help_text="Every machine joined; billing starts here for all."
    )
    ready_at = models.DateTimeField(null=True, blank=True)
    ended_at = models.DateTimeField(null=True, blank=True)
    give_up_at = models.DateTimeField(
        help_text="Nothing waits past this: 25 minutes from creation, 45 on slow-boot types."
    )

    failure_reason = models.CharField(max_length=32, blank=True, default="")
    failure_node = models.CharField(max_length=16, blank=True, default="")
    failure_step = models.CharField(max_length=16, blank=True, default="")
    failure_message = models.TextField(blank=True, default="")
    stop_reason = models.CharField(max_length=8, choices=StopReason.choices, blank=True, default="")
    install_attempts = models.PositiveSmallIntegerField(default=0)
    acceptance = models.JSONField(
        default=dict,
        blank=True,
        help_text="The acceptance report, kept when every machine joined and before billing: per "
        "node the GPUs seen, its reachability row, latency and bandwidth to node-0.",
    )
    network_test = models.JSONField(
        default=dict,
        blank=True,
        help_text="The last network test a user asked for: state (running, done, failed), when "
        "it started and finished, its method (nccl or agent) and results (docs/lifecycle.md).",
    )
    health_problems = models.JSONField(
        default=dict,
        blank=True,
        help_text="What its machines' health reports show wrong now, each announced once with a "
        "node_unhealthy event: key -> {node, message} (clusters/telemetry/health.py).",
    )
    idle_since = models.DateTimeField(
        null=True,
        blank=True,
        help_text="Since when every GPU of the ready cluster has stayed below "
        "RUNCRATE_IDLE_GPU_PERCENT, once that lasted RUNCRATE_IDLE_GPU_MINUTES (one gpus_idle "
        "event per idle period); None while the GPUs work (clusters/telemetry/idle.py). Nothing "
        "is stopped.",
    )
    # A quoted cluster (SPEC §7, docs/clusters.md): created by staff from a won quote request,
    # on any machine type and past the self-serve size limit, billed at the agreed price.
    quote = models.ForeignKey(
        "offers.QuoteRequest",
        null=True,
        blank=True,
        on_delete=models.PROTECT,
        related_name="clusters",
        help_text="The won quote request staff created it from; null for a self-serve cluster.",
    )
    agreed_price_per_machine_hour = models.DecimalField(
        max_digits=10,
        decimal_places=2,
        null=True,
        blank=True,
        validators=[MinValueValidator(Decimal("0.01"))],
        help_text="A quoted cluster's agreed USD per machine-hour, billed instead of the machine "
        "type's price; null for a self-serve cluster.",
    )
    version = models.PositiveBigIntegerField(
        default=0,
        help_text="Goes up by one whenever what the cluster page shows changes (its status, a "
        "node row, a new event): the page's poll sends the version it shows, and an unchanged "
        "cluster is answered from this column alone.",
    )
    needs_work = models.BooleanField(
        default=False,
        help_text="Whether the tick advances it: still moving, or a node still holds a host to "
        "release (`clusters.lifecycle.needs_work`). Kept by every write of the reconciler, with "
        "a DueCluster row exactly while it is set.",
    )

    class Meta:
        ordering = ["-created_at", "-pk"]
        constraints = [
            models.CheckConstraint(
                condition=Q(quote__isnull=True, agreed_price_per_machine_hour__isnull=True)
                | Q(quote__isnull=False, agreed_price_per_machine_hour__gt=0),
                name="cluster_quoted_has_agreed_price",
            ),
            models.UniqueConstraint(
                fields=["environment", "name"],
                condition=Q(
                    status__in=["provisioning", "installing", "ready", "degraded", "terminating"]
                ),
                name="cluster_live_name_unique",
            ),
        ]

    def __str__(self) -> str:
        return self.name

    @property
    def is_live(self) -> bool:
        return self.status in self.LIVE

    @property
    def is_final(self) -> bool:
        return self.status in self.TERMINAL

    def bump_version(self) -> int:
        """Mark that what the cluster page shows changed (a status, a node row, an event), so its
        poll answers with it (docs/clusters.md, "The poll"); returns the new version, which the
        writer also stamps on the node rows and events it writes. The writer holds the row lock
        (`lock_cluster`) and saves `version` with its own write of the row, so the increment is
        exact and costs no query of its own."""
        self.version += 1
        return self.version

    @property
    def is_quoted(self) -> bool:
        return self.quote_id is not None

    def runs_simulated(self) -> bool:
        """Whether its machines are the simulated data center's (hosts with the `simulated`
        driver): nothing answers on their addresses, so no one can log in (docs/clusters.md,
        "Demo machines"). Read from the nodes' hosts when they came with the nodes (the API's
        connect details), else in one query."""
        nodes = list(self.nodes.all())
        if nodes and all(Node.host.is_cached(node) for node in nodes):
            return any(node.host is not None and node.host.driver == "simulated" for node in nodes)
        return self.nodes.filter(host__driver="simulated").exists()

    @property
    def can_terminate(self) -> bool:
        return self.status in self.TERMINABLE

    @property
    def is_running(self) -> bool:
        """Ready or degraded (`RUNNING`, asked through clusters/policy.py elsewhere)."""
        return self.status in self.RUNNING

    @classmethod
    def terminate_refusal(cls, status: str) -> str:
        """Why a cluster in `status` ("gone" for one deleted) cannot be terminated, naming the
        statuses that can, in the order of `Status`."""
        names = [s.value for s in cls.Status if s in cls.TERMINABLE]
        allowed = ", ".join(names[:-1]) + f" or {names[-1]}"
        return f"This cluster is {status}; only a {allowed} cluster can be terminated."

    @property
    def can_set_repair_policy(self) -> bool:
        """Who replaces a lost or unhealthy worker can change until the cluster ends (or
        terminates): clusters/lifecycle/repair.py `set_repair_policy`, the Machines tab."""
        return self.status in self.TERMINABLE

    @property
    def can_add_workers(self) -> bool:
        """Ready, and not quoted: a quoted cluster's size is part of the agreed terms."""
        return self.status == self.Status.READY and not self.is_quoted

    @property
    def can_retry_install(self) -> bool:
        """Degraded because its software did not install (not a lost or unhealthy machine,
        which installing again would not mend)."""
        return self.status == self.Status.DEGRADED and self.failure_reason in (
            "install_failed",
            "install_timeout",
        )

    @property
    def price_per_machine_hour(self) -> Decimal:
        """What one machine of this cluster costs per hour: the agreed price of a quoted
        cluster, else its machine type's. Billing, pages, the API and emails all read this."""
        if self.agreed_price_per_machine_hour is not None:
            return self.agreed_price_per_machine_hour
        return self.machine_type.price_per_hour

    @staticmethod
    def machines_up_in(nodes) -> int:
        """How many of `nodes` (a cluster's, read or prefetched) are up: starting or joined."""
        return sum(1 for node in nodes if node.status in Node.LIVE)

    def machines_priced(self, up: int, *, billed: int = 0) -> int:
        """The machines its price and every count of its machines say, given `up` of its
        machines up (`machines_up_in`, or the list's count) and `billed`, billing's count of the
        machines billed to its end (`ClusterCost.machines_now`): those up while it is live and
        any are (a worker added counts at once); once its machines are gone (terminating, or
        ended), those it was billed for to the end; else the size it was created with (what it
        will run, or a cluster never billed asked for)."""
        if self.is_live and up:
            return up
        return billed or self.size

    def price_per_hour(self, machines: int) -> Decimal:
        """What `machines` of this cluster cost per hour (its pages and the API show it for
        `machines_priced`)."""
        return self.price_per_machine_hour * machines

    def problems_of(self, node_name: str) -> list[str]:
        """What its open health problems say of one machine (`health_problems`, written by
        clusters/telemetry/health.py): the node row's badge, the API's `health`."""
        return [
            problem["message"]
            for problem in (self.health_problems or {}).values()
            if problem.get("node") == node_name
        ]

    def clear_failure(self) -> None:
        """The failure no longer explains the cluster (a retry, its end by its owner)."""
        self.failure_reason = self.failure_node = self.failure_step = ""
        self.failure_message = ""

    def move_to(self, status: "Cluster.Status") -> None:
        if status not in self.TRANSITIONS.get(self.status, set()):
            raise IllegalTransition(f"cluster {self.pk}: {self.status} -> {status} is not allowed")
        self.status = status

    def network_test_running(self, now: datetime | None = None) -> bool:
        """Whether the last network test is still running: asked for, no result yet, and not
        past the time it is given (a worker that died leaves it to expire)."""
        test = self.network_test or {}
        expires = test.get("expires_at")
        if test.get("state") != "running" or not expires:
            return False
        return datetime.fromisoformat(expires) > (now or timezone.now())

    def network_test_refusal(self, nodes, now: datetime | None = None) -> tuple[str, str] | None:
        """Why a network test cannot start now, as (code, sentence), or None when it can.
        `nodes` are the cluster's nodes (prefetched on the page, read under the lock by the
        lifecycle), so the page's button and the action follow the same rule."""
        if self.status not in self.NETWORK_TESTABLE:
            return (
                "invalid_state",
                f"This cluster is {self.status}; the network test runs on a ready or degraded "
                "cluster.",
            )
        joined = [n for n in nodes if n.status == Node.Status.JOINED]
        if len(joined) < 2 or not any(n.index == 0 for n in joined):
            return (
                "invalid_state",
                "The network test needs node-0 and at least one other machine up; this cluster "
                f"has {len(joined)} machine{'s' if len(joined) != 1 else ''} up"
                f"{'' if any(n.index == 0 for n in joined) else ', without node-0'}.",
            )
        if self.network_test_running(now):
            return (
                "network_test_running",
                "A network test is already running on this cluster; its result shows here when "
                "it is done.",
            )
        return None


class DueCluster(models.Model):
    """A cluster the tick advances: one row for each cluster whose `needs_work` is set, written
    and deleted with it (`clusters.lifecycle.rules.set_needs_work`). The tick reads this table,
    which holds only the clusters still moving, so its query and its plan are the same however
    many clusters are ready or ended (a partial index on the clusters table would not do:
    PostgreSQL scans a small table whole and a large one by the index, two plans)."""

    cluster = models.OneToOneField(
        Cluster, primary_key=True, on_delete=models.CASCADE, related_name="+"
    )

    def __str__(self) -> str:
        return f"cluster {self.cluster_id} is due"


class Node(models.Model):
    class Step(models.TextChoices):
        RUNNING = "running", "Machine running"
        AGENT = "agent", "Agent checked in"
        NETWORK = "network", "Private network"
        INSTALL = "install", "Software"
        DONE = "done", "Ready"

    class Status(models.TextChoices):
        STARTING = "starting"  # passing its steps
        JOINED = "joined"  # passed network; billed while the cluster runs
        FAILED = "failed"
        ENDED = "ended"  # released after terminate/stop, or with its failed cluster
        LOST = "lost"  # its agent fell silent (or its machine vanished) after it joined

    # The steps that gate joining, in order.
    JOIN_STEPS = (Step.RUNNING, Step.AGENT, Step.NETWORK)
    # Every legal move of a node's status and of its step; anything else raises (`move_to`).
    TRANSITIONS: ClassVar[dict[str, set[Status]]] = {
        Status.STARTING: {Status.JOINED, Status.FAILED, Status.ENDED},
        Status.JOINED: {Status.FAILED, Status.ENDED, Status.LOST},
    }
    STEP_TRANSITIONS: ClassVar[dict[str, set[Step]]] = {
        Step.RUNNING: {Step.AGENT},
        Step.AGENT: {Step.NETWORK},
        Step.NETWORK: {Step.INSTALL, Step.DONE},
        Step.INSTALL: {Step.INSTALL, Step.DONE},  # install again: a retry
        Step.DONE: {Step.INSTALL},  # retry install on a degraded cluster
    }
    # Statuses in which a node still serves its cluster, and those whose host is wiped and
    # released (while `holds_host`).
    LIVE = {Status.STARTING, Status.JOINED}
    RELEASED = {Status.FAILED, Status.ENDED, Status.LOST}

    cluster = models.ForeignKey(Cluster, on_delete=models.CASCADE, related_name="nodes")
    index = models.PositiveSmallIntegerField()
    host = models.ForeignKey(
        "offers.Host", null=True, blank=True, on_delete=models.PROTECT, related_name="nodes"
    )
    holds_host = models.BooleanField(
        default=False, help_text="True while the host is reserved for, or used by, this node."
    )
    is_worker = models.BooleanField(default=False, help_text="Added to a ready cluster.")
    replaces = models.OneToOneField(
        "self",
        null=True,
        blank=True,
        on_delete=models.SET_NULL,
        related_name="replaced_by",
        help_text="The lost or unhealthy node this one replaces, under the same name and private "
        "address (clusters/lifecycle/repair.py).",
    )
    drained = models.CharField(
        max_length=300,
        blank=True,
        default="",
        help_text="Why the product took this node out of its software's scheduling (Slurm's "
        "drain, Kubernetes' cordon, Ray's raylet stopped); empty while it schedules work.",
    )
    drained_at = models.DateTimeField(null=True, blank=True)
    quarantine = models.TextField(
        blank=True,
        default="",
        help_text="Why its host is taken offline for staff once released, instead of offered "
        "again: it was lost, or replaced as unhealthy.",
    )
    status = models.CharField(max_length=10, choices=Status.choices, default=Status.STARTING)
    step = models.CharField(max_length=10, choices=Step.choices, default=Step.RUNNING)
    step_started_at = models.DateTimeField(default=timezone.now)
    step_deadline = models.DateTimeField(null=True, blank=True)

    reserved_at = models.DateTimeField(default=timezone.now)
    running_at = models.DateTimeField(null=True, blank=True)
    agent_at = models.DateTimeField(null=True, blank=True)
    network_at = models.DateTimeField(null=True, blank=True)
    network_reported_at = models.DateTimeField(
        null=True, blank=True, help_text="When the agent last reported its reachability."
    )
    installed_at = models.DateTimeField(null=True, blank=True)
    ended_at = models.DateTimeField(null=True, blank=True)

    public_address = models.CharField(
        max_length=255,
        blank=True,
        default="",
        help_text="Where users reach the machine over SSH, as its driver reported it once it ran; "
        "empty behind the location's SSH gateway.",
    )

    public_port = models.PositiveIntegerField(
        default=22, help_text="The SSH port at public_address, as its driver reported it."
    )
    host_key = models.TextField(
        blank=True,
        default="",
        help_text="The machine's pinned SSH host key, for users' known_hosts (from its driver).",
    )
    heartbeat_at = models.DateTimeField(
        null=True, blank=True, help_text="When its agent last checked in (its heartbeat)."
    )
    wireguard_key = models.CharField(
        max_length=64,
        blank=True,
        default="",
        help_text="The WireGuard public key its agent reported; the private key never leaves it.",
    )
    acceptance = models.JSONField(
        default=dict,
        blank=True,
        help_text="What its agent measured to node-0 inside `network`: latency, bandwidth.",
    )
    agent_token_hash = models.CharField(max_length=64, blank=True, default="")
    gpus = models.JSONField(default=list, blank=True, help_text="What the agent reported.")
    gpu_health = models.JSONField(
        default=dict,
        blank=True,
        help_text="The GPU conditions its latest metrics reports show (uncorrectable ECC errors, "
        "pages pending retirement, a hardware or thermal slowdown, a GPU missing): key -> {gpu, "
        "what, since}; judged as health problems by clusters/telemetry/health.py.",
    )
    reachability = models.JSONField(
        default=dict, blank=True, help_text="Peer name -> reached, as the agent reported."
    )
    driver_state = models.JSONField(default=dict, blank=True)
    health = models.JSONField(
        default=dict,
        blank=True,
        help_text="Its agent's last health report on a ready or degraded cluster: the peers it "
        "reaches, which services run, whether /shared answers.",
    )
    health_at = models.DateTimeField(
        null=True, blank=True, help_text="When its agent last sent a health report."
    )
    metrics_paced_until = models.DateTimeField(
        null=True,
        blank=True,
        help_text="The pace of its agent's metrics reports (clusters/telemetry/metrics.py "
        "`take_report`): a report is taken while this is at most a burst ahead of now, and moves "
        "it on by one interval.",
    )

    version = models.PositiveBigIntegerField(
        default=0,
        help_text="The cluster's version when this row last changed, or when it was added: a "
        "poll from a page showing an older version gets this row again.",
    )

    # A per-node task's claim on slow work (DESIGN.md: leases).
    lease_token = models.CharField(max_length=32, blank=True, default="")
    lease_expires_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        ordering = ["cluster", "index", "pk"]
        constraints = [
            # A replacement takes the name (the index) of the node it replaces, which has left:
            # one live node per index.
            models.UniqueConstraint(
                fields=["cluster", "index"],
                condition=Q(status__in=["starting", "joined"]),
                name="node_unique_live_index",
            ),
            models.UniqueConstraint(
                fields=["host"], condition=Q(holds_host=True), name="host_held_by_one_node"
            ),
        ]
        indexes = [
            # The heartbeat watch reads only joined nodes whose heartbeat is old.
            models.Index(
                fields=["heartbeat_at"], condition=Q(status="joined"), name="node_joined_heartbeat"
            )
        ]

    def __str__(self) -> str:
        return self.name

    @property
    def name(self) -> str:
        return f"node-{self.index}"

    @property
    def reserved_host(self) -> "Host":
        """Its host, for the work on a node (reserved with one: drivers, steps, the agent);
        a node without one there is a bug."""
        assert self.host is not None, f"node {self.pk} ({self.name}) has no host"
        return self.host

    @property
    def private_ip(self) -> str:
        return private_ip(self.index)

    def move_to(self, *, status: "Node.Status | None" = None, step: "Node.Step | None" = None):
        """Change status and/or step along `TRANSITIONS`; an illegal move is a bug and raises."""
        if status is not None and status != self.status:
            if status not in self.TRANSITIONS.get(self.status, set()):
                raise IllegalTransition(
                    f"node {self.pk} ({self.name}): {self.status} -> {status} is not allowed"
                )
            self.status = status
        if step is not None:
            if step not in self.STEP_TRANSITIONS.get(self.step, set()):
                raise IllegalTransition(
                    f"node {self.pk} ({self.name}): step {self.step} -> {step} is not allowed"
                )
            self.step = step

    def lease_is_held(self, now: datetime | None = None) -> bool:
        return bool(self.lease_token) and (self.lease_expires_at or timezone.now()) > (
            now or timezone.now()
        )


# Each step's one name, wherever a page, an email or the API's text names it (the stepper, a
# failure, the machine rows, the events): "Failed at boot", the step "Boot".
STEP_NAMES: dict[str, str] = {
    Node.Step.RUNNING: "Boot",
    Node.Step.AGENT: "Agent check-in",
    Node.Step.NETWORK: "Private network",
    Node.Step.INSTALL: "Software install",
    Node.Step.DONE: "Ready",
}


class Event(models.Model):
    class Reason(models.TextChoices):
        # progress
        CREATED = "created"
        MACHINE_RUNNING = "machine_running"
        AGENT_CHECKED_IN = "agent_checked_in"
        NETWORK_OK = "network_ok"
        JOINED = "joined"
        INSTALLING = "installing"
        INSTALLED = "installed"
        READY = "ready"
        RETRY_INSTALL = "retry_install"
        WORKERS_ADDED = "workers_added"
        WORKER_JOINED = "worker_joined"
        TERMINATE_REQUESTED = "terminate_requested"
        TERMINATED = "terminated"
        HOST_RELEASED = "host_released"
        NETWORK_TEST_STARTED = "network_test_started"
        NETWORK_TEST_DONE = "network_test_done"
        NETWORK_TEST_FAILED = "network_test_failed"
        VOLUME_SYNC_FAILED = "volume_sync_failed"
        # failures (DESIGN.md's fixed list)
        BOOT_TIMEOUT = "boot_timeout"
        MACHINE_FAILED = "machine_failed"
        MACHINE_GONE = "machine_gone"
        AGENT_TIMEOUT = "agent_timeout"
        NETWORK_TIMEOUT = "network_timeout"
        NETWORK_UNREACHABLE = "network_unreachable"
        HARDWARE_MISMATCH = "hardware_mismatch"
        INSTALL_FAILED = "install_failed"
        INSTALL_TIMEOUT = "install_timeout"
        CLUSTER_TIMEOUT = "cluster_timeout"
        WORKER_FAILED = "worker_failed"
        RELEASE_FAILED = "release_failed"
        HOST_KEY_MISMATCH = "host_key_mismatch"
        MACHINE_LOST = "machine_lost"
        ACCEPTANCE_FAILED = "acceptance_failed"
        NODE_UNHEALTHY = "node_unhealthy"  # a ready machine's health report shows a problem
        # a problem a node_unhealthy event named is gone
        NODE_HEALTHY = "node_healthy"
        # every GPU of a ready cluster below RUNCRATE_IDLE_GPU_PERCENT for
        # RUNCRATE_IDLE_GPU_MINUTES (a notice: nothing is stopped), and the end of it
        GPUS_IDLE = "gpus_idle"
        GPUS_BUSY = "gpus_busy"
        # repair (docs/lifecycle.md, "Repair"): a worker out of its software's scheduling and
        # back in; a replacement asked for (by a user, or by the cluster's `auto` policy), done,
        # or failed (released alone)
        NODE_DRAINED = "node_drained"
        NODE_UNDRAINED = "node_undrained"
        REPLACE_REQUESTED = "replace_requested"
        NODE_REPLACED = "node_replaced"
        REPLACEMENT_FAILED = "replacement_failed"
        REPAIR_POLICY = "repair_policy"
        # stops (billing)
        STOPPED_BALANCE = "stopped_balance"
        STOPPED_BUDGET = "stopped_budget"

    FAILURES = {
        Reason.BOOT_TIMEOUT,
        Reason.MACHINE_FAILED,
        Reason.MACHINE_GONE,
        Reason.AGENT_TIMEOUT,
        Reason.NETWORK_TIMEOUT,
        Reason.NETWORK_UNREACHABLE,
        Reason.HARDWARE_MISMATCH,
        Reason.INSTALL_FAILED,
        Reason.INSTALL_TIMEOUT,
        Reason.CLUSTER_TIMEOUT,
        Reason.WORKER_FAILED,
        Reason.RELEASE_FAILED,
        Reason.HOST_KEY_MISMATCH,
        Reason.MACHINE_LOST,
        Reason.ACCEPTANCE_FAILED,
        Reason.NODE_UNHEALTHY,
    }

    # Failures that leave the cluster running and billed (status degraded).
    DEGRADING = {
        Reason.INSTALL_FAILED,
        Reason.INSTALL_TIMEOUT,
        Reason.MACHINE_LOST,
        Reason.NODE_UNHEALTHY,
    }
    # Failures for staff, not for the cluster's owner.
    STAFF_ONLY = {Reason.RELEASE_FAILED}

    cluster = models.ForeignKey(Cluster, on_delete=models.CASCADE, related_name="events")
    node = models.ForeignKey(
        Node, null=True, blank=True, on_delete=models.CASCADE, related_name="events"
    )
    at = models.DateTimeField(default=timezone.now)
    step = models.CharField(max_length=10, blank=True, default="")
    reason = models.CharField(max_length=24, choices=Reason.choices)
    message = models.TextField()
    output = models.TextField(blank=True, default="", help_text="Raw output of a failing check.")
    # The outbox: emails are sent from events and this marks the ones already sent.
    emailed_at = models.DateTimeField(null=True, blank=True)
    version = models.PositiveBigIntegerField(
        default=0,
        help_text="The cluster's version that this event came with: a poll from a page showing an "
        "older version gets it.",
    )

    class Meta:
        ordering = ["at", "pk"]
        indexes = [models.Index(fields=["cluster", "at"], name="event_cluster_at")]

    def __str__(self) -> str:
        return f"{self.reason}: {self.message}"

    @property
    def step_name(self) -> str:
        """The step's one name (`STEP_NAMES`), or "" for an event of no step."""
        return STEP_NAMES.get(self.step, self.step) if self.step else ""

    @property
    def is_failure(self) -> bool:
        return self.reason in self.FAILURES

    @property
    def notification(self) -> str | None:
        """Which email this event asks for: "ready", "failed", "degraded", "lost", "unhealthy",
        "replaced" (a replacement joined: what it costs, and whether the cluster is ready again),
        "replacement_failed",
        "volume" (a volume that could not be synced back), "idle" (its GPUs idle: a notice,
        once per idle period), or None."""
        if self.reason == self.Reason.READY:
            return "ready"
        if self.reason == self.Reason.GPUS_IDLE:
            return "idle"
        if self.reason == self.Reason.VOLUME_SYNC_FAILED:
            return "volume"
        if self.reason == self.Reason.MACHINE_LOST:
            return "lost"
        if self.reason == self.Reason.NODE_UNHEALTHY:
            return "unhealthy"
        if self.reason == self.Reason.NODE_REPLACED:
            return "replaced"
        if self.reason == self.Reason.REPLACEMENT_FAILED:
            return "replacement_failed"
        if self.reason in self.DEGRADING:
            return "degraded"
        if self.reason in self.FAILURES - self.DEGRADING - self.STAFF_ONLY:
            return "failed" if self.reason != self.Reason.WORKER_FAILED else None
        return None


def give_up_after(slow_boot: bool) -> timedelta:
    return timedelta(minutes=45 if slow_boot else 25)


class Volume(models.Model):
    """Storage that outlives clusters (SPEC §6): created in a location, attached to one cluster
    at a time when that cluster is created, synced into `/shared/volume` on its head, and
    billed per GB-month for its whole life, attached or not (docs/volumes.md)."""

    MIN_GB = 1
    MAX_GB = 100_000

    project = models.ForeignKey(
        "accounts.Project", on_delete=models.CASCADE, related_name="volumes"
    )
    name = models.CharField(max_length=63)
    location = models.ForeignKey(
        "offers.Location", on_delete=models.PROTECT, related_name="volumes"
    )
    size_gb = models.PositiveIntegerField(
        validators=[MinValueValidator(MIN_GB), MaxValueValidator(MAX_GB)]
    )
    price_per_gb_month = models.DecimalField(
        max_digits=8, decimal_places=4, help_text="The location's price when it was created."
    )
    created_at = models.DateTimeField(default=timezone.now)
    deleted_at = models.DateTimeField(null=True, blank=True)
    cluster = models.ForeignKey(
        Cluster,
        null=True,
        blank=True,
        on_delete=models.SET_NULL,
        related_name="volumes",
        help_text="The cluster it is attached to; detached when that cluster ends.",
    )
    attached_at = models.DateTimeField(null=True, blank=True)
    # Its storage is metered by billing (billing.models.StorageRecord, `volume.storage`).

    class Meta:
        ordering = ["name", "pk"]
        constraints = [
            models.UniqueConstraint(
                fields=["project", "name"],
                condition=Q(deleted_at__isnull=True),
                name="volume_live_name_unique",
            ),
        ]
        indexes = [models.Index(fields=["deleted_at"], name="volume_deleted_at")]

    def __str__(self) -> str:
        return self.name

    @property
    def price_per_month(self) -> Decimal:
        return (self.price_per_gb_month * self.size_gb).quantize(Decimal("0.01"))


class IdempotentRequest(models.Model):
    """A create sent with an `Idempotency-Key` header: its first answer, replayed byte for byte
    to a retry with the same key and body for `KEEP_FOR` (clusters/idempotency.py).

    The row is inserted before the create, in the same transaction: the unique key makes a
    second, simultaneous request wait for the first and then replay it, never create again.
    """

    KEEP_FOR = timedelta(hours=24)

    project = models.ForeignKey("accounts.Project", on_delete=models.CASCADE, related_name="+")
    api_key = models.ForeignKey("accounts.ApiKey", on_delete=models.CASCADE, related_name="+")
    key = models.CharField(max_length=255)
    request_hash = models.CharField(max_length=64, help_text="SHA-256 of the validated body.")
    cluster = models.ForeignKey(
        Cluster, null=True, blank=True, on_delete=models.SET_NULL, related_name="+"
    )
    status_code = models.PositiveSmallIntegerField(null=True, blank=True)
    response = models.TextField(blank=True, default="", help_text="The first answer's body.")
    created_at = models.DateTimeField(default=timezone.now, db_index=True)

    class Meta:
        constraints = [
            models.UniqueConstraint(
                fields=["project", "api_key", "key"], name="idempotent_request_unique_key"
            )
        ]

    def __str__(self) -> str:
        return self.key


# --- metrics (issue 23; clusters/telemetry/metrics.py, docs/metrics.md) ---------------------------
# What each node's agent reports every RUNCRATE_METRICS_SECONDS: raw samples, kept an hour,
# rolled up per minute (kept 14 days) and per hour (kept 90 days) by the beat. Figures an agent
# could not read are null, never zero.


class GpuSample(models.Model):
    """One GPU's figures in one metrics report, stamped with the server's clock."""

    node = models.ForeignKey(Node, on_delete=models.CASCADE, related_name="+", db_index=False)
    at = models.DateTimeField()
    index = models.PositiveSmallIntegerField()
    utilization_percent = models.FloatField(null=True)
    memory_used_mib = models.PositiveIntegerField(null=True)
    memory_total_mib = models.PositiveIntegerField(null=True)
    temperature_c = models.FloatField(null=True)
    power_w = models.FloatField(null=True)
    power_limit_w = models.FloatField(null=True)
    sm_clock_mhz = models.PositiveIntegerField(null=True)
    throttle = models.PositiveSmallIntegerField(
        null=True,
        help_text="The active throttle reasons, a bitmask (clusters/telemetry/metrics.py).",
    )
    ecc_corrected = models.PositiveBigIntegerField(null=True)
    ecc_uncorrected = models.PositiveBigIntegerField(null=True)
    retired_pages_pending = models.BooleanField(null=True)
    remapped_rows_pending = models.BooleanField(null=True)

    class Meta:
        indexes = [
            # A node's window, its latest report, and the rollup's scan of finished minutes.
            models.Index(fields=["node", "at"], name="gpu_sample_node_at"),
            # Pruning by time.
            models.Index(fields=["at"], name="gpu_sample_at"),
        ]

    def __str__(self) -> str:
        return f"GPU {self.index} of node {self.node_id} at {self.at:%Y-%m-%d %H:%M:%S}"


class NodeSample(models.Model):
    """A node's own figures in one metrics report; the network counters are cumulative bytes
    of the private network's interface (rates come from consecutive samples)."""

    node = models.ForeignKey(Node, on_delete=models.CASCADE, related_name="+", db_index=False)
    at = models.DateTimeField()
    cpu_percent = models.FloatField(null=True)
    memory_used_mib = models.PositiveIntegerField(null=True)
    memory_total_mib = models.PositiveIntegerField(null=True)
    disk_root_used_gib = models.FloatField(null=True)
    disk_root_total_gib = models.FloatField(null=True)
    disk_shared_used_gib = models.FloatField(null=True)
    disk_shared_total_gib = models.FloatField(null=True)
    network_rx_bytes = models.PositiveBigIntegerField(null=True)
    network_tx_bytes = models.PositiveBigIntegerField(null=True)

    class Meta:
        indexes = [
            models.Index(fields=["node", "at"], name="node_sample_node_at"),
            models.Index(fields=["at"], name="node_sample_at"),
        ]

    def __str__(self) -> str:
        return f"node {self.node_id} at {self.at:%Y-%m-%d %H:%M:%S}"


class Resolution(models.IntegerChoices):
    """A rollup's bucket, in seconds."""

    MINUTE = 60, "minute"
    HOUR = 3600, "hour"


class GpuRollup(models.Model):
    """One GPU's samples over a minute or an hour: how many, and the min, mean and max of each
    figure a chart draws (over the samples that had it)."""

    node = models.ForeignKey(Node, on_delete=models.CASCADE, related_name="+", db_index=False)
    index = models.PositiveSmallIntegerField()
    resolution = models.PositiveIntegerField(choices=Resolution.choices)
    start = models.DateTimeField()
    samples = models.PositiveIntegerField()
    utilization_min = models.FloatField(null=True)
    utilization_mean = models.FloatField(null=True)
    utilization_max = models.FloatField(null=True)
    memory_used_min = models.FloatField(null=True)
    memory_used_mean = models.FloatField(null=True)
    memory_used_max = models.FloatField(null=True)
    temperature_min = models.FloatField(null=True)
    temperature_mean = models.FloatField(null=True)
    temperature_max = models.FloatField(null=True)
    power_min = models.FloatField(null=True)
    power_mean = models.FloatField(null=True)
    power_max = models.FloatField(null=True)

    class Meta:
        constraints = [
            # Also the index a node's window reads: (node, resolution, start).
            models.UniqueConstraint(
                fields=["node", "resolution", "start", "index"], name="gpu_rollup_unique_bucket"
            )
        ]
        indexes = [models.Index(fields=["resolution", "start"], name="gpu_rollup_start")]

    def __str__(self) -> str:
        return f"GPU {self.index} of node {self.node_id}, {self.resolution} s from {self.start}"


class NodeRollup(models.Model):
    """A node's own samples over a minute or an hour; the network counters' highest value in
    the bucket (the counter at its end, unless the node rebooted)."""

    node = models.ForeignKey(Node, on_delete=models.CASCADE, related_name="+", db_index=False)
    resolution = models.PositiveIntegerField(choices=Resolution.choices)
    start = models.DateTimeField()
    samples = models.PositiveIntegerField()
    cpu_min = models.FloatField(null=True)
    cpu_mean = models.FloatField(null=True)
    cpu_max = models.FloatField(null=True)
    memory_used_min = models.FloatField(null=True)
    memory_used_mean = models.FloatField(null=True)
    memory_used_max = models.FloatField(null=True)
    network_rx_bytes = models.PositiveBigIntegerField(null=True)
    network_tx_bytes = models.PositiveBigIntegerField(null=True)

    class Meta:
        constraints = [
            models.UniqueConstraint(
                fields=["node", "resolution", "start"], name="node_rollup_unique_bucket"
            )
        ]
        indexes = [models.Index(fields=["resolution", "start"], name="node_rollup_start")]

    def __str__(self) -> str:
        return f"node {self.node_id}, {self.resolution} s from {self.start}"


class LogFetch(models.Model):
    """A node's last read of one group of texts over its driver (docs/metrics.md, "Logs and
    jobs"): its logs, or (on the head) its jobs. `requested_at` is when the last fetch was
    asked for, `fetched_at` when one last finished, `error` why that one read nothing (the
    texts of the fetch before stay, with their own times). One row per node and group: it is
    also what keeps a second fetch from starting while one runs
    (`clusters.telemetry.logs.claim`)."""

    class Group(models.TextChoices):
        LOGS = "logs", "logs"
        JOBS = "jobs", "jobs"

    node = models.ForeignKey(Node, on_delete=models.CASCADE, related_name="+", db_index=False)
    group = models.CharField(max_length=4, choices=Group.choices)
    requested_at = models.DateTimeField(null=True, blank=True)
    fetched_at = models.DateTimeField(null=True, blank=True)
    error = models.TextField(blank=True, default="")

    class Meta:
        constraints = [
            models.UniqueConstraint(fields=["node", "group"], name="log_fetch_one_per_group")
        ]

    def __str__(self) -> str:
        return f"{self.group} of node {self.node_id}"


class NodeLog(models.Model):
    """One text a fetch read (a log, a job queue): what the command printed, at most the
    driver's LOG_CAP_BYTES, the command that produced it, and when. The next fetch of its group
    replaces it; it goes with its node."""

    fetch = models.ForeignKey(LogFetch, on_delete=models.CASCADE, related_name="texts")
    kind = models.CharField(max_length=16)
    command = models.TextField(blank=True, default="")
    output = models.TextField(blank=True, default="")
    fetched_at = models.DateTimeField()

    class Meta:
        constraints = [
            models.UniqueConstraint(fields=["fetch", "kind"], name="node_log_one_per_kind")
        ]

    def __str__(self) -> str:
        return f"{self.kind} of fetch {self.fetch_id}"
