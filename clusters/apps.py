from django.apps import AppConfig


class ClustersConfig(AppConfig):
    name = "clusters"

    def ready(self) -> None:
        # Django's app loading: the Celery tasks register with the lifecycle's dispatcher as
        # they are defined (clusters/lifecycle/dispatch.py), in every process, web and worker.
        from clusters import tasks  # noqa: F401
