from django.contrib import admin

from notifications.models import Attempt, Delivery, Endpoint


@admin.register(Endpoint)
class EndpointAdmin(admin.ModelAdmin):
    list_display = ["url", "kind", "project", "active", "failing_since", "created_at"]
    list_filter = ["kind", "active"]
    search_fields = ["url", "project__name"]
    exclude = ["secret"]  # the signing key is the customer's; staff need not read it
    raw_id_fields = ["project", "created_by"]


class AttemptInline(admin.TabularInline):
    model = Attempt
    extra = 0
    can_delete = False
    readonly_fields = ["at", "status_code", "error"]


@admin.register(Delivery)
class DeliveryAdmin(admin.ModelAdmin):
    list_display = ["event_type", "endpoint", "state", "attempts", "last_status_code", "created_at"]
    list_filter = ["state", "event_type"]
    raw_id_fields = ["endpoint", "event"]
    readonly_fields = ["body"]
    inlines = [AttemptInline]
