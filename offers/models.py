from dataclasses import dataclass
from decimal import Decimal
from typing import Any

from django.conf import settings
from django.core.validators import MaxValueValidator, MinValueValidator
from django.db import models
from django.utils import timezone

MIN_NODES = 2
MAX_NODES = 64
# What a size below MIN_NODES is told, everywhere (picker, create form, API): not "request a
# quote", which is for bigger clusters (docs/clusters.md, "Sizes").
TOO_FEW_NODES = (
    f"A cluster has at least {MIN_NODES} machines; for one machine's worth of GPUs, pick "
    f"{MIN_NODES} machines with half as many GPUs each (machines have 1, 2, 4 or 8 GPUs)."
)
# A location that only says whether it has machines never starts more than this on a guess.
BOOLEAN_MAX_NODES = 8


class GpuModel(models.Model):
    slug = models.SlugField(max_length=40, unique=True)
    name = models.CharField(max_length=80)
    memory_gib = models.PositiveIntegerField()

    class Meta:
        ordering = ["name"]
        verbose_name = "GPU model"

    def __str__(self) -> str:
        return self.name


# The most a location may say its fabric carries at once (Location.measurements_at_once).
MOST_MEASUREMENTS_AT_ONCE = 1_000


class Location(models.Model):
    class CapacityReporting(models.TextChoices):
        COUNT = "count", "Counts free machines"
        BOOLEAN = "boolean", "Says only whether it has machines"

    code = models.SlugField(max_length=40, unique=True)
    name = models.CharField(max_length=100)
    country = models.CharField(max_length=2)
    capacity_reporting = models.CharField(max_length=8, choices=CapacityReporting.choices)
    ssh_gateway = models.CharField(
        max_length=255,
        blank=True,
        default="",
        help_text="host:port, or empty when hosts have their own public address.",
    )
    ssh_gateway_host_key = models.TextField(
        blank=True, default="", help_text="The gateway's pinned SSH host key (type base64)."
    )
    volume_price_per_gb_month = models.DecimalField(
        max_digits=8, decimal_places=4, default=Decimal("0.10")
    )
    apt_mirror = models.URLField(
        blank=True,
        default="",
        help_text="The Debian/Ubuntu mirror its hosts install from; empty: hosts are imaged with "
        "everything.",
    )
    pip_index_url = models.URLField(
        blank=True, default="", help_text="The Python package index its hosts install from."
    )
    # Where volumes' files live (docs/volumes.md): a host reached over SSH with a pinned key,
    # each volume a folder under storage_path, synced with rsync to and from a cluster's head.
    storage_host = models.CharField(
        max_length=255,
        blank=True,
        default="",
        help_text="host:port of the storage host that keeps volumes' files; empty: volumes are "
        "not synced (the simulated data center).",
    )
    storage_host_key = models.TextField(
        blank=True, default="", help_text="The storage host's pinned SSH host key (type base64)."
    )
    storage_path = models.CharField(
        max_length=255,
        blank=True,
        default="/srv/runcrate/volumes",
        help_text="The folder on the storage host that holds one folder per volume.",
    )
    # Tenants never meet (docs/inventory.md, "Reimage before reuse"): the command that reimages
    # one of this location's hosts; a host's own `reimage` wins. Empty: a host that served a
    # cluster goes `dirty` until staff reimage it.
    reimage = models.CharField(
        max_length=1000,
        blank=True,
        default="",
        help_text="The shell command that reimages one host (RUNCRATE_HOST_NAME, "
        "RUNCRATE_HOST_ADDRESS and RUNCRATE_HOST_PORT in its environment; exit 0 when the host "
        "is back). Empty: hosts that served a cluster go dirty until staff reimage them.",
    )
    # A failure-drill location: its hosts fail on purpose. Offered only to staff and to projects
    # flagged for drills (offers/visibility.py), never as a suggestion, a quote or storage.
    drill = models.BooleanField(
        default=False,
        help_text="Failure drills: offered only to staff and to projects flagged for drills.",
    )

    # How many acceptance measurements (one machine's stream to another over the private
    # network) its fabric carries at once without their slowing each other (docs/lifecycle.md,
    # "Acceptance before billing"): null, every pair of a round at once (each machine its own
    # link to a non-blocking switch); a number, each round in waves of at most that many.
    measurements_at_once = models.PositiveSmallIntegerField(
        null=True,
        blank=True,
        validators=[MinValueValidator(1), MaxValueValidator(MOST_MEASUREMENTS_AT_ONCE)],
        help_text="How many acceptance measurements (one machine's stream to another) its "
        "private network carries at once without slowing each other. Empty: every pair of a "
        "round at once (each machine its own link to a non-blocking switch).",
    )

    class Meta:
        ordering = ["code"]

    def __str__(self) -> str:
        return f"{self.name} ({self.code})"


class MachineType(models.Model):
    """What is sold: a kind of machine in a location, priced per machine-hour."""

    class Kind(models.TextChoices):
        VM = "vm", "Virtual machine"
        BARE_METAL = "bare_metal", "Bare metal"
        CONTAINER = "container", "Container"

    class Interconnect(models.TextChoices):
        ETHERNET = "ethernet", "Ethernet"
        INFINIBAND = "infiniband", "InfiniBand"
        ROCE = "roce", "RoCE"

    DEFAULT_BOOT_SECONDS = {Kind.CONTAINER: 60, Kind.VM: 180, Kind.BARE_METAL: 600}
    # The Ethernet link a machine is expected to have when `link_mbit` does not say (the
    # private network runs over it, whatever the GPUs' own interconnect): the 1 Gbit/s we
    # sell at the least, and the 10 Gbit/s front end of InfiniBand and RoCE machines.
    DEFAULT_LINK_MBIT: dict[str, int] = {
        Interconnect.ETHERNET: 1_000,
        Interconnect.INFINIBAND: 10_000,
        Interconnect.ROCE: 10_000,
    }
    SELF_SERVE_INTERCONNECTS = {Interconnect.ETHERNET}

    class GpuLink(models.TextChoices):
        """How the GPUs inside one machine talk to each other (not the network between
        machines, which is `interconnect`)."""

        NVLINK = "nvlink", "NVLink"
        NVSWITCH = "nvswitch", "NVSwitch"
        PCIE = "pcie", "PCIe"

    slug = models.SlugField(max_length=60, unique=True)
    location = models.ForeignKey(Location, on_delete=models.PROTECT, related_name="machine_types")
    gpu = models.ForeignKey(GpuModel, on_delete=models.PROTECT, related_name="machine_types")
    gpus_per_machine = models.PositiveSmallIntegerField(
        choices=[(1, "1"), (2, "2"), (4, "4"), (8, "8")]
    )
    machine_kind = models.CharField(max_length=12, choices=Kind.choices)
    interconnect = models.CharField(
        max_length=12, choices=Interconnect.choices, default=Interconnect.ETHERNET
    )
    community = models.BooleanField(default=False)
    price_per_hour = models.DecimalField(
        max_digits=10, decimal_places=2, validators=[MinValueValidator(Decimal("0.01"))]
    )
    boot_seconds = models.PositiveIntegerField(
        validators=[MinValueValidator(1), MaxValueValidator(3600)]
    )
    slow_boot = models.BooleanField(default=False)
    # Each machine's expected Ethernet link speed, in Mbit/s; null: DEFAULT_LINK_MBIT of its
    # interconnect. Acceptance wants a fraction of it to node-0 (docs/lifecycle.md).
    link_mbit = models.PositiveIntegerField(
        null=True,
        blank=True,
        validators=[MinValueValidator(1), MaxValueValidator(1_000_000)],
        help_text="Expected Ethernet link speed per machine in Mbit/s; empty: by interconnect.",
    )
    # What a buyer compares machines by (docs/inventory.md, "Machine specs"): shown on every
    # offer and plan (`specs`), and checked against what each node reports at acceptance
    # (clusters/lifecycle/rules.py). Empty: not stated, neither shown nor checked.
    vcpus = models.PositiveIntegerField(
        null=True,
        blank=True,
        validators=[MinValueValidator(1), MaxValueValidator(4096)],
        help_text="vCPUs per machine; empty: not stated.",
    )
    memory_gib = models.PositiveIntegerField(
        null=True,
        blank=True,
        validators=[MinValueValidator(1), MaxValueValidator(65_536)],
        help_text="Memory (RAM) per machine in GiB; empty: not stated.",
    )
    nvme_gib = models.PositiveIntegerField(
        null=True,
        blank=True,
        validators=[MaxValueValidator(1_048_576)],
        help_text="Local NVMe per machine in GiB (2048 = 2 TiB; 0: none); empty: not stated.",
    )
    gpu_link = models.CharField(
        max_length=8,
        choices=GpuLink.choices,
        blank=True,
        default="",
        help_text="The GPU link inside the machine; empty: not stated.",
    )
    os_image = models.CharField(
        max_length=60,
        blank=True,
        default="",
        help_text='The OS image machines boot, e.g. "Ubuntu 22.04"; empty: not stated.',
    )
    driver_version = models.CharField(
        max_length=20,
        blank=True,
        default="",
        help_text='The NVIDIA driver, e.g. "570" or "570.124.06": a node with an older one '
        "fails acceptance; empty: not stated.",
    )
    cuda_version = models.CharField(
        max_length=10,
        blank=True,
        default="",
        help_text='The CUDA version the image carries, e.g. "12.8"; empty: not stated.',
    )

    class Meta:
        ordering = ["slug"]

    def __str__(self) -> str:
        return self.slug

    @property
    def supports_kubernetes(self) -> bool:
        return self.machine_kind != self.Kind.CONTAINER

    @property
    def supports_volumes(self) -> bool:
        return not self.community

    @property
    def is_self_serve(self) -> bool:
        return self.interconnect in self.SELF_SERVE_INTERCONNECTS

    @property
    def expected_link_mbit(self) -> int:
        return self.link_mbit or self.DEFAULT_LINK_MBIT.get(self.interconnect, 1_000)

    @property
    def specs(self) -> "MachineSpecs":
        return MachineSpecs(**{name: getattr(self, name) for name in SPEC_FIELDS})


# A machine type's specs, as its fields, the inventory's keys and `MachineSpecs` name them.
SPEC_FIELDS = (
    "vcpus", "memory_gib", "nvme_gib", "gpu_link", "os_image", "driver_version", "cuda_version",
)  # fmt: skip


def size_words(gib: int) -> str:
    """A size in GiB as a GPU-cloud user reads it: "512 GiB", "1.8 TiB", "2 TiB"."""
    if gib < 1024:
        return f"{gib} GiB"
    tib = f"{gib / 1024:.1f}".removesuffix(".0")
    return f"{tib} TiB"


def version_tuple(version: str) -> tuple[int, ...]:
    """ "570.124.06" -> (570, 124, 6); the parts a driver version is compared by (a part that
    is not a number ends it)."""
    parts = []
    for part in version.strip().split("."):
        if not part.isdigit():
            break
        parts.append(int(part))
    return tuple(parts)


def driver_at_least(reported: str, sold: str) -> bool:
    """Whether a node's driver `reported` is `sold` or newer, compared on as many parts as the
    sold version gives ("570" is met by 570.124.06 and 575.51, not by 565.77)."""
    wanted = version_tuple(sold)
    have = version_tuple(reported)
    return bool(have) and have[: len(wanted)] >= wanted


@dataclass(frozen=True)
class MachineSpecs:
    """What one machine of a type is sold with (`MachineType.specs`); a figure not stated is
    None or "". The one wording every page, the API, the CLI and the MCP server show."""

    vcpus: int | None = None
    memory_gib: int | None = None
    nvme_gib: int | None = None
    gpu_link: str = ""
    os_image: str = ""
    driver_version: str = ""
    cuda_version: str = ""

    @property
    def gpu_link_label(self) -> str:
        return MachineType.GpuLink(self.gpu_link).label if self.gpu_link else ""

    def words(self) -> list[str]:
        """["208 vCPUs", "1.8 TiB RAM", "2 TiB NVMe", "NVLink", "Ubuntu 22.04", "driver 570",
        "CUDA 12.8"], leaving out what is not stated."""
        words = []
        if self.vcpus is not None:
            words.append(f"{self.vcpus} vCPU{'' if self.vcpus == 1 else 's'}")
        if self.memory_gib is not None:
            words.append(f"{size_words(self.memory_gib)} RAM")
        if self.nvme_gib is not None:
            words.append(f"{size_words(self.nvme_gib)} NVMe" if self.nvme_gib else "no local NVMe")
        if self.gpu_link:
            words.append(self.gpu_link_label)
        if self.os_image:
            words.append(self.os_image)
        if self.driver_version:
            words.append(f"driver {self.driver_version}")
        if self.cuda_version:
            words.append(f"CUDA {self.cuda_version}")
        return words

    @property
    def summary(self) -> str:
        return " · ".join(self.words())

    def as_dict(self) -> dict[str, Any]:
        """The API's and the CLI's `specs` object: every figure (null when not stated) and the
        summary line."""
        return {
            "vcpus": self.vcpus,
            "memory_gib": self.memory_gib,
            "nvme_gib": self.nvme_gib,
            "gpu_link": self.gpu_link or None,
            "os_image": self.os_image or None,
            "driver_version": self.driver_version or None,
            "cuda_version": self.cuda_version or None,
            "summary": self.summary,
        }


class Host(models.Model):
    """One machine of the inventory."""

    class Driver(models.TextChoices):
        SIMULATED = "simulated"
        SSH = "ssh"

    class State(models.TextChoices):
        FREE = "free"
        RESERVED = "reserved"
        IN_USE = "in_use"
        CLEANING = "cleaning"
        # Served a cluster and not (yet) reimaged and found pristine: offered to no one.
        DIRTY = "dirty"
        OFFLINE = "offline"

    class Fault(models.TextChoices):
        BOOT = "boot", "never comes up"
        CRASH = "crash", "comes up, then fails"
        AGENT = "agent", "agent never checks in"
        NETWORK = "network", "cannot reach one peer"
        INSTALL = "install", "software install fails"
        GPU = "gpu", "a GPU fails after 10 minutes"

    name = models.CharField(max_length=100, unique=True)
    machine_type = models.ForeignKey(MachineType, on_delete=models.PROTECT, related_name="hosts")
    driver = models.CharField(max_length=12, choices=Driver.choices, default=Driver.SIMULATED)
    address = models.CharField(max_length=255, blank=True, default="")
    port = models.PositiveIntegerField(default=22)
    user = models.CharField(max_length=64, blank=True, default="root")
    host_key = models.TextField(blank=True, default="", help_text="Pinned SSH host key.")
    state = models.CharField(max_length=10, choices=State.choices, default=State.FREE)
    fault = models.CharField(max_length=10, choices=Fault.choices, blank=True, default="")
    state_changed_at = models.DateTimeField(default=timezone.now)
    reimage = models.CharField(
        max_length=1000,
        blank=True,
        default="",
        help_text="This host's own reimage command; empty: its location's.",
    )
    # What the host looked like when staff registered it, freshly imaged, as the product's own
    # reader saw it over SFTP (clusters/machines/hosts.py): what every later verification compares
    # with.
    baseline = models.JSONField(default=dict, blank=True, editable=False)
    baseline_at = models.DateTimeField(null=True, blank=True, editable=False)
    # Why the host is dirty or offline: the reimage's failure, or what differs from the baseline.
    pristine_report = models.TextField(blank=True, default="", editable=False)
    # A host whose machine was lost or replaced as unhealthy goes offline for staff (clusters/
    # lifecycle/repair.py): when, and why with the health report. Kept after staff clear it, so
    # no replacement is drawn from it for RUNCRATE_QUARANTINE_DAYS (docs/inventory.md).
    quarantined_at = models.DateTimeField(null=True, blank=True, editable=False)
    quarantine_reason = models.TextField(blank=True, default="", editable=False)

    class Meta:
        ordering = ["name"]
        indexes = [models.Index(fields=["machine_type", "state"], name="host_type_state")]

    def __str__(self) -> str:
        return self.name

    @property
    def reimage_command(self) -> str:
        """The command that reimages this host: its own, else its location's ("" for none)."""
        return self.reimage or self.machine_type.location.reimage


class QuoteRequest(models.Model):
    """A request for reserved capacity, large clusters or InfiniBand/RoCE, worked by staff."""

    class Status(models.TextChoices):
        NEW = "new"
        CONTACTED = "contacted"
        WON = "won"
        LOST = "lost"

    project = models.ForeignKey(
        "accounts.Project", on_delete=models.CASCADE, related_name="quote_requests"
    )
    requested_by = models.ForeignKey(
        settings.AUTH_USER_MODEL, null=True, on_delete=models.SET_NULL, related_name="+"
    )
    gpu = models.ForeignKey(GpuModel, on_delete=models.PROTECT, related_name="quote_requests")
    nodes = models.PositiveIntegerField(validators=[MinValueValidator(MIN_NODES)])
    interconnect = models.CharField(max_length=12, choices=MachineType.Interconnect.choices)
    location = models.ForeignKey(
        Location, null=True, blank=True, on_delete=models.SET_NULL, related_name="+"
    )
    start_date = models.DateField()
    duration_weeks = models.PositiveIntegerField(validators=[MinValueValidator(1)])
    contact_name = models.CharField(max_length=150)
    contact_email = models.EmailField()
    notes = models.TextField(blank=True, default="")
    status = models.CharField(max_length=10, choices=Status.choices, default=Status.NEW)
    created_at = models.DateTimeField(default=timezone.now)

    class Meta:
        ordering = ["-created_at", "-pk"]

    def __str__(self) -> str:
        return f"{self.nodes} × {self.gpu} ({self.get_status_display()})"


# How far back a track record looks, in days (docs/offers.md, "Track record").
TRACK_RECORD_DAYS = 30


class TrackRecord(models.Model):
    """How a machine type's clusters started over the last `TRACK_RECORD_DAYS` days, from the
    clusters' own events. Written by `clusters.track_record.refresh_track_records` (offers sits
    below clusters and never reads them); read with the offers in the same query, and shown
    only from `RUNCRATE_TRACK_RECORD_MIN_CLUSTERS` clusters on."""

    machine_type = models.OneToOneField(
        MachineType, primary_key=True, on_delete=models.CASCADE, related_name="track_record"
    )
    clusters = models.PositiveIntegerField(
        help_text="Clusters created in the window that became ready or failed before ready."
    )
    started = models.PositiveIntegerField(help_text="Of those, the ones that became ready.")
    withdrawn = models.PositiveIntegerField(
        default=0,
        help_text="Terminated or stopped before ready without a failure: not counted.",
    )
    ready_median_seconds = models.PositiveIntegerField(null=True, blank=True)
    ready_p95_seconds = models.PositiveIntegerField(null=True, blank=True)
    failures_by_step = models.JSONField(
        default=dict, blank=True, help_text="Step -> clusters that failed at it before ready."
    )
    bandwidth_median_mbit = models.FloatField(
        null=True,
        blank=True,
        help_text="The median bandwidth to node-0 in the acceptance reports; null without any.",
    )
    computed_at = models.DateTimeField()

    def __str__(self) -> str:
        return f"track record of {self.machine_type_id}"
