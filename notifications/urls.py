from django.urls import path

from notifications import views

app_name = "notifications"

urlpatterns = [
    path("", views.endpoint_list, name="list"),
    path("add/", views.add_endpoint, name="add"),
    path("<int:endpoint_id>/", views.deliveries, name="deliveries"),
    path("<int:endpoint_id>/test/", views.send_test, name="send_test"),
    path("<int:endpoint_id>/remove/", views.remove_endpoint, name="remove"),
]
