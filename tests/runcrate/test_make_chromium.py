"""`make test` on a fresh machine (issue 21): its first step, `make chromium`, finds Chromium
for the browser tests, installs it with apt when run as root, and otherwise stops at once with
the one command to run. The Makefile's CHROMIUM and APT_GET point it at a missing path and a
stand-in apt-get here, so nothing is installed or removed."""

import os
import shutil
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
NOBODY = ["setpriv", "--reuid=nobody", "--regid=nogroup", "--clear-groups"]

pytestmark = pytest.mark.skipif(shutil.which("make") is None, reason="no make on this machine")


def make(
    *targets: str, chromium: Path, apt_get: Path | str = "false", as_nobody: bool = False
) -> subprocess.CompletedProcess[str]:
    # Not the make this suite may run under (its MAKEFLAGS would leak in), and apt's
    # DEBIAN_FRONTEND only where the Makefile sets it.
    skip = ("MAKEFLAGS", "MFLAGS", "MAKELEVEL", "DEBIAN_FRONTEND")
    env = {k: v for k, v in os.environ.items() if k not in skip}
    command = ["make", "--no-print-directory", *targets, f"CHROMIUM={chromium}"]
    command.append(f"APT_GET={apt_get}")
    if as_nobody and os.geteuid() == 0:
        command = [*NOBODY, *command]
    return subprocess.run(
        command, cwd=ROOT, env=env, capture_output=True, text=True, timeout=60, check=False
    )


@pytest.fixture
def apt_get(tmp_path: Path) -> Path:
    """A stand-in apt-get that logs its arguments (and DEBIAN_FRONTEND), and on `install`
    makes the executable that CHROMIUM names, as the real package would."""
    tmp_path.chmod(0o777)  # so a run as nobody could log too, were it to call apt-get
    script = tmp_path / "apt-get"
    script.write_text(
        "#!/bin/sh\n"
        f'echo "${{DEBIAN_FRONTEND:--}} $*" >> {tmp_path}/apt.log\n'
        f'if [ "$1" = install ]; then printf "#!/bin/sh\\n" > {tmp_path}/chromium; '
        f"chmod +x {tmp_path}/chromium; fi\n"
    )
    script.chmod(0o755)
    return script


def test_it_does_nothing_where_chromium_is_there(tmp_path, apt_get):
    present = tmp_path / "chromium"
    present.write_text("#!/bin/sh\n")
    present.chmod(0o755)

    done = make("chromium", chromium=present, apt_get=apt_get)

    assert (done.returncode, done.stdout) == (0, "")
    assert not (tmp_path / "apt.log").exists()


@pytest.mark.skipif(os.geteuid() != 0, reason="installs only as root; this run is not root")
def test_as_root_it_installs_chromium_with_apt(tmp_path, apt_get):
    missing = tmp_path / "chromium"

    done = make("chromium", chromium=missing, apt_get=apt_get)

    assert done.returncode == 0, done.stdout + done.stderr
    assert "Installing Chromium for the browser tests" in done.stdout
    assert (tmp_path / "apt.log").read_text().splitlines() == [
        "- update -qq",
        "noninteractive install -y -qq chromium",
    ]
    assert os.access(missing, os.X_OK)


@pytest.mark.skipif(os.geteuid() != 0, reason="installs only as root; this run is not root")
def test_as_root_it_stops_when_apt_cannot_install_it(tmp_path):
    done = make("chromium", chromium=tmp_path / "chromium", apt_get="false")

    assert done.returncode != 0
    assert f"apt-get could not install chromium: install Chromium at {tmp_path}/chromium" in (
        done.stdout
    )


@pytest.mark.skipif(
    os.geteuid() == 0 and shutil.which("setpriv") is None, reason="no setpriv to drop root"
)
def test_not_as_root_make_test_stops_at_once_with_the_one_command(tmp_path, apt_get):
    done = make("test", chromium=tmp_path / "chromium", apt_get=apt_get, as_nobody=True)

    assert done.returncode != 0
    assert done.stdout == (
        f"make test needs Chromium at {tmp_path}/chromium for the browser tests. Install it "
        "with:\n\n    sudo apt-get install -y chromium\n\n"
    )
    # At once: before installing anything, running pytest, or calling apt-get.
    assert "-m pytest" not in done.stdout + done.stderr
    assert not (tmp_path / "apt.log").exists()


def test_make_test_checks_chromium_before_anything_else(tmp_path):
    planned = make("-n", "test", chromium=tmp_path / "chromium").stdout

    assert planned.index(f'[ ! -x "{tmp_path}/chromium" ]') < planned.index("-m pytest")
