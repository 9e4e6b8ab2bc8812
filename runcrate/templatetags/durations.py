"""`{% load durations %}`: the template face of runcrate/durations.py."""

from django import template

from runcrate import durations

register = template.Library()

register.filter("span", durations.span)
register.filter("about", durations.about)
register.filter("clock", durations.clock)
