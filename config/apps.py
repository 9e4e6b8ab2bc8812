from django.apps import AppConfig


class ProjectConfig(AppConfig):
    """The project package as an installed app, for its management command (`seed_demo`)."""

    name = "config"
    verbose_name = "Runcrate project"
