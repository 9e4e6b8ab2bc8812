"""The object column's link, while the object exists (docs/audit.md): an entry keeps the
object's name, so once it is gone the name is what the log shows. One query per kind of object
on the page, never one per row. The models are found by label: the audit log sits below the
apps whose objects it names (tests/test_layers.py)."""

from collections import defaultdict
from collections.abc import Iterable

from django.apps import apps
from django.urls import reverse

from accounts.models import Project
from audit.models import Entry

# object_type → (model label, URL name, whether the URL takes the object's id)
LINKED: dict[str, tuple[str, str, bool]] = {
    "cluster": ("clusters.Cluster", "clusters:detail", True),
    "channel": ("notifications.Endpoint", "notifications:deliveries", True),
    "api_key": ("accounts.ApiKey", "accounts:account", False),
    "ssh_key": ("accounts.SshKey", "accounts:ssh_keys", False),
}


def links(*, project: Project, entries: Iterable[Entry]) -> dict[int, str]:
    """Entry pk → the link of its object, for the objects that still exist in `project`."""
    wanted: dict[str, dict[str, list[int]]] = defaultdict(lambda: defaultdict(list))
    for entry in entries:
        if entry.object_type in LINKED and entry.object_id.isdigit():
            wanted[entry.object_type][entry.object_id].append(entry.pk)
    found: dict[int, str] = {}
    for kind, by_id in wanted.items():
        label, url_name, with_id = LINKED[kind]
        model = apps.get_model(label)
        present = model._default_manager.filter(project=project, pk__in=[int(i) for i in by_id])
        for pk in present.values_list("pk", flat=True):
            url = reverse(url_name, args=[pk]) if with_id else reverse(url_name)
            for entry_pk in by_id[str(pk)]:
                found[entry_pk] = url
    return found
