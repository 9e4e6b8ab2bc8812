"""In Chromium: a ready cluster's connect panel. Copy a command to the clipboard, download the
SSH config, and keep the panel (and what the user did in it) through the page's polls."""

import io

import paramiko
import pytest
from django.db.models import F
from django.utils import timezone
from playwright.sync_api import expect

from clusters.models import Cluster, Node
from tests.conftest import log_in
from tests.factories import ClusterFactory, LocationFactory, MachineTypeFactory

pytestmark = [pytest.mark.browser, pytest.mark.django_db(transaction=True)]


@pytest.fixture
def ready(owner) -> Cluster:
    now = timezone.now()
    cluster = ClusterFactory(
        project=owner.project,
        name="train",
        size=2,
        machine_type=MachineTypeFactory(
            location=LocationFactory(code="us-west-1", name="San Jose, California"),
            gpus_per_machine=8,
        ),
        status=Cluster.Status.READY,
        joined_at=now,
        ready_at=now,
        machines=True,
        machines__status=Node.Status.JOINED,
        machines__step=Node.Step.DONE,
    )
    for node in cluster.nodes.all():
        node.public_address = f"203.0.113.{10 + node.index}"
        node.save(update_fields=["public_address"])
    return cluster


def test_it_copies_a_command_and_downloads_the_ssh_config(page, live_server, owner, ready):
    page.context.grant_permissions(["clipboard-read", "clipboard-write"], origin=live_server.url)
    log_in(page, owner)
    page.goto(f"/clusters/{ready.pk}/connect/")
    panel = page.locator("section.connect")
    expect(panel.get_by_role("heading", name="Connect and run")).to_be_visible()

    panel.locator('button[data-copy="cmd-torchrun"]').click()
    expect(panel.locator('button[data-copy="cmd-torchrun"]')).to_have_text("Copied")
    copied = page.evaluate("navigator.clipboard.readText()")
    assert copied == (
        "torchrun --nnodes=2 --nproc-per-node=8 --rdzv-backend=c10d "
        "--rdzv-endpoint=node-0:29500 --rdzv-id=train train.py"
    )

    panel.locator('button[data-copy="ssh-node-1"]').click()
    expect(panel.locator('button[data-copy="ssh-node-1"]')).to_have_text("Copied")
    assert page.evaluate("navigator.clipboard.readText()") == "ssh root@203.0.113.11"

    with page.expect_download() as download_info:
        panel.get_by_role("link", name="SSH config").click()
    download = download_info.value
    assert download.suggested_filename == "train.ssh-config"
    with open(download.path()) as saved:
        content = saved.read()
    config = paramiko.SSHConfig()
    config.parse(io.StringIO(content))
    assert config.lookup("train")["hostname"] == "203.0.113.10"
    assert config.lookup("train-node-1")["hostname"] == "203.0.113.11"
    assert config.lookup("train-node-1")["user"] == "root"
    assert "node-1" not in config.get_hostnames()


def test_it_keeps_the_panel_through_the_pages_polls(page, owner, ready):
    log_in(page, owner)
    page.goto(f"/clusters/{ready.pk}/connect/")
    panel = page.locator("section.connect")
    expect(panel).to_be_visible()
    # Mark the element and select a command, as a user about to copy it by hand would.
    panel.evaluate("element => { element.dataset.marked = 'yes'; }")
    page.evaluate("() => getSelection().selectAllChildren(document.getElementById('cmd-mpirun'))")

    def changed_poll(response) -> bool:
        return f"/clusters/{ready.pk}/connect/?version=" in response.url and response.status == 200

    for _ in range(2):  # two polls of a changed cluster, each swapping the section around the panel
        Cluster.objects.filter(pk=ready.pk).update(version=F("version") + 1)
        with page.expect_response(changed_poll):
            pass
    page.wait_for_timeout(100)  # let htmx settle the swap

    expect(page.locator("section.connect")).to_have_attribute("data-marked", "yes")
    assert page.evaluate("getSelection().toString()").startswith(
        "mpirun --allow-run-as-root -np 16"
    )
    expect(page.locator("#cmd-mpirun")).to_contain_text("--hostfile /shared/hostfile")
