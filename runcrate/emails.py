"""Sending the product's emails from templates kept in threes."""

from django.conf import settings
from django.core.mail import EmailMultiAlternatives
from django.template.loader import render_to_string

# The query parameter naming the project a link acts in: a member of several projects who
# opens a project's email lands in that project (accounts/middleware.py switches to it), not
# in whichever they had chosen in the top bar.
PROJECT_PARAM = "project"


def project_query(project_id: int) -> str:
    return f"?{PROJECT_PARAM}={project_id}"


def project_url(project_id: int, path: str) -> str:
    """The absolute link to the site's `path` that acts in the project `project_id`."""
    joiner = "&" if "?" in path else "?"
    return f"{settings.SITE_URL}{path}{joiner}{PROJECT_PARAM}={project_id}"


def send_templated(
    *,
    template: str,
    to: list[str],
    context: dict,
    reply_to: list[str] | None = None,
    project_id: int | None = None,
) -> int:
    """Render `templates/emails/<template>-{subject,body-text,body-html}.html` and send it.

    Contract:
    - `template` is the stem, e.g. `"cluster-ready"` for `emails/cluster-ready-subject.html`,
      `emails/cluster-ready-body-text.html` and `emails/cluster-ready-body-html.html`; all three
      must exist (a missing one raises `TemplateDoesNotExist` before anything is sent).
    - The subject is rendered with `context`, stripped, and its lines joined by spaces (a
      header cannot hold a newline). The text body is the message; the HTML body is attached
      as its `text/html` alternative. Write the text templates with `{% autoescape off %}`.
    - `context` gets `site_url` (settings.SITE_URL, no trailing slash) unless it has one; with
      `project_id`, the email is a project's and gets `in_project` ("?project=<id>"), which
      its links end with (`{{ site_url }}/billing/{{ in_project }}`).
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
    if project_id is not None:
        context.setdefault("in_project", project_query(project_id))
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
