from django.contrib import admin
from django.urls import include, path

from runcrate import views
from runcrate.api import api, mount_routers

mount_routers()

urlpatterns = [
    path("", views.home, name="home"),
    path("healthz", views.healthz, name="healthz"),
    path("readyz", views.readyz, name="readyz"),
    path("admin/", admin.site.urls),
    path("api/v1/", api.urls),
    path("accounts/", include("accounts.urls")),
    path("offers/", include("offers.urls")),
    path("clusters/", include("clusters.urls")),
    path("storage/", include("clusters.storage_urls")),
    path("billing/", include("billing.urls")),
]

# Our own outages (the database, the broker) are 503s, never 500s: runcrate/outages.py.
handler500 = "runcrate.middleware.server_error"
