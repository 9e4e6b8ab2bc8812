from django.http import HttpRequest


def navigation(request: HttpRequest) -> dict[str, str]:
    match = getattr(request, "resolver_match", None)
    return {"nav_section": match.namespace if match else ""}
