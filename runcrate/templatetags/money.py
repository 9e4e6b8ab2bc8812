"""`{% load money %}`: the template face of runcrate/money.py, so a page, an email and the admin
print an amount the same way (`$1,234.50`). No formatting lives here."""

from django import template

from runcrate import money

register = template.Library()

register.filter("usd", money.usd)
register.filter("signed_usd", money.signed_usd)
register.filter("usd_per_hour", money.usd_per_hour)
register.filter("usd_rate", money.usd_rate)
