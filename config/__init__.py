"""The project package, the composition root: the settings, the URLconf that mounts every app's
router, the Celery app, the WSGI entry point and `seed_demo`. The one package that imports every
app; none imports it (docs/architecture.md, "Layers")."""

from config.celery import app as celery_app

__all__ = ["celery_app"]
