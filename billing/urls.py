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
    path("payments/<int:pk>/demo/", views.demo_checkout, name="demo_checkout"),
    path("payments/<int:pk>/demo/pay/", views.demo_pay, name="demo_pay"),
    path("stripe/webhook/", views.stripe_webhook, name="stripe_webhook"),
    path("banner/dismiss/", views.dismiss_banner, name="dismiss_banner"),
    path("invoices/", views.invoice_list, name="invoices"),
    path("invoices/details/", views.invoice_details, name="invoice_details"),
    path("invoices/<str:month>/", views.invoice, name="invoice"),
    path("environments/", views.environments, name="environments"),
    path("environments/<slug:name>/budget/", views.set_budget, name="set_budget"),
]
