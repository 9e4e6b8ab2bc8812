"""Staff screens for the catalog, the inventory and quote requests.

Bulk changes go through `manage.py load_inventory` (docs/inventory.md); these screens are for
looking around and for single edits. A host's state belongs to the cluster lifecycle: it is
read-only here, and the two actions only move hosts between free and offline.
"""

from typing import TYPE_CHECKING, TypedDict

from django import forms
from django.contrib import admin, messages
from django.db.models import Count, Q, QuerySet
from django.http import HttpRequest

from offers.inventory import (
    FIXED_WHILE_SERVING,
    HELD_STATES,
    SPEC_KEYS,
    check_gateway,
    check_host_field,
    check_spec_field,
    host_setup_problems,
    take_hosts_offline,
    waiting_for_baseline,
    why_fixed_while_serving,
)
from offers.models import GpuModel, Host, Location, MachineType, QuoteRequest, TrackRecord
from offers.offers import inventory_changed
from runcrate.admin import ReadOnlyAdmin, money_column
from runcrate.money import usd_rate

if TYPE_CHECKING:
    from django_stubs_ext import WithAnnotations


# What each list's get_queryset annotates its rows with.
class _MachineTypeCount(TypedDict):
    machine_type_count: int


class _HostCount(TypedDict):
    host_count: int


class _HostCounts(TypedDict):
    free_hosts: int
    host_count: int


def _sentence(problem: str) -> str:
    return problem[0].upper() + problem[1:] + "."


class ChangesOffers(admin.ModelAdmin):
    """An admin whose edits change what is on offer: the cached offers are forgotten."""

    def save_model(self, request: HttpRequest, obj, form, change: bool) -> None:
        super().save_model(request, obj, form, change)
        inventory_changed()

    def delete_model(self, request: HttpRequest, obj) -> None:
        super().delete_model(request, obj)
        inventory_changed()

    def delete_queryset(self, request: HttpRequest, queryset: QuerySet) -> None:
        super().delete_queryset(request, queryset)
        inventory_changed()


@admin.register(GpuModel)
class GpuModelAdmin(ChangesOffers):
    list_display = ["name", "slug", "memory_gib", "machine_type_count"]
    search_fields = ["name", "slug"]

    def get_queryset(self, request: HttpRequest) -> QuerySet:
        return super().get_queryset(request).annotate(machine_type_count=Count("machine_types"))

    @admin.display(description="machine types", ordering="machine_type_count")
    def machine_type_count(self, gpu: "WithAnnotations[GpuModel, _MachineTypeCount]") -> int:
        return gpu.machine_type_count


class LocationForm(forms.ModelForm):
    class Meta:
        model = Location
        fields = [
            "code",
            "name",
            "country",
            "capacity_reporting",
            "ssh_gateway",
            "volume_price_per_gb_month",
            "drill",
            "measurements_at_once",
        ]

    def clean_ssh_gateway(self) -> str:
        try:
            return check_gateway(self.cleaned_data["ssh_gateway"])
        except ValueError as problem:
            raise forms.ValidationError(_sentence(str(problem))) from None


@admin.register(Location)
class LocationAdmin(ChangesOffers):
    form = LocationForm
    list_display = [
        "code",
        "name",
        "country",
        "capacity_reporting",
        "ssh_gateway",
        money_column("volume_price_per_gb_month", "per GB-month", format=usd_rate),
        "host_count",
        "drill",
    ]
    list_filter = ["capacity_reporting", "country", "drill"]
    search_fields = ["code", "name"]

    def get_queryset(self, request: HttpRequest) -> QuerySet:
        return super().get_queryset(request).annotate(host_count=Count("machine_types__hosts"))

    @admin.display(description="hosts", ordering="host_count")
    def host_count(self, location: "WithAnnotations[Location, _HostCount]") -> int:
        return location.host_count


class MachineTypeForm(forms.ModelForm):
    class Meta:
        model = MachineType
        fields = [
            "slug",
            "location",
            "gpu",
            "gpus_per_machine",
            "machine_kind",
            "interconnect",
            "community",
            "price_per_hour",
            "boot_seconds",
            "slow_boot",
            "link_mbit",
            *SPEC_KEYS,
        ]

    def _clean_spec(self, field_name: str) -> str:
        try:
            return check_spec_field(field_name, self.cleaned_data[field_name].strip())
        except ValueError as problem:
            raise forms.ValidationError(_sentence(str(problem))) from None

    def clean_os_image(self) -> str:
        return self._clean_spec("os_image")

    def clean_driver_version(self) -> str:
        return self._clean_spec("driver_version")

    def clean_cuda_version(self) -> str:
        return self._clean_spec("cuda_version")

    def clean(self):
        cleaned = super().clean()
        changing = [name for name in FIXED_WHILE_SERVING if name in self.changed_data]
        if self.instance.pk and changing:
            # The admin saves inside the transaction this runs in: the hosts stay locked.
            problem = why_fixed_while_serving(self.instance)
            if problem:
                for name in changing:
                    self.add_error(name, _sentence(f"{name.replace('_', ' ')} {problem}"))
        return cleaned


@admin.register(MachineType)
class MachineTypeAdmin(ChangesOffers):
    form = MachineTypeForm
    list_display = [
        "slug",
        "location_code",
        "gpu",
        "gpus_per_machine",
        "machine_kind",
        "interconnect",
        "community",
        money_column("price_per_hour", "per machine-hour"),
        "boot_seconds",
        "specs_summary",
        "free_hosts",
        "host_count",
    ]
    list_filter = ["interconnect", "machine_kind", "community", "gpu", "location"]
    list_select_related = ["location", "gpu"]
    search_fields = ["slug", "location__code", "gpu__slug"]
    autocomplete_fields = ["location", "gpu"]

    def get_queryset(self, request: HttpRequest) -> QuerySet:
        return (
            super()
            .get_queryset(request)
            .annotate(
                free_hosts=Count("hosts", filter=Q(hosts__state=Host.State.FREE)),
                host_count=Count("hosts"),
            )
        )

    @admin.display(description="location", ordering="location__code")
    def location_code(self, machine_type: MachineType) -> str:
        return machine_type.location.code

    @admin.display(description="specs per machine")
    def specs_summary(self, machine_type: MachineType) -> str:
        return machine_type.specs.summary or "not stated"

    @admin.display(description="free", ordering="free_hosts")
    def free_hosts(self, machine_type: "WithAnnotations[MachineType, _HostCounts]") -> int:
        return machine_type.free_hosts

    @admin.display(description="hosts", ordering="host_count")
    def host_count(self, machine_type: "WithAnnotations[MachineType, _HostCounts]") -> int:
        return machine_type.host_count


class HostForm(forms.ModelForm):
    class Meta:
        model = Host
        fields = [
            "name", "machine_type", "driver", "address", "port", "user", "host_key", "reimage",
            "fault",
        ]  # fmt: skip

    def _clean_static(self, field_name: str) -> str:
        try:
            return check_host_field(field_name, self.cleaned_data[field_name])
        except ValueError as problem:
            raise forms.ValidationError(_sentence(str(problem))) from None

    def clean_address(self) -> str:
        return self._clean_static("address")

    def clean_user(self) -> str:
        return self._clean_static("user")

    def clean_host_key(self) -> str:
        return self._clean_static("host_key")

    def clean(self):
        cleaned = super().clean()
        for field, problem in host_setup_problems(
            driver=cleaned.get("driver", ""),
            fault=cleaned.get("fault", ""),
            address=cleaned.get("address", ""),
            host_key=cleaned.get("host_key", ""),
        ):
            if field not in self.errors:
                sentence = f"this field {problem}" if problem.startswith("is ") else problem
                self.add_error(field, _sentence(sentence))
        instance = self.instance
        if instance.pk and instance.state in HELD_STATES:
            for field in ("machine_type", "driver"):
                if field in self.changed_data:
                    self.add_error(
                        field,
                        f"The host is {instance.state.replace('_', ' ')}: it keeps its"
                        f" {field.replace('_', ' ')} until it is free or offline.",
                    )
        return cleaned


class BaselineFilter(admin.SimpleListFilter):
    """The ssh hosts waiting for a baseline: offered to no one until staff record it
    (offers.offers.offered_hosts; docs/inventory.md)."""

    title = "baseline"
    parameter_name = "baseline"

    def lookups(self, request: HttpRequest, model_admin: admin.ModelAdmin) -> list[tuple[str, str]]:
        return [("waiting", "Waiting for one (not offered)"), ("recorded", "Recorded")]

    def queryset(self, request: HttpRequest, queryset: QuerySet) -> QuerySet:
        if self.value() == "waiting":
            return queryset & waiting_for_baseline()
        if self.value() == "recorded":
            return queryset.filter(baseline_at__isnull=False)
        return queryset


@admin.register(Host)
class HostAdmin(ChangesOffers):
    form = HostForm
    list_display = [
        "name",
        "machine_type",
        "location",
        "gpu",
        "driver",
        "state",
        "baseline_state",
        "fault",
    ]
    list_filter = [
        "state",
        BaselineFilter,
        "driver",
        "fault",
        ("machine_type__location", admin.RelatedOnlyFieldListFilter),
        ("machine_type__gpu", admin.RelatedOnlyFieldListFilter),
    ]
    list_select_related = ["machine_type__location", "machine_type__gpu"]
    search_fields = ["name", "address", "machine_type__slug"]
    autocomplete_fields = ["machine_type"]
    readonly_fields = [
        "state",
        "state_changed_at",
        "pristine_report",
        "baseline_at",
        "quarantined_at",
        "quarantine_reason",
    ]
    # Mark free, Reimage and Record baseline connect to the hosts, and what went wrong lately is
    # clusters' events: clusters/admin.py registers this admin again with them added.
    actions = ["mark_offline"]

    class Media:
        css = {"all": ["css/admin.css"]}  # no inline style: the CSP refuses them

    show_full_result_count = False  # the inventory can hold tens of thousands of hosts

    @admin.display(description="location", ordering="machine_type__location__code")
    def location(self, host: Host) -> str:
        return host.machine_type.location.code

    @admin.display(description="GPU", ordering="machine_type__gpu__name")
    def gpu(self, host: Host) -> str:
        return str(host.machine_type.gpu)

    @admin.display(description="baseline", ordering="baseline_at")
    def baseline_state(self, host: Host) -> str:
        if host.driver != Host.Driver.SSH:
            return "none needed"
        if host.baseline_at is None:
            return "waiting: not offered"
        return f"recorded {host.baseline_at:%Y-%m-%d %H:%M}"

    @admin.action(description="Mark offline (free hosts only)")
    def mark_offline(self, request: HttpRequest, queryset: QuerySet) -> None:
        selected = list(queryset.values_list("pk", flat=True))
        changed = take_hosts_offline(host_ids=selected)
        self._report(request, changed, len(selected), "taken offline", "were not free")

    def _report(
        self, request: HttpRequest, changed: int, selected: int, done: str, why: str
    ) -> None:
        self.message_user(request, f"{changed} host{'s' if changed != 1 else ''} {done}.")
        if changed < selected:
            self.message_user(
                request,
                f"{selected - changed} left as they were: they {why}.",
                level=messages.WARNING,
            )


class QuoteStatusForm(forms.ModelForm):
    """A row of the quote list's editable status: its select is named for the request it
    changes (the column's header is no label of it: axe's select-name)."""

    class Meta:
        model = QuoteRequest
        fields = ["status"]

    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        quote = self.instance
        who = quote.contact_name or quote.contact_email
        self.fields["status"].widget.attrs["aria-label"] = f"Status of {who}'s quote request"


@admin.register(QuoteRequest)
class QuoteRequestAdmin(admin.ModelAdmin):
    list_display = [
        "created_at",
        "status",
        "gpu",
        "nodes",
        "interconnect",
        "location",
        "start_date",
        "duration_weeks",
        "contact_name",
        "contact_email",
        "project",
    ]
    list_display_links = ["created_at"]
    list_editable = ["status"]
    list_filter = ["status", "interconnect", "gpu"]
    list_select_related = ["gpu", "location", "project"]
    search_fields = ["contact_name", "contact_email", "notes", "project__name"]
    date_hierarchy = "created_at"
    readonly_fields = ["project", "requested_by", "created_at"]
    actions = ["mark_contacted", "mark_won", "mark_lost"]

    def get_changelist_form(self, request: HttpRequest, **kwargs) -> type[forms.ModelForm]:
        return super().get_changelist_form(request, form=QuoteStatusForm, **kwargs)

    def _set_status(self, request: HttpRequest, queryset: QuerySet, status: str) -> None:
        changed = queryset.update(status=status)
        self.message_user(
            request, f"{changed} quote request{'s' if changed != 1 else ''} marked {status}."
        )

    @admin.action(description="Mark contacted")
    def mark_contacted(self, request: HttpRequest, queryset: QuerySet) -> None:
        self._set_status(request, queryset, QuoteRequest.Status.CONTACTED)

    @admin.action(description="Mark won")
    def mark_won(self, request: HttpRequest, queryset: QuerySet) -> None:
        self._set_status(request, queryset, QuoteRequest.Status.WON)

    @admin.action(description="Mark lost")
    def mark_lost(self, request: HttpRequest, queryset: QuerySet) -> None:
        self._set_status(request, queryset, QuoteRequest.Status.LOST)


@admin.register(TrackRecord)
class TrackRecordAdmin(ReadOnlyAdmin, admin.ModelAdmin):
    """What the offers show of each machine type's last 30 days, as the beat last computed it
    (clusters/track_record.py); staff read it, `manage.py refresh_track_records` redoes it."""

    list_display = [
        "machine_type",
        "clusters",
        "started",
        "withdrawn",
        "ready_median_seconds",
        "ready_p95_seconds",
        "failures_by_step",
        "bandwidth_median_mbit",
        "computed_at",
    ]
    list_select_related = ["machine_type"]
    search_fields = ["machine_type__slug"]
