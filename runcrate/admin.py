"""What the apps' admins share."""

from collections.abc import Callable
from typing import Any

from django.contrib import admin
from django.http import HttpRequest

from runcrate.money import usd


class ReadOnlyAdmin:
    """Staff may look, never add, change or delete: the rows belong to a process that keeps
    them (the lifecycle, the payments). Mixed into a ModelAdmin or an inline, before it."""

    def has_add_permission(self, request: HttpRequest, obj=None) -> bool:
        return False

    def has_change_permission(self, request: HttpRequest, obj=None) -> bool:
        return False

    def has_delete_permission(self, request: HttpRequest, obj=None) -> bool:
        return False


def money_column(field: str, description: str, *, format: Callable[[Any], str] = usd) -> Callable:
    """A list_display column printing the model's `field` as runcrate/money.py prints amounts
    ($1,234.50), still sortable by the field."""

    @admin.display(description=description, ordering=field)
    def column(obj: Any) -> str:
        return format(getattr(obj, field))

    column.__name__ = f"{field}_money"
    return column
