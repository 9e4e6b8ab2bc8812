"""Creating an account: a user, their project with its `default` environment, and ownership."""

from django.db import IntegrityError, transaction

from accounts.models import User
from accounts.projects import create_project
from runcrate.errors import Refused


class EmailTaken(Refused, ValueError):
    def __init__(self, email: str) -> None:
        super().__init__(
            "email_taken",
            f"An account with the email {email} already exists.",
            field="email",
            status=409,
        )
        self.email = email


def normalize_email(email: str) -> str:
    return (email or "").strip().lower()


def project_name_for(user: User) -> str:
    return f"{user.name or user.email.split('@')[0]}'s project"


def sign_up(*, email: str, password: str | None, name: str = "") -> User:
    """A new user who owns a new project with a `default` environment.

    `password=None` makes a user who cannot log in to the dashboard until they set a password
    (through "Forgot password" or `manage.py changepassword`); their API keys work.
    """
    email = normalize_email(email)
    if User.objects.filter(email__iexact=email).exists():
        raise EmailTaken(email)
    try:
        with transaction.atomic():
            user = User.objects.create_user(email=email, password=password, name=name.strip())
            create_project(owner=user, name=project_name_for(user))
    except IntegrityError:  # the same email signed up a moment ago
        raise EmailTaken(email) from None
    return user
