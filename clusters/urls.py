from django.urls import path

from clusters import views

app_name = "clusters"

urlpatterns = [
    path("", views.cluster_list, name="list"),
]
