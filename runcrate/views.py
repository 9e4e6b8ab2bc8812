from django.http import HttpRequest, HttpResponse, JsonResponse
from django.shortcuts import redirect


def home(request: HttpRequest) -> HttpResponse:
    if request.user.is_authenticated:
        return redirect("clusters:list")
    return redirect("accounts:login")


def healthz(request: HttpRequest) -> JsonResponse:
    """The bare Django view: no database, no template. `make bench` measures against it."""
    return JsonResponse({"status": "ok"})
