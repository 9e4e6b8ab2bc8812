"""The URLconf: every app's pages, and the API with every app's router mounted on it. The one
place that knows every app (docs/architecture.md, "Layers")."""

from django.contrib import admin
from django.urls import include, path

from accounts.api import router as accounts_router
from accounts.api_auth import ApiKeyAuth
from audit.api import router as audit_router
from billing.api import router as billing_router
from clusters.telemetry.agent_api import router as agent_router  # nodes' agents, by node token
from clusters.web.api import router as clusters_router
from notifications.api import router as notifications_router
from offers.api import router as offers_router
from runcrate import views
from runcrate.api import api, declare_error_answers


def mount_routers() -> None:
    """Attach every app's router to the kernel's API. An operation that declares no scope fails
    closed: only a key with every scope and no limits may call it. Ninja gives an operation the
    API's auth as its router is added, so the default is set first."""
    api.auth = [ApiKeyAuth(None)]
    routers = [
        offers_router,
        accounts_router,
        clusters_router,
        billing_router,
        notifications_router,
        audit_router,
        agent_router,
    ]
    for router in routers:
        declare_error_answers(router)
        api.add_router("/", router)


mount_routers()

urlpatterns = [
    path("", views.home, name="home"),
    path("healthz", views.healthz, name="healthz"),
    path("readyz", views.readyz, name="readyz"),
    path("admin/", admin.site.urls),
    path("api/v1/", api.urls),
    path("accounts/", include("accounts.urls")),
    path("offers/", include("offers.urls")),
    path("clusters/", include("clusters.web.urls")),
    path("storage/", include("clusters.web.storage_urls")),
    path("billing/", include("billing.urls")),
    path("audit/", include("audit.urls")),
    path("notifications/", include("notifications.urls")),
]

# Our own outages (the database, the broker) are 503s, never 500s: runcrate/outages.py.
handler500 = "runcrate.middleware.server_error"
