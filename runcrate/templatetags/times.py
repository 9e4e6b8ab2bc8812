"""`{% load times %}`: an instant as the reader's own clock shows it.

`{{ moment|when }}` writes a `<time datetime="…">` whose text is the UTC date and time (what a
reader without JavaScript sees); static/js/app.js rewrites it in the browser's zone and locale
(`Intl`). `{{ moment|when:"relative" }}` reads "3 min ago" in the browser while that is under a
day, the date and time after."""

from datetime import UTC, datetime

from django import template
from django.utils.html import format_html

register = template.Library()

STYLES = ("datetime", "relative")


@register.filter
def when(moment: datetime | None, style: str = "datetime") -> str:
    if moment is None:
        return "—"
    utc = moment.astimezone(UTC)
    return format_html(
        '<time datetime="{}" data-when="{}">{} UTC</time>',
        utc.isoformat(timespec="seconds").replace("+00:00", "Z"),
        style if style in STYLES else "datetime",
        f"{utc:%Y-%m-%d %H:%M:%S}",
    )
