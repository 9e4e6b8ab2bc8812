from django.urls import path

from audit import views

app_name = "audit"

urlpatterns = [
    path("", views.entry_list, name="list"),
    path("export.csv", views.export_csv, name="export"),
]
