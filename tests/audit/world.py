"""An audit log with a bit of everything, for the page sweep (tests/runcrate/
test_pages_browser.py) and the audit page's screenshots: entries in words by a user, an API
key, staff and the system, an object still linked and one gone, changes, a refusal."""

from datetime import timedelta

from django.utils import timezone

from accounts.models import Project, User
from audit.models import Entry


def audit_day(project: Project, user: User, cluster_id: int) -> None:
    now = timezone.now()
    common = {"project": project, "user": user, "user_email": user.email, "ip": "203.0.113.7"}
    rows = [
        (
            "user",
            "dashboard",
            "invited dev@example.com as developer",
            "invitation",
            "",
            "dev@example.com",
            {"role": {"before": None, "after": "developer"}},
            "done",
        ),  # noqa: E501
        (
            "api_key",
            "cli",
            "created cluster `train-done` (2 × 8×H100, Slurm) in Columbus, Ohio",
            "cluster",
            str(cluster_id),
            "train-done",
            {},
            "done",
        ),  # noqa: E501
        (
            "api_key",
            "api",
            "revoked API key `ci`",
            "api_key",
            "999999",
            "ci",
            {"revoked": {"before": False, "after": True}},
            "done",
        ),  # noqa: E501
        (
            "user",
            "dashboard",
            "failed a two-factor code",
            "user",
            str(user.pk),
            user.email,
            {},
            "refused",
        ),  # noqa: E501
        (
            "user",
            "dashboard",
            "set the monthly budget of `default` to $750.00",
            "environment",
            "default",
            "default",
            {"monthly_budget": {"before": "500.00", "after": "750.00"}},
            "done",
        ),  # noqa: E501
        ("staff", "admin", "changed cluster in admin", "cluster", str(cluster_id), "", {}, "done"),
    ]
    for minutes, (actor, channel, summary, kind, object_id, name, changes, outcome) in enumerate(
        rows
    ):
        Entry.objects.create(
            **common,
            at=now - timedelta(minutes=60 - minutes),
            actor=actor,
            channel=channel,
            api_key_name="ci" if actor == "api_key" else "",
            action="",
            summary=summary,
            object_type=kind,
            object_id=object_id,
            object_name=name,
            changes=changes,
            outcome=outcome,
        )
