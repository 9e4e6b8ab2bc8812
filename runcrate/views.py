from django.http import HttpRequest, HttpResponse, JsonResponse
from django.shortcuts import redirect

from runcrate import health


def home(request: HttpRequest) -> HttpResponse:
    if request.user.is_authenticated:
        return redirect("clusters:list")
    return redirect("accounts:login")


def healthz(request: HttpRequest) -> JsonResponse:
    """The bare Django view: no database, no template. `make bench` measures against it."""
    return JsonResponse({"status": "ok"})


def readyz(request: HttpRequest) -> JsonResponse:
    """Whether this deployment can do its work: the database answers, the broker takes
    connections, the beat's tick and meter ran lately, and a worker takes the `machines` queue
    (its heartbeat ran lately). 200 with every check "ok", else 503 naming what is wrong
    (docs/architecture.md, "Health")."""
    checks = health.readiness()
    ready = all(value == "ok" for value in checks.values())
    return JsonResponse(
        {"status": "ok" if ready else "unavailable", "checks": checks}, status=200 if ready else 503
    )
