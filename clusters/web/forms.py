"""The create form. It checks only what a browser can send wrong (a number that is no number);
every rule of SPEC §2 is the lifecycle's, and its refusals are shown beside their field."""

import re
import secrets
import string

from django import forms

from accounts import keys
from accounts.models import Environment, Project, SshKey, User
from accounts.projects import DEFAULT_ENVIRONMENT
from clusters import volumes
from clusters.errors import ClusterRefused
from clusters.models import NAME_RE, Cluster
from offers.models import MAX_NODES, MIN_NODES, Location, MachineType
from offers.offers import Offer
from runcrate.money import usd_rate

# ClusterRefused.field names the lifecycle's argument; the form's fields are named for people.
REFUSAL_FIELDS = {
    "name": "name",
    "nodes": "nodes",
    "software": "software",
    "environment": "environment",
    "ssh_key_ids": "ssh_keys",
    "ssh_keys": "ssh_keys",
    "volume": "volume",
    "repair_policy": "repair_policy",
}

SOFTWARE_HELP: dict[str, str] = {
    Cluster.Software.NONE: "Plain machines with the hostfile, SSH between nodes and /shared.",
    Cluster.Software.SLURM: "One Slurm partition, gpu, with every node; submit jobs with sbatch.",
    Cluster.Software.KUBERNETES: "Every node joins one Kubernetes cluster with its GPUs.",
    Cluster.Software.RAY: "A Ray cluster with its head on node-0.",
}


SUFFIX_ALPHABET = string.ascii_lowercase + string.digits
SUFFIX_LENGTH = 4


def name_suffix() -> str:
    return "".join(secrets.choice(SUFFIX_ALPHABET) for _ in range(SUFFIX_LENGTH))


def suggest_name(*, project: Project, offer: Offer, nodes: int) -> str:
    """A name for the create form to start from (docs/clusters.md, "Names"): the GPU, the size
    and a short random suffix, `h100-sxm-4x-k3f9`, that none of the project's clusters has
    (ended ones included, so a name in the bills stays one cluster's). One query."""
    gpu = re.sub(r"[^a-z0-9-]+", "-", offer.machine_type.gpu.slug.lower()).strip("-")[:40]
    stem = f"{gpu or 'gpu'}-{nodes}x" if nodes > 0 else gpu or "cluster"
    candidates = [f"{stem}-{name_suffix()}" for _ in range(5)]
    taken = set(
        Cluster.objects.filter(project=project, name__in=candidates).values_list("name", flat=True)
    )
    for name in candidates:
        if name not in taken and NAME_RE.fullmatch(name):
            return name
    return ""  # five collisions in 36^4: leave the field to the user rather than loop


class ClusterForm(forms.Form):
    offer = forms.CharField(widget=forms.HiddenInput)
    name = forms.CharField(
        max_length=200,
        strip=True,
        help_text=(
            "Lowercase letters, digits and hyphens, starting and ending with a letter or digit "
            "(a DNS label, up to 63 characters). It must be unique among the environment's live "
            "clusters."
        ),
        widget=forms.TextInput(
            attrs={"autocomplete": "off", "spellcheck": "false", "placeholder": "my-cluster"}
        ),
    )
    environment = forms.ModelChoiceField(
        queryset=Environment.objects.none(), to_field_name="name", empty_label=None
    )
    software = forms.ChoiceField(choices=Cluster.Software.choices, initial=Cluster.Software.NONE)
    ssh_keys = forms.ModelMultipleChoiceField(
        queryset=SshKey.objects.none(), required=False, widget=forms.CheckboxSelectMultiple
    )
    nodes = forms.IntegerField(
        error_messages={"invalid": "Nodes must be a whole number from 2 to 64."},
        widget=forms.NumberInput(attrs={"min": MIN_NODES, "max": MAX_NODES}),
    )
    # Left out (an older page, a script), it is the default: ask.
    repair_policy = forms.ChoiceField(
        choices=Cluster.RepairPolicy.choices, required=False, initial=Cluster.RepairPolicy.ASK
    )
    # Any number passes here; whether it may be attached is the lifecycle's rule.
    volume = forms.IntegerField(
        required=False, error_messages={"invalid": "Choose a volume from the list."}
    )

    def __init__(
        self, *args, project: Project, offer: Offer, user: User | None = None, **kwargs
    ) -> None:
        super().__init__(*args, **kwargs)
        self.chosen_offer = offer  # `offer` is the form's field
        self.project = project
        self._model_field("environment").queryset = project.environments.all()
        # Every member's keys may be chosen, each shown with whose it is; the creator's own and
        # the shared ones are ticked (accounts/keys.py `default_cluster_keys`, as the API's).
        self._model_field("ssh_keys").queryset = project.ssh_keys.select_related(
            "created_by"
        ).order_by("pk")
        if offer.max_nodes >= MIN_NODES:
            self.fields["nodes"].widget.attrs["max"] = offer.max_nodes
        if not self.is_bound:
            self.initial.setdefault("environment", DEFAULT_ENVIRONMENT)
            # The queryset's own rows (cached on it): has_ssh_keys then costs no query.
            every = self._model_field("ssh_keys").queryset
            assert every is not None  # set above
            default = [key for key in every if keys.chosen_by_default(key, user)]
            self.initial.setdefault("ssh_keys", default)

    def _model_field(self, name: str) -> forms.ModelChoiceField:
        field = self.fields[name]
        assert isinstance(field, forms.ModelChoiceField)  # a multiple-choice one is one too
        return field

    @property
    def has_ssh_keys(self) -> bool:
        return bool(self._model_field("ssh_keys").queryset)

    def software_choices(self) -> list[dict]:
        """The radios, with Kubernetes disabled (and why) where the offer cannot run it."""
        chosen = self["software"].value() or Cluster.Software.NONE
        choices = []
        for value, label in Cluster.Software.choices:
            disabled_reason = ""
            if value not in self.chosen_offer.software:
                disabled_reason = (
                    "Not on container machines: Kubernetes needs a virtual machine or bare metal."
                )
            choices.append(
                {
                    "value": value,
                    "label": label,
                    "help": SOFTWARE_HELP[value],
                    "checked": value == chosen and not disabled_reason,
                    "disabled_reason": disabled_reason,
                }
            )
        return choices

    @property
    def volumes_blocked(self) -> str:
        """Why no volume can go on this offer at all, or ""."""
        if not self.chosen_offer.machine_type.supports_volumes:
            return (
                "Volumes cannot be attached on community hosts: their machines are run by "
                "independent operators."
            )
        return ""

    def volume_choices(self) -> list[dict]:
        """The project's volumes, each disabled with its reason where it cannot be attached to
        this offer (another location, attached to another cluster)."""
        chosen = str(self["volume"].value() or "")
        machine_type = self.chosen_offer.machine_type
        assert isinstance(machine_type, MachineType)  # get_offer's offer holds the model
        choices = []
        for volume in volumes.live_volumes(self.project):
            reason = volumes.why_not_attachable(volume, machine_type)
            choices.append(
                {
                    "value": volume.pk,
                    "label": f"{volume.name} · {volume.size_gb:,} GB · {volume.location.code}",
                    "disabled_reason": reason,
                    "selected": str(volume.pk) == chosen and not reason,
                }
            )
        return choices

    def add_refusal(self, refusal: ClusterRefused) -> None:
        self.add_error(REFUSAL_FIELDS.get(refusal.field or ""), refusal.message)


class ReasonedSelect(forms.Select):
    """A select whose options in `reasons` (value -> why) are disabled and say why: a choice
    that cannot work is shown, never offered (SPEC §1)."""

    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self.reasons: dict[str, str] = {}

    def create_option(self, name, value, label, selected, index, subindex=None, attrs=None):
        why = self.reasons.get(str(value))
        if why:
            label = f"{label} — {why}"
        option = super().create_option(name, value, label, selected, index, subindex, attrs)
        if why:
            option["attrs"]["disabled"] = True
            option["selected"] = False
        return option


class VolumeForm(forms.Form):
    """The Storage page's create form. Like ClusterForm it checks only what a browser can send
    wrong; `clusters.volumes.create_volume` owns the rules and its refusals go beside their field.
    """

    name = forms.CharField(
        max_length=200,
        strip=True,
        help_text="A DNS label, unique among your volumes: lowercase letters, digits, hyphens.",
        widget=forms.TextInput(
            attrs={"autocomplete": "off", "spellcheck": "false", "placeholder": "datasets"}
        ),
    )
    location = forms.ChoiceField(
        help_text="A volume is attached only to clusters in its own location.",
        widget=ReasonedSelect,
    )
    size_gb = forms.IntegerField(
        label="Size (GB)",
        error_messages={"invalid": "The size is a whole number of GB, from 1 to 100,000."},
        widget=forms.NumberInput(attrs={"min": 1, "max": 100_000, "step": 1, "placeholder": "500"}),
    )

    def __init__(self, *args, locations: list[tuple[Location, str]], **kwargs) -> None:
        """`locations`: every location with why no volume can be created there, or ""
        (`clusters.volumes.volume_locations`); those that cannot are disabled, with the reason."""
        super().__init__(*args, **kwargs)
        location_field = self.fields["location"]
        assert isinstance(location_field, forms.ChoiceField)
        location_field.choices = [
            (
                location.code,
                f"{location.code} · {location.name} · "
                f"{usd_rate(location.volume_price_per_gb_month)} per GB-month",
            )
            for location, _ in locations
        ]
        reasons = {location.code: why for location, why in locations if why}
        self.fields["location"].widget.reasons = reasons
        self.unavailable_locations = reasons
        # The cheapest usable location is the default, never merely the first by code.
        usable = [location for location, why in locations if not why]
        if not self.is_bound and usable:
            cheapest = min(usable, key=lambda location: location.volume_price_per_gb_month)
            self.initial.setdefault("location", cheapest.code)

    def add_refusal(self, refusal: ClusterRefused) -> None:
        field = refusal.field if refusal.field in self.fields else None
        self.add_error(field, refusal.message)
