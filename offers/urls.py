from django.urls import path

from offers import views

app_name = "offers"

urlpatterns = [
    path("", views.picker, name="picker"),
    path("quote/", views.quote, name="quote"),
    path("quotes/", views.quotes, name="quotes"),
]
