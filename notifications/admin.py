from django.contrib import admin
from django.http import HttpRequest

from notifications.models import Attempt, Delivery, Endpoint


@admin.register(Endpoint)
class EndpointAdmin(admin.ModelAdmin):
    list_display = ["url", "kind", "project", "active", "failing_since", "created_at"]
    list_filter = ["kind", "active"]
    search_fields = ["url", "project__name"]
    exclude = ["secret"]  # the signing key is the customer's; staff need not read it
    raw_id_fields = ["project", "created_by"]
    # The URL is checked where endpoints are made (notifications/endpoints.py, the API), so
    # staff switch one off or remove it here, and neither add one nor change where it points.
    readonly_fields = ["url", "kind", "failing_since", "created_at"]

    def has_add_permission(self, request: HttpRequest) -> bool:
        return False


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
