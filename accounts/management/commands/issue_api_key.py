"""`manage.py issue_api_key EMAIL [--create-user] [--name NAME]`: the new key is the last line."""

from argparse import ArgumentParser

from django.core.management.base import BaseCommand, CommandError
from django.db import transaction

from accounts import keys
from accounts.models import User
from accounts.projects import create_project, project_for
from accounts.signup import EmailTaken, normalize_email, project_name_for, sign_up


class Command(BaseCommand):
    help = (
        "Issue a new API key for a user's project and print it as the last line of the output. "
        "With --create-user, a missing user is created (without a password: they set one "
        "through 'Forgot password' or 'manage.py changepassword') with a project of their own."
    )

    def add_arguments(self, parser: ArgumentParser) -> None:
        parser.add_argument("email", help="The user's email address.")
        parser.add_argument(
            "--create-user",
            action="store_true",
            help="Create the user and their project when no user has this email.",
        )
        parser.add_argument("--name", default="cli", help="The key's name (default: cli).")

    @transaction.atomic
    def handle(self, *args: object, email: str, create_user: bool, name: str, **options: object):
        email = normalize_email(email)
        if not email or "@" not in email:
            raise CommandError(f"'{email}' is not an email address.")
        user = User.objects.filter(email__iexact=email).first()
        if user is None:
            if not create_user:
                raise CommandError(
                    f"No user has the email {email}. Pass --create-user to create one."
                )
            try:
                user = sign_up(email=email, password=None)
            except EmailTaken as taken:  # created by someone else a moment ago
                raise CommandError(str(taken)) from None
            self.stdout.write(f"Created the user {user.email} (no password set).")
        if not user.is_active:
            raise CommandError(f"The user {user.email} is deactivated; their keys would not work.")
        project = project_for(user)
        if project is None:
            project = create_project(owner=user, name=project_name_for(user))
            self.stdout.write(f"Created the project '{project.name}'.")
        try:
            key, raw = keys.issue_api_key(user=user, project=project, name=name)
        except keys.KeyRefused as refusal:
            raise CommandError(refusal.message) from None
        self.stdout.write(
            f"API key '{key.name}' for {user.email} in project '{project.name}'. "
            "It is shown only once:"
        )
        self.stdout.write(raw)
