"""Staff's Clusters section: clusters with their nodes and events, nodes, volumes, and quoted
clusters (SPEC §7).

Everything here is read-only: a cluster, its nodes and its events belong to the lifecycle,
which alone changes them. Staff act through it: "Terminate" calls `lifecycle.terminate`,
"Add cluster" is the quoted-cluster form, which calls `lifecycle.create_cluster` with the
agreed terms, and "Take the host offline" calls `offers.inventory.take_hosts_offline`, the
function the hosts' own admin uses. docs/inventory.md describes these screens.
"""

from decimal import Decimal
from typing import TYPE_CHECKING, ClassVar, TypedDict

from django import forms
from django.contrib import admin, messages
from django.core.exceptions import PermissionDenied
from django.db.models import Count, Q, QuerySet
from django.http import HttpRequest, HttpResponse, HttpResponseRedirect
from django.shortcuts import render
from django.urls import reverse
from django.utils.html import format_html, format_html_join

from accounts.models import Environment, User
from accounts.projects import DEFAULT_ENVIRONMENT
from clusters import lifecycle
from clusters.errors import ClusterRefused
from clusters.machines import hosts
from clusters.models import NAME_RE, QUOTED_MAX_NODES, Cluster, Event, Node, Volume
from offers.admin import HostAdmin as OffersHostAdmin
from offers.admin import QuoteRequestAdmin as OffersQuoteRequestAdmin
from offers.inventory import take_hosts_offline
from offers.models import MIN_NODES, Host, MachineType, QuoteRequest
from runcrate.admin import ReadOnlyAdmin, money_column
from runcrate.money import usd, usd_per_hour, usd_rate

if TYPE_CHECKING:
    from django_stubs_ext import WithAnnotations


# ---- the quoted-cluster form -----------------------------------------------------------------


class _QuoteChoice(forms.ModelChoiceField):
    def label_from_instance(self, quote: QuoteRequest) -> str:
        return (
            f"#{quote.pk} {quote.project.name}: {quote.nodes} × {quote.gpu.name}, "
            f"{quote.get_interconnect_display()} ({quote.contact_email})"
        )


class _MachineTypeChoice(forms.ModelChoiceField):
    def label_from_instance(self, machine_type: MachineType) -> str:
        listed = "" if machine_type.is_self_serve else ", not self-serve"
        return (
            f"{machine_type.slug}: {machine_type.gpus_per_machine}× {machine_type.gpu.name}, "
            f"{machine_type.get_interconnect_display()}{listed}, list "
            f"{usd_per_hour(machine_type.price_per_hour)}"
        )


class QuotedClusterForm(forms.Form):
    """A cluster for a won quote's project, on any machine type, at an agreed price."""

    quote = _QuoteChoice(
        queryset=QuoteRequest.objects.filter(status=QuoteRequest.Status.WON)
        .select_related("project", "gpu")
        .order_by("-created_at", "-pk"),
        help_text="A won quote request; the cluster is created in its project.",
    )
    machine_type = _MachineTypeChoice(
        queryset=MachineType.objects.select_related("location", "gpu").order_by("slug"),
        help_text="Any machine type, InfiniBand and RoCE included; its hosts must be free now.",
    )
    nodes = forms.IntegerField(
        min_value=MIN_NODES,
        max_value=QUOTED_MAX_NODES,
        help_text=f"{MIN_NODES} to {QUOTED_MAX_NODES} machines (the private network's addresses): "
        "past the self-serve limit too.",
    )
    agreed_price_per_machine_hour = forms.DecimalField(
        label="Agreed price per machine-hour",
        min_value=Decimal("0.01"),
        max_digits=10,
        decimal_places=2,
        help_text="USD per machine-hour, as agreed; billed instead of the machine type's price.",
    )
    name = forms.CharField(
        max_length=63, help_text="A DNS label: lowercase letters, digits and hyphens."
    )
    software = forms.ChoiceField(choices=Cluster.Software.choices, initial=Cluster.Software.NONE)
    environment = forms.CharField(
        max_length=40,
        initial=DEFAULT_ENVIRONMENT,
        help_text="The name of one of the project's environments.",
    )

    # Where a refusal of the lifecycle is shown: its `field`, in this form's names.
    REFUSAL_FIELDS = {"offer": "machine_type", "count": "nodes"}

    def clean_name(self) -> str:
        name = self.cleaned_data["name"].strip()
        if not NAME_RE.fullmatch(name):
            raise forms.ValidationError(
                "A cluster name is a DNS label: 1-63 lowercase letters, digits and hyphens, "
                "starting and ending with a letter or digit."
            )
        return name

    def clean(self):
        cleaned = super().clean()
        quote, name = cleaned.get("quote"), cleaned.get("environment")
        if quote is not None and name:
            environment = Environment.objects.filter(project=quote.project, name=name).first()
            if environment is None:
                self.add_error("environment", f"{quote.project.name} has no environment {name!r}.")
            cleaned["environment"] = environment
        return cleaned

    def show_refusal(self, refused: ClusterRefused) -> None:
        field = self.REFUSAL_FIELDS.get(refused.field or "", refused.field)
        self.add_error(field if field in self.fields else None, refused.message_for(staff=True))


def initial_for(quote: QuoteRequest | None) -> dict:
    """The form as a won quote prefills it: its size, and its machine type when the quote's GPU,
    interconnect and location name exactly one."""
    if quote is None:
        return {}
    initial = {"quote": quote.pk, "nodes": quote.nodes, "name": f"quote-{quote.pk}"}
    types = MachineType.objects.filter(gpu=quote.gpu, interconnect=quote.interconnect)
    if quote.location_id:
        types = types.filter(location=quote.location_id)
    matching = list(types.values_list("pk", flat=True)[:2])
    if len(matching) == 1:
        initial["machine_type"] = matching[0]
    return initial


# ---- clusters --------------------------------------------------------------------------------


class NodeInline(ReadOnlyAdmin, admin.TabularInline):
    """The cluster's nodes as the lifecycle left them: read-only, a step is never set by hand."""

    model = Node
    extra = 0
    can_delete = False
    show_change_link = False
    # A tuple of names, which both fields and readonly_fields may be.
    fields: ClassVar[tuple[str, ...]] = (
        "index",
        "status",
        "step",
        "host_link",
        "holds_host",
        "is_worker",
        "step_started_at",
        "step_deadline",
        "heartbeat_at",
        "ended_at",
    )
    readonly_fields = fields

    def get_queryset(self, request: HttpRequest) -> QuerySet:
        return super().get_queryset(request).select_related("host").order_by("index", "pk")

    @admin.display(description="host")
    def host_link(self, node: Node) -> str:
        if node.host is None:
            return "—"
        url = reverse("admin:offers_host_change", args=[node.host_id])
        return format_html('<a href="{}">{}</a> ({})', url, node.host.name, node.host.state)


class EventInline(ReadOnlyAdmin, admin.TabularInline):
    """The cluster's history, staff-only events (a failed wipe) included."""

    model = Event
    extra = 0
    can_delete = False
    fields: ClassVar[tuple[str, ...]] = ("at", "reason", "node", "step", "message", "output")
    readonly_fields = fields

    def get_queryset(self, request: HttpRequest) -> QuerySet:
        return super().get_queryset(request).select_related("node").order_by("at", "pk")


class QuotedFilter(admin.SimpleListFilter):
    title = "quoted"
    parameter_name = "quoted"

    def lookups(self, request, model_admin):
        return [("yes", "Quoted"), ("no", "Self-serve")]

    def queryset(self, request, queryset):
        if self.value() == "yes":
            return queryset.filter(quote__isnull=False)
        if self.value() == "no":
            return queryset.filter(quote__isnull=True)
        return queryset


class _MachinesUp(TypedDict):
    machines_up: int  # ClusterAdmin.get_queryset's annotation


@admin.register(Cluster)
class ClusterAdmin(admin.ModelAdmin):
    list_display = [
        "name",
        "project",
        "status",
        "machine_type",
        "location",
        "machines",
        "price_per_machine_hour",
        "quoted",
        "created_at",
    ]
    list_filter = [
        "status",
        ("machine_type__location", admin.RelatedOnlyFieldListFilter),
        QuotedFilter,
        "software",
    ]
    list_select_related = ["project", "machine_type__location", "machine_type__gpu"]
    search_fields = ["name", "project__name"]
    date_hierarchy = "created_at"
    show_full_result_count = False
    inlines = [NodeInline, EventInline]
    actions = ["terminate"]
    fieldsets = [
        (
            None,
            {
                "fields": [
                    "name",
                    "project",
                    "environment",
                    "status",
                    "machine_type",
                    "size",
                    "software",
                    "created_by",
                    "created_by_key",
                ]
            },
        ),
        ("Quoted", {"fields": ["quote", "agreed_price_per_machine_hour"]}),
        ("Times", {"fields": ["created_at", "joined_at", "ready_at", "ended_at", "give_up_at"]}),
        (
            "What went wrong",
            {
                "fields": [
                    "failure_reason",
                    "failure_node",
                    "failure_step",
                    "failure_message",
                    "stop_reason",
                    "install_attempts",
                ]
            },
        ),
    ]

    class Media:
        css = {"all": ["css/admin.css"]}

    def get_queryset(self, request: HttpRequest) -> QuerySet:
        return (
            super()
            .get_queryset(request)
            .annotate(machines_up=Count("nodes", filter=Q(nodes__status__in=Node.LIVE)))
        )

    def has_change_permission(self, request: HttpRequest, obj=None) -> bool:
        return False  # the lifecycle owns every field: its actions are the only changes

    def has_delete_permission(self, request: HttpRequest, obj=None) -> bool:
        return False  # a cluster's usage and ledger lines refer to it

    def has_terminate_permission(self, request: HttpRequest) -> bool:
        return request.user.has_perm("clusters.change_cluster")

    @admin.display(description="location", ordering="machine_type__location__code")
    def location(self, cluster: Cluster) -> str:
        return cluster.machine_type.location.code

    @admin.display(description="machines")
    def machines(self, cluster: "WithAnnotations[Cluster, _MachinesUp]") -> str:
        return f"{cluster.machines_up} of {cluster.size}" if cluster.is_live else str(cluster.size)

    @admin.display(description="per machine-hour")
    def price_per_machine_hour(self, cluster: Cluster) -> str:
        return usd(cluster.price_per_machine_hour)

    @admin.display(description="quoted", boolean=True, ordering="quote")
    def quoted(self, cluster: Cluster) -> bool:
        return cluster.is_quoted

    @admin.action(description="Terminate the selected clusters", permissions=["terminate"])
    def terminate(self, request: HttpRequest, queryset: QuerySet) -> None:
        assert isinstance(request.user, User)  # the admin is for signed-in staff
        done, refused = [], []
        for cluster in queryset.order_by("pk"):
            try:
                lifecycle.terminate(cluster=cluster, user=request.user)
            except ClusterRefused as refusal:
                refused.append(f"{cluster.name}: {refusal.message_for(staff=True)}")
            else:
                done.append(cluster.name)
                self.log_change(request, cluster, "Terminated from admin.")
        if done:
            self.message_user(
                request,
                f"Terminating {len(done)} cluster{'s' if len(done) != 1 else ''}: "
                f"{', '.join(done)}. The lifecycle stops and wipes every machine.",
            )
        for line in refused:
            self.message_user(request, f"Left as it was — {line}", level=messages.WARNING)

    def add_view(self, request: HttpRequest, form_url="", extra_context=None) -> HttpResponse:
        """'Add cluster' is the quoted-cluster form: staff create clusters only from a won quote,
        and only through the lifecycle's create."""
        if not self.has_add_permission(request):
            raise PermissionDenied
        if request.method == "POST":
            form = QuotedClusterForm(request.POST)
            if form.is_valid():
                cluster = self._create_quoted(request, form)
                if cluster is not None:
                    return HttpResponseRedirect(
                        reverse("admin:clusters_cluster_change", args=[cluster.pk])
                    )
        else:
            quote = None
            quote_id = request.GET.get("quote", "")
            if quote_id.isdigit():
                quote = QuoteRequest.objects.filter(pk=int(quote_id)).select_related("gpu").first()
            form = QuotedClusterForm(initial=initial_for(quote))
        context = {
            **self.admin_site.each_context(request),
            "title": "Create a quoted cluster",
            "form": form,
            "opts": self.model._meta,
        }
        return render(request, "admin/clusters/cluster/quoted_add.html", context)

    def _create_quoted(self, request: HttpRequest, form: QuotedClusterForm) -> Cluster | None:
        data = form.cleaned_data
        quote = data["quote"]
        try:
            cluster = lifecycle.create_cluster(
                project=quote.project,
                user=quote.requested_by,
                environment=data["environment"],
                offer_slug=data["machine_type"].slug,
                nodes=data["nodes"],
                name=data["name"],
                software=data["software"],
                quoted=lifecycle.Quoted(
                    quote=quote, price_per_machine_hour=data["agreed_price_per_machine_hour"]
                ),
            )
        except ClusterRefused as refusal:
            form.show_refusal(refusal)
            return None
        self.log_addition(request, cluster, f"Quoted cluster from quote request {quote.pk}.")
        self.message_user(
            request,
            f"Created {cluster.name} for {quote.project.name}: {cluster.size} × "
            f"{cluster.machine_type.slug} reserved, billed at the agreed "
            f"{usd(cluster.agreed_price_per_machine_hour)} per machine-hour once they join.",
            messages.SUCCESS,
        )
        return cluster


@admin.action(description="Create a quoted cluster from the selected won quote")
def create_quoted_cluster(
    modeladmin: admin.ModelAdmin, request: HttpRequest, queryset: QuerySet[QuoteRequest]
):
    """An action for the QuoteRequest admin: opens the quoted-cluster form for one won quote."""
    if queryset.count() != 1:
        modeladmin.message_user(request, "Select exactly one quote request.", messages.WARNING)
        return None
    quote = queryset.get()
    if quote.status != QuoteRequest.Status.WON:
        modeladmin.message_user(
            request,
            f"Quote request {quote.pk} is {quote.status}: mark it won first.",
            messages.WARNING,
        )
        return None
    return HttpResponseRedirect(f"{reverse('admin:clusters_cluster_add')}?quote={quote.pk}")


class QuoteRequestAdmin(OffersQuoteRequestAdmin):
    """Offers' quote requests with clusters' action: offers sits below clusters, so clusters
    registers offers' admin again with what it adds."""

    actions = [*OffersQuoteRequestAdmin.actions, create_quoted_cluster]


admin.site.unregister(QuoteRequest)
admin.site.register(QuoteRequest, QuoteRequestAdmin)


# ---- hosts between tenants: verified before they go back (clusters/machines/hosts.py) ------------


def _host_outcome(admin_site, request: HttpRequest, outcome, done: str) -> None:
    count = len(outcome.done)
    admin_site.message_user(request, f"{count} host{'s' if count != 1 else ''} {done}.")
    for name, why in list(outcome.refused.items())[:20]:
        admin_site.message_user(request, f"Left {name} as it was: {why}.", level=messages.WARNING)


@admin.action(description="Mark free (offline or dirty hosts, once verified pristine)")
def mark_free(modeladmin, request: HttpRequest, queryset: QuerySet) -> None:
    """Staff's Mark free runs the same verification as a release: an ssh host goes free only
    when nothing differs from its baseline (a host that went offline could not be wiped)."""
    outcome = hosts.return_to_service(queryset.values_list("pk", flat=True))
    _host_outcome(modeladmin, request, outcome, "marked free")


@admin.action(description="Reimage, verify and free (dirty or offline ssh hosts)")
def reimage(modeladmin, request: HttpRequest, queryset: QuerySet) -> None:
    outcome = hosts.reimage_now(queryset.values_list("pk", flat=True)[:20])
    _host_outcome(modeladmin, request, outcome, "reimaged, found pristine and freed")


@admin.action(description="Record baseline (freshly imaged ssh hosts)")
def record_baseline(modeladmin, request: HttpRequest, queryset: QuerySet) -> None:
    outcome = hosts.record_baselines(queryset.values_list("pk", flat=True)[:50])
    _host_outcome(modeladmin, request, outcome, "recorded as their baseline")


class HostAdmin(OffersHostAdmin):
    """Offers' host admin with what clusters know of a host: the actions that connect to it
    (clusters/machines/hosts.py) and the staff events of its nodes."""

    actions = [*OffersHostAdmin.actions, mark_free, reimage, record_baseline]
    readonly_fields = [*OffersHostAdmin.readonly_fields, "what_went_wrong"]

    # Events for staff about this host: a host key it offered instead of the pinned one, a
    # wipe that failed. The newest few, with their output (the offered key, the leftovers).
    STAFF_REASONS = ("host_key_mismatch", "release_failed")

    @admin.display(description="What went wrong lately")
    def what_went_wrong(self, host: Host) -> str:
        events = Event.objects.filter(node__host=host, reason__in=self.STAFF_REASONS).order_by(
            "-at"
        )[:5]
        if not events:
            return "Nothing."
        return format_html_join(
            "",
            '<p><strong>{}</strong> <code>{}</code>: {}</p><pre class="staff-output">{}</pre>',
            ((f"{e.at:%Y-%m-%d %H:%M:%S} UTC", e.reason, e.message, e.output) for e in events),
        )


admin.site.unregister(Host)
admin.site.register(Host, HostAdmin)


# ---- nodes: where a host is taken offline ----------------------------------------------------


@admin.register(Node)
class NodeAdmin(ReadOnlyAdmin, admin.ModelAdmin):
    list_display = ["__str__", "cluster", "project", "status", "step", "host", "host_state"]
    list_filter = [
        "status",
        "step",
        ("cluster__machine_type__location", admin.RelatedOnlyFieldListFilter),
    ]
    list_select_related = ["cluster__project", "host"]
    search_fields = ["cluster__name", "cluster__project__name", "host__name"]
    ordering = ["-cluster_id", "index"]  # the newest clusters first
    show_full_result_count = False
    actions = ["take_host_offline"]

    def has_offline_permission(self, request: HttpRequest) -> bool:
        return request.user.has_perm("offers.change_host")

    @admin.display(description="project", ordering="cluster__project__name")
    def project(self, node: Node) -> str:
        return node.cluster.project.name

    @admin.display(description="host state", ordering="host__state")
    def host_state(self, node: Node) -> str:
        return node.host.state if node.host else "—"

    @admin.action(description="Take the host offline (once released)", permissions=["offline"])
    def take_host_offline(self, request: HttpRequest, queryset: QuerySet) -> None:
        """The hosts of the selected nodes go offline if they are free; a host its node still
        holds is the lifecycle's until released, and is left alone (say so)."""
        host_ids = list(queryset.exclude(host=None).values_list("host_id", flat=True).distinct())
        changed = take_hosts_offline(host_ids=host_ids)
        self.message_user(request, f"{changed} host{'s' if changed != 1 else ''} taken offline.")
        held = Host.objects.filter(pk__in=host_ids).exclude(
            state__in=[Host.State.FREE, Host.State.OFFLINE]
        )
        if held.exists():
            names = ", ".join(held.order_by("name").values_list("name", flat=True)[:10])
            self.message_user(
                request,
                f"Left as they were, still held by a cluster: {names}. Terminate the cluster (or "
                "wait for it to end): the lifecycle wipes and frees them, then take them offline.",
                level=messages.WARNING,
            )


# ---- volumes ---------------------------------------------------------------------------------


@admin.register(Volume)
class VolumeAdmin(ReadOnlyAdmin, admin.ModelAdmin):
    """Volumes are created, attached and deleted by their users (clusters/volumes.py)."""

    list_display = [
        "name",
        "project",
        "location",
        "size_gb",
        money_column("price_per_gb_month", "per GB-month", format=usd_rate),
        "cluster",
        "created_at",
        "deleted_at",
    ]
    list_filter = [("deleted_at", admin.EmptyFieldListFilter), "location"]
    list_select_related = ["project", "location", "cluster"]
    search_fields = ["name", "project__name"]
    show_full_result_count = False
