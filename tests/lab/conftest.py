"""One host lab for the whole session: brought up once (two GPU hosts and the gateway; reset if
they were up already), taken down at the end unless it was up before the session began."""

import subprocess
from pathlib import Path

import pytest

from lab import hostlab

REASON = hostlab.unavailable_reason()


@pytest.fixture(scope="session")
def operator_key(tmp_path_factory) -> tuple[Path, str]:
    """A throwaway ed25519 key pair: (private key file, public key line)."""
    folder = tmp_path_factory.mktemp("lab-operator")
    private = folder / "id_ed25519"
    subprocess.run(
        ["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-C", "lab-tests", "-f", str(private)],
        check=True,
    )
    return private, (folder / "id_ed25519.pub").read_text().strip()


@pytest.fixture(scope="session")
def lab_before() -> hostlab.Lab | None:
    """The lab as it was before this session touched it (None: it was down)."""
    return hostlab.current()


@pytest.fixture(scope="session")
def lab(lab_before, operator_key) -> hostlab.Lab:
    if REASON is not None:
        pytest.skip(REASON)
    if hostlab.others_using():
        # These tests reset hosts and take the lab down: not while someone else uses it.
        pytest.skip("another process that called hostlab.up() is running: its lab is in use")
    made = hostlab.up(2, authorized_key=operator_key[1], gateway=True)
    if lab_before is not None:
        # Hosts that were up before are kept as they were (another suite's bootstrap, say):
        # these tests start from pristine ones.
        for host in ["lab-gw", *(h.name for h in made.hosts)]:
            made.reset(host)
    yield made
    if lab_before is None and not hostlab.others_using():
        hostlab.down()
