"""The embedded broker hands a consumer whole messages only, however the writes interleave."""

import os
from queue import Empty

import pytest
from kombu import Connection

from runcrate.broker import SCHEME


@pytest.fixture
def channel(tmp_path):
    folder = tmp_path / "queue"
    folder.mkdir()
    options = {
        "data_folder_in": str(folder),
        "data_folder_out": str(folder),
        "control_folder": str(tmp_path),
        "store_processed": False,
    }
    with Connection(f"{SCHEME}://localhost//", transport_options=options) as connection:
        channel = connection.default_channel
        yield channel, folder


def test_it_ignores_a_message_that_is_still_being_written(channel):
    channel, folder = channel
    # What a writer leaves while it writes: a name no queue matches, and no complete content.
    (folder / "partial-0b7a.tmp").write_bytes(b'{"body": "half')

    with pytest.raises(Empty):
        channel._get("celery")
    assert (folder / "partial-0b7a.tmp").exists()


def test_it_writes_each_message_under_its_queue_name_in_one_step(channel, monkeypatch):
    channel, folder = channel
    renames = []
    real_replace = os.replace

    def watching_replace(source, target):
        # At the rename the content is complete, and only the temporary name exists.
        assert os.path.basename(source).endswith(".tmp")
        assert os.path.getsize(source) > 0
        assert not any(name.endswith(".msg") for name in os.listdir(folder))
        renames.append(os.path.basename(target))
        real_replace(source, target)

    monkeypatch.setattr(os, "replace", watching_replace)
    channel._put("celery", {"body": "hello", "n": 1})

    assert len(renames) == 1 and renames[0].endswith(".celery.msg")
    assert os.listdir(folder) == renames
    assert channel._get("celery") == {"body": "hello", "n": 1}
    assert os.listdir(folder) == []
