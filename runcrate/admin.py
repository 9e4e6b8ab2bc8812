"""What the apps' admins share."""

from django.http import HttpRequest


class ReadOnlyAdmin:
    """Staff may look, never add, change or delete: the rows belong to a process that keeps
    them (the lifecycle, the payments). Mixed into a ModelAdmin or an inline, before it."""

    def has_add_permission(self, request: HttpRequest, obj=None) -> bool:
        return False

    def has_change_permission(self, request: HttpRequest, obj=None) -> bool:
        return False

    def has_delete_permission(self, request: HttpRequest, obj=None) -> bool:
        return False
