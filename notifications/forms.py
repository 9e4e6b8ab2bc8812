"""The page's form to add a channel. It only carries what was sent: which kinds, URLs and event
types are accepted is decided by notifications/endpoints.py `create_endpoint`, whose refusals
the view puts on the field they name."""

from django import forms

from notifications.models import EVENT_TYPES, Endpoint


class EndpointForm(forms.Form):
    kind = forms.ChoiceField(
        choices=Endpoint.Kind.choices,
        initial=Endpoint.Kind.WEBHOOK,
        required=False,
        widget=forms.RadioSelect,
    )
    url = forms.CharField(
        label="URL",
        required=False,
        widget=forms.TextInput(
            attrs={
                "inputmode": "url",
                "autocomplete": "off",
                "spellcheck": "false",
                "placeholder": "https://example.com/hooks/runcrate",
            }
        ),
    )
    events = forms.MultipleChoiceField(
        choices=[(event_type, event_type) for event_type in EVENT_TYPES],
        required=False,
        widget=forms.CheckboxSelectMultiple,
    )
