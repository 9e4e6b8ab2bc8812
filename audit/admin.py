"""The audit log in admin: read-only, as everywhere (append-only: no add, change or delete)."""

from django.contrib import admin
from django.http import HttpRequest

from audit.models import Entry


@admin.register(Entry)
class EntryAdmin(admin.ModelAdmin):
    list_display = ["at", "project", "actor", "user_email", "api_key_name", "channel", "summary"]
    list_filter = ["actor", "channel"]
    search_fields = ["user_email", "api_key_name", "action", "summary", "object_name", "path"]
    date_hierarchy = "at"

    def has_add_permission(self, request: HttpRequest) -> bool:
        return False

    def has_change_permission(self, request: HttpRequest, obj: object = None) -> bool:
        return False

    def has_delete_permission(self, request: HttpRequest, obj: object = None) -> bool:
        return False
