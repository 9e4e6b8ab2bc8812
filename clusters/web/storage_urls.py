"""The Storage page (`/storage/`): volumes. Its own namespace, so the navigation marks it."""

from django.urls import path

from clusters.web import views

app_name = "storage"

urlpatterns = [
    path("", views.storage, name="list"),
    path("<int:pk>/delete/", views.volume_delete, name="delete"),
]
