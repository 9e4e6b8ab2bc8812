from collections.abc import Mapping
from datetime import date
from typing import Any

from django import forms
from django.http import QueryDict
from django.utils import timezone

from offers.models import MAX_NODES, MIN_NODES, TOO_FEW_NODES, GpuModel, MachineType
from offers.offers import GPUS_PER_MACHINE, SortBy
from offers.quotes import (
    NAME_MAX_LENGTH,
    NOTES_MAX_LENGTH,
    QUOTE_MAX_NODES,
    QUOTE_MAX_WEEKS,
    QUOTE_MIN_NODES,
    QUOTE_MIN_WEEKS,
    QuoteInvalid,
    check_start_date,
)
from offers.visibility import visible_locations

SIZE_QUICK_PICKS = (2, 4, 8, 16, 32, 64)
DEFAULT_NODES = 2
SIZE_MESSAGE = (
    f"A self-serve cluster has {MIN_NODES} to {MAX_NODES} machines. For more, request a quote."
)


class SizeInput(forms.NumberInput):
    """The size arrives from the number input and the quick-pick radios, both named `nodes`.

    With JavaScript the two are kept equal (and the radios drop their name). Without it both
    are sent, and the one that differs from the size shown before (`prev`) is what the user
    changed; the radio wins if both changed, as it was the last thing clicked, most likely.
    """

    def value_from_datadict(self, data: Mapping[str, Any], files: object, name: str) -> str | None:
        assert isinstance(data, QueryDict)  # the picker's form is bound to request.GET
        values = [v.strip() for v in data.getlist(name) if v.strip()]
        if not values:
            return None
        changed = [v for v in values if v != data.get("prev")]
        return changed[-1] if changed else values[-1]


class FlagInput(forms.CheckboxInput):
    """A checkbox read from a URL: `1`, `true`, `on` and `yes` are ticked, anything else not."""

    def value_from_datadict(self, data: Mapping[str, Any], files: object, name: str) -> bool:
        return str(data.get(name, "")).strip().lower() in {"1", "true", "on", "yes"}


class PickerForm(forms.Form):
    """The picker's GET query: `?gpu=&nodes=&community=1&sort=&gpus=`. Every field may be left
    out; a bad `sort` or `gpus` is named beside its control and the offers show unsorted or
    unfiltered (`sort_by`, `gpus_per_machine`)."""

    gpu = forms.CharField(required=False)  # any text: an unknown one is named, not rejected
    nodes = forms.IntegerField(
        required=False,
        min_value=MIN_NODES,
        max_value=MAX_NODES,
        widget=SizeInput,
        error_messages={
            "invalid": f"Enter the number of machines, a whole number from {MIN_NODES} to "
            f"{MAX_NODES}.",
            "min_value": TOO_FEW_NODES,
            "max_value": SIZE_MESSAGE,
        },
    )
    community = forms.BooleanField(required=False, widget=FlagInput)
    sort = forms.CharField(required=False)
    gpus = forms.CharField(required=False)

    def clean_nodes(self) -> int:
        return self.cleaned_data["nodes"] or DEFAULT_NODES

    def clean_sort(self) -> SortBy:
        raw = self.cleaned_data["sort"].strip()
        if not raw:
            return SortBy.PRICE
        if raw not in SortBy.values:
            raise forms.ValidationError(
                f"There is no sort '{raw[:40]}': sort by cluster price (price) or by price per "
                "GPU-hour (price_per_gpu_hour). Showing the offers by cluster price."
            )
        return SortBy(raw)

    def clean_gpus(self) -> int | None:
        raw = self.cleaned_data["gpus"].strip()
        if not raw:
            return None
        if raw not in {str(n) for n in GPUS_PER_MACHINE}:
            raise forms.ValidationError(
                f"Machines have 1, 2, 4 or 8 GPUs, not '{raw[:40]}'. Showing every machine."
            )
        return int(raw)

    @property
    def sort_by(self) -> SortBy:
        return self.cleaned_data.get("sort") or SortBy.PRICE

    @property
    def gpus_per_machine(self) -> int | None:
        return self.cleaned_data.get("gpus")


def _gpu_choices() -> list[tuple[str, str]]:
    return [(gpu.slug, f"{gpu.name}") for gpu in GpuModel.objects.order_by("name")]


def _location_choices() -> list[tuple[str, str]]:
    # Never a failure-drill location: no one asks a quote for hosts that fail on purpose.
    locations = visible_locations(drills=False).order_by("name")
    return [("", "Any location")] + [(loc.code, f"{loc.name} ({loc.code})") for loc in locations]


class QuoteForm(forms.Form):
    """The page's quote form. Types and bounds here; `offers.quotes.request_quote` decides."""

    gpu = forms.ChoiceField(label="GPU model", choices=_gpu_choices)
    nodes = forms.IntegerField(
        label="Machines",
        min_value=QUOTE_MIN_NODES,
        max_value=QUOTE_MAX_NODES,
        help_text=f"{QUOTE_MIN_NODES} to {QUOTE_MAX_NODES:,}. Self-serve clusters stop at "
        f"{MAX_NODES}.",
        error_messages={
            "invalid": "Enter the number of machines as a whole number.",
            "min_value": f"Ask for {QUOTE_MIN_NODES} to {QUOTE_MAX_NODES:,} machines.",
            "max_value": f"Ask for {QUOTE_MIN_NODES} to {QUOTE_MAX_NODES:,} machines.",
        },
    )
    interconnect = forms.ChoiceField(
        choices=[
            (MachineType.Interconnect.ETHERNET, "Ethernet (1-2 Gbit/s private network)"),
            (MachineType.Interconnect.INFINIBAND, "InfiniBand"),
            (MachineType.Interconnect.ROCE, "RoCE"),
        ],
        initial=MachineType.Interconnect.ETHERNET,
        help_text="InfiniBand or RoCE for training one model across machines.",
    )
    location = forms.ChoiceField(choices=_location_choices, required=False)
    start_date = forms.DateField(
        widget=forms.DateInput(attrs={"type": "date"}),
        error_messages={"invalid": "Enter a date as YYYY-MM-DD."},
    )
    duration_weeks = forms.IntegerField(
        label="Duration (weeks)",
        min_value=QUOTE_MIN_WEEKS,
        max_value=QUOTE_MAX_WEEKS,
        help_text=f"{QUOTE_MIN_WEEKS} to {QUOTE_MAX_WEEKS} weeks (three years).",
        error_messages={
            "invalid": "Enter the duration in whole weeks.",
            "min_value": f"The duration is {QUOTE_MIN_WEEKS} to {QUOTE_MAX_WEEKS} weeks.",
            "max_value": f"The duration is {QUOTE_MIN_WEEKS} to {QUOTE_MAX_WEEKS} weeks.",
        },
    )
    contact_name = forms.CharField(label="Your name", max_length=NAME_MAX_LENGTH)
    contact_email = forms.EmailField(label="Email for the reply")
    notes = forms.CharField(
        required=False,
        max_length=NOTES_MAX_LENGTH,
        widget=forms.Textarea(attrs={"rows": 4}),
        help_text="What you will run, software, budget, anything that helps us price it.",
    )

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.fields["start_date"].widget.attrs["min"] = timezone.localdate().isoformat()

    def clean_start_date(self) -> date:
        # Checked here too so that every bad field shows at once, not one per submission.
        start = self.cleaned_data["start_date"]
        try:
            check_start_date(start)
        except QuoteInvalid as exc:
            raise forms.ValidationError(exc.problem) from None
        return start


def quote_initial(query: QueryDict, *, user_email: str, user_name: str) -> dict:
    """The quote form's prefill from the picker's link (`?gpu=&nodes=&interconnect=&location=`).

    Values that are not valid are left out, never shown as errors: the user has not typed them.
    """
    initial: dict = {
        "contact_email": user_email,
        "contact_name": user_name,
        "interconnect": MachineType.Interconnect.ETHERNET,
    }
    probe = QuoteForm(
        data={key: query.get(key, "") for key in ("gpu", "nodes", "interconnect", "location")}
    )
    probe.is_valid()
    for key in ("gpu", "nodes", "interconnect", "location"):
        if query.get(key) and key not in probe.errors:
            initial[key] = probe.cleaned_data[key]
    return initial
