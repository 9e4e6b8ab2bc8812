"""The Content-Security-Policy header on every answer (docs/security.md).

Nothing the product serves loads from outside, and no page has an inline script, an inline
style or an event-handler attribute, so the policy can be strict: scripts, styles, fonts and
connections from this site only, images from it or `data:` (Swagger UI's icons), no plugins, no
framing. `form-action` is left open: the top-up form is answered with a redirect to Stripe
Checkout, which a browser checks against it. Django 5.2 has no CSP of its own.
"""

from collections.abc import Callable

from django.http import HttpRequest, HttpResponse

POLICY = "; ".join(
    [
        "default-src 'self'",
        "script-src 'self'",
        "style-src 'self'",
        "img-src 'self' data:",
        "font-src 'self'",
        "connect-src 'self'",
        "object-src 'none'",
        "base-uri 'self'",
        "frame-ancestors 'none'",
    ]
)


class ContentSecurityPolicy:
    def __init__(self, get_response: Callable[[HttpRequest], HttpResponse]) -> None:
        self.get_response = get_response

    def __call__(self, request: HttpRequest) -> HttpResponse:
        response = self.get_response(request)
        response.headers.setdefault("Content-Security-Policy", POLICY)
        return response
