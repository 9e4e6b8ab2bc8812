"""Sending the product's emails from templates kept in threes."""

from django.conf import settings
from django.core.mail import EmailMultiAlternatives
from django.template.loader import render_to_string


def send_templated(
    *,
    template: str,
    to: list[str],
    context: dict,
    reply_to: list[str] | None = None,
) -> int:
    """Render `templates/emails/<template>-{subject,body-text,body-html}.html` and send it.

    Contract:
    - `template` is the stem, e.g. `"cluster-ready"` for `emails/cluster-ready-subject.html`,
      `emails/cluster-ready-body-text.html` and `emails/cluster-ready-body-html.html`; all three
      must exist (a missing one raises `TemplateDoesNotExist` before anything is sent).
    - The subject is rendered with `context`, stripped, and its lines joined by spaces (a
      header cannot hold a newline). The text body is the message; the HTML body is attached
      as its `text/html` alternative. Write the text templates with `{% autoescape off %}`.
    - `context` gets `site_url` (settings.SITE_URL, no trailing slash) unless it has one.
    - One message goes to every address in `to` (they see each other); send one call per
      recipient for separate messages. `reply_to` sets the Reply-To header.
    - The sender is settings.DEFAULT_FROM_EMAIL; the backend is settings.EMAIL_BACKEND (files
      under $RUNCRATE_VAR_DIR/mail/ by default, an ESP through anymail in production).
    - Returns the number of messages sent (1, or 0 when `to` is empty). Errors of the
      backend propagate: call it after commit (`transaction.on_commit`) or from a task, so a
      failed send never undoes the change it reports.
    """
    if not to:
        return 0
    context = {"site_url": settings.SITE_URL, **context}
    subject: str = render_to_string(f"emails/{template}-subject.html", context)
    subject = " ".join(line.strip() for line in subject.splitlines() if line.strip())
    text = render_to_string(f"emails/{template}-body-text.html", context)
    html = render_to_string(f"emails/{template}-body-html.html", context)
    message = EmailMultiAlternatives(
        subject=subject,
        body=text,
        from_email=settings.DEFAULT_FROM_EMAIL,
        to=to,
        reply_to=reply_to,
    )
    message.attach_alternative(html, "text/html")
    return message.send()
