"""A suggested name on the create form (issue 13, item 8): from the GPU and the size with a
short random suffix, a valid name that none of the project's clusters has; the user's own name
(a link's `name`, or what they typed) is never replaced."""

import re
from decimal import Decimal

import pytest

from clusters.models import NAME_RE, Cluster
from clusters.web import forms
from tests.clusters.front import credit, machine_type_with_hosts, ssh_key
from tests.factories import ClusterFactory, GpuModelFactory

SLUG = "use2-h100x8-vm"


@pytest.fixture
def offer(owner):
    ssh_key(owner.project)
    credit(owner.project, "500.00")
    gpu = GpuModelFactory(slug="h100-sxm", name="H100 SXM 80GB")
    return machine_type_with_hosts(free=4, slug=SLUG, gpu=gpu, price_per_hour=Decimal("10.00"))


def name_field(html: str) -> str:
    return re.search(r'<input type="text" name="name" value="([^"]*)"', html).group(1)


def test_it_suggests_the_gpu_and_size_with_a_short_suffix(owner, offer):
    html = owner.browser_client().get(f"/clusters/new/?offer={SLUG}&nodes=4").content.decode()
    name = name_field(html)
    assert re.fullmatch(r"h100-sxm-4x-[a-z0-9]{4}", name) and NAME_RE.fullmatch(name)
    assert "A name is suggested from the GPU and the size" in html


def test_it_never_suggests_a_name_the_project_has(owner, offer, monkeypatch):
    ClusterFactory(project=owner.project, name="h100-sxm-2x-aaaa", status=Cluster.Status.TERMINATED)
    suffixes = iter(["aaaa", "bbbb", "cccc", "dddd", "eeee"])
    monkeypatch.setattr(forms, "name_suffix", lambda: next(suffixes))
    html = owner.browser_client().get(f"/clusters/new/?offer={SLUG}&nodes=2").content.decode()
    assert name_field(html) == "h100-sxm-2x-bbbb"


def test_another_projects_names_do_not_count(owner, stranger, offer, monkeypatch):
    ClusterFactory(project=stranger.project, name="h100-sxm-2x-aaaa")
    monkeypatch.setattr(forms, "name_suffix", lambda: "aaaa")
    html = owner.browser_client().get(f"/clusters/new/?offer={SLUG}&nodes=2").content.decode()
    assert name_field(html) == "h100-sxm-2x-aaaa"


def test_it_keeps_the_name_of_a_link_and_what_the_user_typed(owner, offer):
    client = owner.browser_client()
    linked = client.get(f"/clusters/new/?offer={SLUG}&nodes=2&name=train").content.decode()
    assert name_field(linked) == "train" and "A name is suggested" not in linked
    posted = client.post(
        "/clusters/new/", {"offer": SLUG, "nodes": "2", "name": "Bad_Name", "software": "none"}
    ).content.decode()
    assert name_field(posted) == "Bad_Name"


def test_the_suggestion_creates_a_cluster_as_it_is(owner, offer):
    client = owner.browser_client()
    name = name_field(client.get(f"/clusters/new/?offer={SLUG}&nodes=2").content.decode())
    keys = [str(pk) for pk in owner.project.ssh_keys.values_list("pk", flat=True)]
    response = client.post(
        "/clusters/new/",
        {
            "offer": SLUG,
            "nodes": "2",
            "name": name,
            "environment": "default",
            "software": "none",
            "ssh_keys": keys,
        },
    )
    assert response.status_code == 302
    assert Cluster.objects.get(project=owner.project).name == name


def test_an_odd_gpu_slug_still_gives_a_valid_name(owner):
    gpu = GpuModelFactory(slug="RTX_4090__24g", name="RTX 4090")
    machine_type = machine_type_with_hosts(free=2, slug="odd-vm", gpu=gpu)
    from offers.offers import get_offer

    name = forms.suggest_name(
        project=owner.project, offer=get_offer(slug=machine_type.slug, nodes=2), nodes=2
    )
    assert NAME_RE.fullmatch(name) and name.startswith("rtx-4090-24g-2x-")
