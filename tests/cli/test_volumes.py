"""`runcrate volumes …`: create, list, and delete (confirmed), by id or name, and a volume
attached with `clusters create --volume NAME`."""

import pytest

from clusters.models import Cluster, Volume
from tests.cli.kit import run_cli
from tests.clusters.lifecycle_kit import inventory

pytestmark = pytest.mark.django_db(transaction=True)


def test_it_creates_lists_and_deletes_a_volume(env, tmp_path, account):
    offer = inventory(hosts=2)
    location = offer.location.code

    created = run_cli(
        "volumes", "create", "--name", "data", "--location", location, "--size-gb", "100",
        env=env, tmp_path=tmp_path,
    )  # fmt: skip
    listed = run_cli("volumes", "list", env=env, tmp_path=tmp_path)

    assert created.code == 0, created.stderr
    volume = Volume.objects.get(project=account.project)
    assert created.json()["id"] == volume.pk and volume.size_gb == 100
    assert listed.json() == account.api_data("/volumes")

    unconfirmed = run_cli("volumes", "delete", "data", env=env, tmp_path=tmp_path)
    assert unconfirmed.code == 2
    assert Volume.objects.get(pk=volume.pk).deleted_at is None

    deleted = run_cli("volumes", "delete", "data", "--yes", env=env, tmp_path=tmp_path)
    assert deleted.code == 0, deleted.stderr
    assert deleted.json() == {"id": volume.pk, "deleted": True}
    assert account.api_data("/volumes") == []


def test_a_volume_is_attached_by_name_at_create(env, tmp_path, account):
    offer = inventory(hosts=2)
    run_cli(
        "volumes", "create", "--name", "data", "--location", offer.location.code,
        "--size-gb", "10", env=env, tmp_path=tmp_path,
    )  # fmt: skip

    result = run_cli(
        "clusters", "create", "--offer", offer.slug, "--nodes", "2", "--name", "withdata",
        "--volume", "data", "--yes", env=env, tmp_path=tmp_path,
    )  # fmt: skip

    assert result.code == 0, result.stderr
    assert result.json()["volume"]["name"] == "data"
    cluster = Cluster.objects.get(project=account.project)
    assert cluster.volumes.get().name == "data"


def test_a_refused_volume_passes_the_apis_code_through(env, tmp_path, account):
    result = run_cli(
        "volumes", "create", "--name", "data", "--location", "nowhere", "--size-gb", "10",
        env=env, tmp_path=tmp_path,
    )  # fmt: skip

    assert result.code == 1
    assert result.json()["error"]["code"] == "unknown_location"
    assert "There is no location 'nowhere'" in result.stderr
