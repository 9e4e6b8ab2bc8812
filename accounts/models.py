import hashlib
import secrets
from datetime import datetime
from decimal import Decimal
from typing import ClassVar

from django.conf import settings
from django.contrib.auth.base_user import AbstractBaseUser, BaseUserManager
from django.contrib.auth.models import PermissionsMixin
from django.db import models
from django.utils import timezone
from django.utils.translation import gettext_lazy as _


class UserManager(BaseUserManager["User"]):
    use_in_migrations = True

    def _create_user(self, email: str, password: str | None, **extra: object) -> "User":
        if not email:
            raise ValueError("An email address is required.")
        user = self.model(email=self.normalize_email(email).lower(), **extra)
        user.set_password(password)
        user.save(using=self._db)
        return user

    def create_user(self, email: str, password: str | None = None, **extra: object) -> "User":
        extra.setdefault("is_staff", False)
        extra.setdefault("is_superuser", False)
        return self._create_user(email, password, **extra)

    def create_superuser(self, email: str, password: str | None = None, **extra: object) -> "User":
        extra.setdefault("is_staff", True)
        extra.setdefault("is_superuser", True)
        return self._create_user(email, password, **extra)


class User(AbstractBaseUser, PermissionsMixin):
    """A person who logs in with an email address and a password.

    Django's AbstractUser without its username and first and last names: its other fields are
    written out here as it writes them (the same columns, names and help texts, so the table and
    the migrations' state are unchanged), rather than removed from it by assigning None."""

    is_staff = models.BooleanField(
        _("staff status"),
        default=False,
        help_text=_("Designates whether the user can log into this admin site."),
    )
    is_active = models.BooleanField(
        _("active"),
        default=True,
        help_text=_(
            "Designates whether this user should be treated as active. "
            "Unselect this instead of deleting accounts."
        ),
    )
    date_joined = models.DateTimeField(_("date joined"), default=timezone.now)
    name = models.CharField(max_length=150, blank=True)
    email = models.EmailField(_("email address"), unique=True)
    two_factor_required = models.BooleanField(
        default=False,
        help_text="One of their projects requires two-factor sign-in (accounts/otp.py keeps it "
        "with the projects' and memberships' changes), read from the row every request loads.",
    )

    EMAIL_FIELD = "email"
    USERNAME_FIELD = "email"
    REQUIRED_FIELDS: ClassVar[list[str]] = []

    objects: ClassVar[UserManager] = UserManager()

    class Meta:
        verbose_name = _("user")
        verbose_name_plural = _("users")

    def clean(self) -> None:
        """As AbstractUser's: the email normalized (its domain in lower case)."""
        super().clean()
        self.email = type(self).objects.normalize_email(self.email)

    def __str__(self) -> str:
        return self.email


class Project(models.Model):
    """The billing unit: it holds the balance, the members, the environments and the keys."""

    name = models.CharField(max_length=100)
    created_at = models.DateTimeField(default=timezone.now)
    # The running total of the project's ledger, moved in the transaction that writes each
    # ledger line (billing/balances.py); `manage.py check_balances` recomputes it from the lines.
    balance = models.DecimalField(
        max_digits=14,
        decimal_places=2,
        default=Decimal("0.00"),
        db_default=Decimal("0.00"),
        editable=False,
    )
    # Set by an owner: every member must have two-factor sign-in before any other page
    # (accounts/middleware.py TwoFactorRequired; API keys are not affected).
    require_two_factor = models.BooleanField(default=False, db_default=False)
    # Set by staff (the admin): the project is offered the failure-drill locations, whose hosts
    # fail on purpose (offers/visibility.py, docs/inventory.md "Failure drills").
    drills = models.BooleanField(
        default=False,
        db_default=False,
        help_text="Offer this project the failure-drill locations (every host fails on purpose).",
    )

    def __str__(self) -> str:
        return self.name


class Membership(models.Model):
    class Role(models.TextChoices):
        OWNER = "owner"
        MANAGER = "manager"
        DEVELOPER = "developer"

    project = models.ForeignKey(Project, on_delete=models.CASCADE, related_name="memberships")
    user = models.ForeignKey(
        settings.AUTH_USER_MODEL, on_delete=models.CASCADE, related_name="memberships"
    )
    role = models.CharField(max_length=16, choices=Role.choices, default=Role.OWNER)
    created_at = models.DateTimeField(default=timezone.now)

    class Meta:
        constraints = [
            models.UniqueConstraint(fields=["project", "user"], name="membership_unique")
        ]

    def __str__(self) -> str:
        return f"{self.user} in {self.project} ({self.role})"


class Environment(models.Model):
    """A project's space for clusters, with an optional monthly budget."""

    project = models.ForeignKey(Project, on_delete=models.CASCADE, related_name="environments")
    name = models.SlugField(max_length=40)
    monthly_budget = models.DecimalField(max_digits=12, decimal_places=2, null=True, blank=True)
    created_at = models.DateTimeField(default=timezone.now)

    class Meta:
        constraints = [
            models.UniqueConstraint(fields=["project", "name"], name="environment_unique_name")
        ]
        ordering = ["name"]

    def __str__(self) -> str:
        return self.name


class SshKey(models.Model):
    """An OpenSSH public key the project's clusters accept."""

    project = models.ForeignKey(Project, on_delete=models.CASCADE, related_name="ssh_keys")
    created_by = models.ForeignKey(
        settings.AUTH_USER_MODEL, null=True, on_delete=models.SET_NULL, related_name="+"
    )
    name = models.CharField(max_length=100)
    public_key = models.TextField()
    fingerprint = models.CharField(max_length=100)
    created_at = models.DateTimeField(default=timezone.now)

    class Meta:
        constraints = [
            models.UniqueConstraint(
                fields=["project", "fingerprint"], name="sshkey_unique_fingerprint"
            )
        ]
        ordering = ["name", "pk"]

    def __str__(self) -> str:
        return self.name

    @property
    def key_type(self) -> str:
        """`ssh-ed25519`, `ssh-rsa`, …: the first word of the OpenSSH line."""
        return self.public_key.split(" ", 1)[0]


API_KEY_PREFIX = "rc_live_"


def hash_api_key(raw: str) -> str:
    return hashlib.sha256(raw.encode()).hexdigest()


class ApiKey(models.Model):
    """A bearer key for the API. Only its hash is kept; the key is shown once.

    A key may be narrowed for an agent: `scopes` (none stored: every scope, as for keys made
    before scopes existed) and limits the server enforces on what it creates (docs/api.md).
    """

    class Scope(models.TextChoices):
        READ = "read", "Read: list and show everything"
        CREATE = "create", "Create: clusters, workers, volumes, SSH keys, tests, quotes"
        TERMINATE = "terminate", "Terminate: clusters; delete volumes and SSH keys"
        BILLING = "billing", "Billing: balance, usage, the ledger, budgets"

    project = models.ForeignKey(Project, on_delete=models.CASCADE, related_name="api_keys")
    user = models.ForeignKey(
        settings.AUTH_USER_MODEL, on_delete=models.CASCADE, related_name="api_keys"
    )
    name = models.CharField(max_length=100)
    prefix = models.CharField(max_length=16, help_text="The first characters, to tell keys apart.")
    key_hash = models.CharField(max_length=64, unique=True)
    scopes = models.JSONField(
        default=list, blank=True, help_text="Scope names the key holds; empty: every scope."
    )
    max_machines_per_cluster = models.PositiveSmallIntegerField(
        null=True, blank=True, help_text="At most this many machines in a cluster it creates."
    )
    max_usd_per_hour = models.DecimalField(
        max_digits=10,
        decimal_places=2,
        null=True,
        blank=True,
        help_text="At most this many USD per hour across the live clusters it created.",
    )
    created_at = models.DateTimeField(default=timezone.now)
    last_used_at = models.DateTimeField(null=True, blank=True)
    revoked_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        ordering = ["-created_at", "-pk"]

    def __str__(self) -> str:
        return f"{self.name} ({self.prefix}…)"

    @property
    def is_active(self) -> bool:
        return self.revoked_at is None

    @property
    def granted_scopes(self) -> list[str]:
        """The scopes it holds, in the order of `Scope`."""
        if not self.scopes:
            return list(ALL_SCOPES)
        held = set(self.scopes)
        return [scope for scope in ALL_SCOPES if scope in held]

    def has_scope(self, scope: str) -> bool:
        return scope in self.granted_scopes

    @property
    def has_limits(self) -> bool:
        return self.max_machines_per_cluster is not None or self.max_usd_per_hour is not None

    @property
    def is_unrestricted(self) -> bool:
        """Every scope and no limit: what managing keys needs (a narrowed key cannot widen)."""
        return len(self.granted_scopes) == len(ALL_SCOPES) and not self.has_limits

    @staticmethod
    def generate() -> str:
        return API_KEY_PREFIX + secrets.token_urlsafe(32)


# Every scope, in order, read once: `Scope.values` rebuilds the list from the enum on each
# read (about 30 µs), and every API call checks a scope.
ALL_SCOPES = tuple(ApiKey.Scope.values)


class UnforgottenKey(models.Model):
    """An API key whose cached copy could not be forgotten: the cache did not answer when the
    key was revoked, its user deactivated or removed. While a row younger than the cache's 30 s
    is here, no cached key is served without first forgetting it for good (accounts/keys.py,
    "fail closed"); rows are deleted once that is done."""

    key_hash = models.CharField(max_length=64)
    failed_at = models.DateTimeField(default=timezone.now, db_index=True)

    def __str__(self) -> str:
        return f"{self.key_hash[:12]}… at {self.failed_at:%Y-%m-%d %H:%M:%S}"


class Invitation(models.Model):
    """An email invited into a project with a role. The link carries a random token; only its
    hash is kept (as for API keys), so the table alone opens nothing. Single use: accepting
    stamps `accepted_at`; revoking deletes the row (accounts/invitations.py)."""

    project = models.ForeignKey(Project, on_delete=models.CASCADE, related_name="invitations")
    email = models.EmailField()
    role = models.CharField(max_length=16, choices=Membership.Role.choices)
    invited_by = models.ForeignKey(
        settings.AUTH_USER_MODEL, null=True, on_delete=models.SET_NULL, related_name="+"
    )
    token_hash = models.CharField(max_length=64, unique=True)
    created_at = models.DateTimeField(default=timezone.now)
    expires_at = models.DateTimeField()
    accepted_at = models.DateTimeField(null=True, blank=True)
    accepted_by = models.ForeignKey(
        settings.AUTH_USER_MODEL,
        null=True,
        blank=True,
        on_delete=models.SET_NULL,
        related_name="+",
    )

    class Meta:
        ordering = ["-created_at", "-pk"]

    def __str__(self) -> str:
        return f"{self.email} to {self.project} ({self.role})"

    def is_pending(self, *, now: datetime) -> bool:
        return self.accepted_at is None and now < self.expires_at
