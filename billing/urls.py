from django.urls import path

from billing import views

app_name = "billing"

urlpatterns = [
    path("", views.index, name="index"),
    path("export.csv", views.export_csv, name="export"),
    path("clusters/<int:cluster_id>/", views.cluster_usage, name="cluster_usage"),
    path("credit/", views.add_credit, name="add_credit"),
    path("payments/<int:pk>/", views.payment_detail, name="payment"),
    path("payments/<int:pk>/retry/", views.payment_retry, name="payment_retry"),
    path("stripe/webhook/", views.stripe_webhook, name="stripe_webhook"),
    path("environments/", views.environments, name="environments"),
    path("environments/<slug:name>/budget/", views.set_budget, name="set_budget"),
]
