from django.apps import AppConfig


class AuditConfig(AppConfig):
    name = "audit"

    def ready(self) -> None:
        from audit import receivers

        receivers.connect()
