from django.apps import AppConfig


class RuncrateConfig(AppConfig):
    name = "runcrate"
    verbose_name = "Runcrate"
