from collections.abc import Sequence
from typing import TYPE_CHECKING, ClassVar, TypedDict

from django import forms
from django.contrib import admin, messages
from django.contrib.admin.options import InlineModelAdmin
from django.contrib.auth.admin import UserAdmin as DjangoUserAdmin
from django.contrib.auth.forms import AdminUserCreationForm, UserChangeForm
from django.db.models import Count, QuerySet
from django.forms.models import BaseInlineFormSet
from django.http import HttpRequest

from accounts import keys, permissions
from accounts import members as rules  # who may leave a project (ProjectAdmin has `members`)
from accounts.forms import AdminLoginForm
from accounts.models import ApiKey, Environment, Membership, Project, SshKey, User
from accounts.projects import create_project
from accounts.signup import normalize_email, project_name_for
from runcrate.admin import money_column

if TYPE_CHECKING:
    from django_stubs_ext import WithAnnotations

# The admin's login page counts failures like the dashboard's (accounts/throttle.py).
admin.site.login_form = AdminLoginForm


class UserCreateForm(AdminUserCreationForm):
    class Meta:
        model = User
        fields = ("email",)

    def clean_email(self) -> str:
        email = normalize_email(self.cleaned_data["email"])
        if User.objects.filter(email__iexact=email).exists():
            raise forms.ValidationError("A user with this email already exists.")
        return email


class UserEditForm(UserChangeForm):
    class Meta:
        model = User
        fields = "__all__"

    def clean_email(self) -> str:
        email = normalize_email(self.cleaned_data["email"])
        if User.objects.filter(email__iexact=email).exclude(pk=self.instance.pk).exists():
            raise forms.ValidationError("A user with this email already exists.")
        return email


def _kept(form) -> bool:
    """Whether an inline row stays: filled in, and not ticked for deletion."""
    cleaned = getattr(form, "cleaned_data", None) or {}
    return bool(cleaned) and not cleaned.get("DELETE") and (form.instance.pk or form.has_changed())


class UserMembershipsFormSet(BaseInlineFormSet):
    """A user's memberships: removing or demoting the only owner of a project, or moving that
    membership to another project, is refused (accounts/members.py)."""

    def clean(self) -> None:
        super().clean()
        # As saved: a validated form has already copied its new values onto its instance.
        saved = [form.instance.pk for form in self.forms if form.instance.pk]
        originals = Membership.objects.select_related("project").in_bulk(saved)
        for form in self.forms:
            before = originals.get(form.instance.pk)
            if before is None or before.role != rules.OWNER:
                continue
            after = form.cleaned_data if _kept(form) else {}
            still_owner = after.get("role") == rules.OWNER
            if still_owner and after.get("project") == before.project:
                continue
            if not rules.has_another_owner(before.project, than=before.user_id):
                try:
                    rules.check_keeps_an_owner(before.project, owners_after=[])
                except rules.MembershipRefused as refusal:
                    raise forms.ValidationError(refusal.message) from None


class ProjectMembershipsFormSet(BaseInlineFormSet):
    """A project's members: at least one stays an owner, a new project included."""

    def clean(self) -> None:
        super().clean()
        owners = [
            form.cleaned_data["user"].pk
            for form in self.forms
            if _kept(form) and form.cleaned_data.get("role") == rules.OWNER
        ]
        try:
            rules.check_keeps_an_owner(self.instance, owners_after=owners)
        except rules.MembershipRefused as refusal:
            raise forms.ValidationError(refusal.message) from None


class MembershipInline(admin.TabularInline):
    model = Membership
    extra = 0
    autocomplete_fields: ClassVar[tuple[str, ...]] = ("user", "project")
    formset: type[BaseInlineFormSet] = UserMembershipsFormSet
    readonly_fields = ("may",)

    @admin.display(description="May (the permission table)")
    def may(self, obj: Membership) -> str:
        """What the saved role allows, from accounts/permissions.py: what staff grant by
        choosing a role."""
        return ", ".join(permissions.abilities_of(obj.role)) if obj.pk else "-"


@admin.register(User)
class UserAdmin(DjangoUserAdmin):
    """Django's user admin, with the email as the login instead of a username."""

    form = UserEditForm
    add_form = UserCreateForm
    fieldsets = (
        (None, {"fields": ("email", "password")}),
        ("Profile", {"fields": ("name",)}),
        (
            "Permissions",
            {"fields": ("is_active", "is_staff", "is_superuser", "groups", "user_permissions")},
        ),
        ("Important dates", {"fields": ("last_login", "date_joined")}),
    )
    add_fieldsets = (
        (
            None,
            {
                "classes": ("wide",),
                "fields": ("email", "usable_password", "password1", "password2"),
                "description": "The user gets a project of their own, as at sign-up.",
            },
        ),
    )
    list_display = ("email", "name", "is_staff", "is_active", "date_joined", "last_login")
    list_filter = ("is_staff", "is_superuser", "is_active")
    search_fields = ("email", "name")
    ordering = ("email",)
    readonly_fields = ("last_login", "date_joined")
    inlines = (MembershipInline,)

    def get_inlines(
        self, request: HttpRequest, obj: User | None
    ) -> tuple[type[InlineModelAdmin], ...]:
        return tuple(self.inlines) if obj is not None else ()

    def save_model(
        self, request: HttpRequest, obj: User, form: forms.ModelForm, change: bool
    ) -> None:
        super().save_model(request, obj, form, change)
        if not change and not obj.memberships.exists():
            create_project(owner=obj, name=project_name_for(obj))

    def get_deleted_objects(
        self, objs: Sequence[User] | QuerySet[User], request: HttpRequest
    ) -> tuple[list[str], dict[str, int], set[str], list[str]]:
        """Django's delete screens refuse while anything is "protected": the reasons a user
        may not go (live clusters, a project left with no owner) are listed there."""
        deleted, counts, perms_needed, protected = super().get_deleted_objects(objs, request)
        reasons = [reason for user in objs for reason in rules.reasons_to_keep_user(user)]
        return deleted, counts, perms_needed, [*protected, *reasons]

    def delete_model(self, request: HttpRequest, obj: User) -> None:
        rules.delete_users([obj])

    def delete_queryset(self, request: HttpRequest, queryset: QuerySet[User]) -> None:
        rules.delete_users(list(queryset))


class EnvironmentInline(admin.TabularInline):
    model = Environment
    extra = 0
    fields = ("name", "monthly_budget", "created_at")


class ProjectMembershipInline(MembershipInline):
    autocomplete_fields = ("user",)
    formset = ProjectMembershipsFormSet


class _MemberCount(TypedDict):
    member_count: int  # ProjectAdmin.get_queryset's annotation


@admin.register(Project)
class ProjectAdmin(admin.ModelAdmin):
    """Billing registers it again with its "Add credit" action (billing/admin.py): an app adds to
    a lower app's admin, never the other way round."""

    list_display = ("name", "members", money_column("balance", "balance"), "created_at")
    search_fields = ("name", "memberships__user__email")
    inlines = (ProjectMembershipInline, EnvironmentInline)

    def get_queryset(self, request: HttpRequest) -> QuerySet[Project]:
        return super().get_queryset(request).annotate(member_count=Count("memberships"))

    @admin.display(ordering="member_count")
    def members(self, obj: "WithAnnotations[Project, _MemberCount]") -> int:
        return obj.member_count


@admin.register(ApiKey)
class ApiKeyAdmin(admin.ModelAdmin):
    """Keys are issued on the account page or with `manage.py issue_api_key`, where the raw
    key can be shown once; here staff only look and revoke."""

    list_display = ("name", "prefix", "project", "user", "created_at", "last_used_at", "revoked_at")
    list_filter = (("revoked_at", admin.EmptyFieldListFilter),)
    search_fields = ("name", "prefix", "user__email", "project__name")
    list_select_related = ("project", "user")
    fields = (
        "name",
        "project",
        "user",
        "prefix",
        "key_hash",
        "scopes",
        "max_machines_per_cluster",
        "max_usd_per_hour",
        "created_at",
        "last_used_at",
        "revoked_at",
    )
    readonly_fields = (
        "project",
        "user",
        "prefix",
        "key_hash",
        "scopes",
        "max_machines_per_cluster",
        "max_usd_per_hour",
        "created_at",
        "last_used_at",
        "revoked_at",
    )
    actions = ("revoke",)

    def has_add_permission(self, request: HttpRequest) -> bool:
        return False

    @admin.action(description="Revoke the selected API keys")
    def revoke(self, request: HttpRequest, queryset: QuerySet[ApiKey]) -> None:
        revoked = sum(keys.revoke_api_key(key=key) for key in queryset)
        self.message_user(request, f"Revoked {revoked} API key(s).", messages.SUCCESS)


@admin.register(SshKey)
class SshKeyAdmin(admin.ModelAdmin):
    """SSH keys are validated when added (account page, API); staff look, rename, remove."""

    list_display = ("name", "project", "key_type", "fingerprint", "created_by", "created_at")
    search_fields = ("name", "fingerprint", "project__name", "created_by__email")
    list_select_related = ("project", "created_by")
    fields = ("name", "project", "created_by", "fingerprint", "public_key", "created_at")
    readonly_fields = ("project", "created_by", "fingerprint", "public_key", "created_at")

    def has_add_permission(self, request: HttpRequest) -> bool:
        return False
