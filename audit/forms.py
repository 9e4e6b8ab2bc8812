from datetime import datetime

from django import forms

from audit.filters import EntryFilter, in_utc


class FilterForm(forms.Form):
    """The page's filters (GET): every field optional; a bad one is an error on the page, never
    a 500, and the list shows unfiltered by it."""

    who = forms.CharField(required=False, max_length=254, label="Who")
    action = forms.CharField(required=False, max_length=200, label="What")
    cluster = forms.IntegerField(required=False, min_value=1, max_value=2**62, label="Cluster id")
    since = forms.DateTimeField(required=False, label="From (UTC)")
    until = forms.DateTimeField(required=False, label="Until (UTC)")

    def clean_since(self) -> datetime | None:
        return self._in_utc("since")

    def clean_until(self) -> datetime | None:
        return self._in_utc("until")

    def _in_utc(self, name: str) -> datetime | None:
        moment = self.cleaned_data.get(name)
        if moment is None:
            return None
        try:
            return in_utc(moment)
        except ValueError as error:
            raise forms.ValidationError(str(error)) from None

    def entry_filter(self) -> EntryFilter:
        data = self.cleaned_data if self.is_valid() else {}
        cluster = data.get("cluster")
        return EntryFilter(
            who=data.get("who") or "",
            action=data.get("action") or "",
            cluster=str(cluster) if cluster else "",
            since=data.get("since"),
            until=data.get("until"),
        )
