"""The product's own reading of a host (clusters/machines/pristine.py): the parsers of what it
reads over SFTP, the comparison with a baseline, and the operator's reimage command, run for
real here. The whole verification on real hosts is tests/clusters/test_ssh_lab_reimage.py."""

from __future__ import annotations

import collections
import hashlib
import io
import os
import shutil

import pytest

from clusters.machines import pristine
from tests.factories import HostFactory

DPKG_STATUS = """\
Package: openssh-server
Status: install ok installed
Priority: optional
Architecture: amd64
Version: 1:9.2p1-2+deb12u3
Description: secure shell (SSH) server
 a long description line: Status: install ok installed

Package: iperf3
Status: deinstall ok config-files
Architecture: amd64
Version: 3.12-1

Package: libc6
Status: install ok installed
Architecture: i386
Version: 2.36-9

Package: tzdata
Status: install ok installed
Architecture: all
Version: 2024a-0+deb12u1
"""

# /proc/net/tcp and tcp6 as Linux prints them: sshd on 0.0.0.0:22, a connection, and a
# listener on [::]:8088 and on 10.77.0.1:8265.
PROC_TCP = """\
  sl  local_address rem_address   st tx_queue rx_queue tr tm->when retrnsmt   uid  timeout inode
   0: 00000000:0016 00000000:0000 0A 00000000:00000000 00:00000000 00000000     0        0 1 1
   1: 0B4D1EAC:0016 014D1EAC:9BC4 01 00000000:00000000 02:000AFC50 00000000     0        0 2 4
   2: 01004D0A:2049 00000000:0000 0A 00000000:00000000 00:00000000 00000000     0        0 3 1
"""
PROC_TCP6 = """\
  sl  local_address                         remote_address                        st tx_queue
   0: 00000000000000000000000000000000:1F98 00000000000000000000000000000000:0000 0A 00000000
   1: 00000000000000000000000001000000:0277 00000000000000000000000000000000:0000 0A 00000000
"""


def test_it_reads_installed_packages_from_dpkgs_status_file():
    assert pristine._packages(DPKG_STATUS) == {
        "openssh-server": "1:9.2p1-2+deb12u3",
        "libc6:i386": "2.36-9",
        "tzdata": "2024a-0+deb12u1",
    }


def test_it_reads_listening_sockets_in_both_address_families():
    found = pristine.listening("tcp", PROC_TCP) | pristine.listening("tcp6", PROC_TCP6)
    assert found == {
        "tcp 0.0.0.0:22",
        "tcp 10.77.0.1:8265",
        "tcp6 [::]:8088",
        "tcp6 [::1]:631",
    }


def baseline() -> dict:
    return {
        "version": pristine.VERSION,
        "files": {"/etc/passwd": "f 0644 0:0 aa", "/usr/bin/rsync": "f 0755 0:0 1 2"},
        "packages": {"openssh-server": "1:9.2p1"},
        "users": ["root", "sshd"],
        "authorized_keys": {"/root/.ssh/authorized_keys": "k1"},
        "sockets": ["tcp 0.0.0.0:22"],
        "programs": ["/usr/sbin/sshd"],
    }


def test_a_host_equal_to_its_baseline_has_no_differences():
    assert pristine.differences(baseline(), baseline()) == []


def test_it_names_everything_a_tenant_changed():
    now = baseline()
    now["users"].append("eve")
    now["authorized_keys"]["/root/.ssh/authorized_keys"] = "k2"
    now["authorized_keys"]["/home/eve/.ssh/authorized_keys"] = "k3"
    now["sockets"].append("tcp 0.0.0.0:8088")
    now["programs"].append("/usr/bin/python3.11")
    now["packages"]["netcat"] = "1.0"
    now["files"]["/usr/bin/rsync"] = "f 0755 0:0 9 2"
    now["files"]["/etc/cron.d/backdoor"] = "f 0644 0:0 bb"
    del now["files"]["/etc/passwd"]

    messages = [d.message for d in pristine.differences(baseline(), now)]

    assert messages == [
        "a user eve that was not there",
        "/home/eve/.ssh/authorized_keys is not what it was",
        "/root/.ssh/authorized_keys is not what it was",
        "something listens on tcp 0.0.0.0:8088",
        "/usr/bin/python3.11 is running",
        "package netcat 1.0 was installed",
        "/etc/cron.d/backdoor was added",
        "/usr/bin/rsync changed",
        "/etc/passwd was removed",
    ]


# /proc/net/tcp with sshfs's ssh connected to node-0 (10.77.0.2:41220 -> 10.77.0.1:22, inode
# 9001), a listener on 10.77.0.2:5201 (inode 9002), and the dashboard's own session on the
# public address (inode 9003). A time-wait socket has no inode (0).
PRIVATE_TCP = """\
  sl  local_address rem_address   st tx_queue rx_queue tr tm->when retrnsmt   uid  timeout inode
   0: 02004D0A:A104 01004D0A:0016 01 00000000:00000000 02:000AFC50 00000000     0        0 9001 1
   1: 02004D0A:1451 00000000:0000 0A 00000000:00000000 00:00000000 00000000     0        0 9002 1
   2: 0B4D1EAC:0016 014D1EAC:9BC4 01 00000000:00000000 02:000AFC50 00000000     0        0 9003 4
   3: 02004D0A:A105 01004D0A:0016 06 00000000:00000000 03:00000000 00000000     0        0 0 1
"""
SSHFS_SSH = (
    b"ssh\0-x\0-a\0-oClearAllForwardings=yes\0-oStrictHostKeyChecking=yes\0"
    b"-oIdentityFile=/root/.ssh/runcrate_cluster\0root@10.77.0.1\0-s\0sftp\0"
)


def test_it_finds_the_sockets_on_the_private_network_by_inode():
    assert pristine.private_sockets(PRIVATE_TCP) == {"9001", "9002"}


@pytest.mark.parametrize(
    ("cmdline", "fds", "why"),
    [
        (SSHFS_SSH, ["/dev/null", "socket:[1]"], "uses a cluster's key"),
        (
            b"sleep\x00600\x00",
            ["/root/.ssh/runcrate_cluster (deleted)"],
            "holds a cluster's key open",
        ),
        (b"ssh\0node-1\0", ["socket:[9001]"], "is connected over the private network"),
        (b"iperf3\0-s\0", ["socket:[9002]"], "is connected over the private network"),
        (b"/usr/sbin/sshd\0-D\0", ["socket:[9003]", "/dev/null"], None),
        (b"", ["/root/.ssh/runcrate_cluster"], None),  # a zombie: nothing to end
    ],
)
def test_a_process_is_the_clusters_by_its_key_or_its_private_connections(cmdline, fds, why):
    assert pristine.cluster_process(cmdline, fds, {"9001", "9002"}) == why


class FakeProc:
    """The SFTP calls `_cluster_processes` makes, over a fake /proc."""

    def __init__(self, processes: dict[str, tuple[str, bytes, dict[str, str]]]) -> None:
        self.processes = processes  # pid: (exe, cmdline, {fd: target})

    def listdir(self, path):
        if path == "/proc":
            return [*self.processes, "net", "self"]
        return list(self.processes[path.split("/")[2]][2])

    def lstat(self, path):
        import os

        return os.stat_result((0o100444, 0, 0, 1, 0, 0, 0, 0, 0, 0))

    def readlink(self, path):
        parts = path.split("/")
        exe, _, fds = self.processes[parts[2]]
        return exe if parts[3] == "exe" else fds[parts[4]]

    def open(self, path, mode):
        import io

        if path == "/proc/net/tcp":
            return io.BytesIO(PRIVATE_TCP.encode())
        return io.BytesIO(self.processes[path.split("/")[2]][1])


def test_it_names_every_cluster_process_it_reads_and_never_its_own_session():
    sftp = FakeProc(
        {
            "1": ("/usr/bin/tini", b"tini\0--\0", {"0": "/dev/null"}),
            "77": ("/usr/bin/ssh", SSHFS_SSH, {"3": "socket:[9001]"}),
            "80": ("/usr/lib/openssh/sftp-server", b"sftp-server\0", {"0": "socket:[9001]"}),
            "91": ("/usr/bin/sleep", b"sleep\x00600\x00", {"3": "/root/.ssh/runcrate_cluster"}),
        }
    )
    assert pristine._cluster_processes(sftp, bounds=pristine._Bounds(60), irregular={}) == [
        "77 uses a cluster's key: ssh -x -a -oClearAllForwardings=yes "
        "-oStrictHostKeyChecking=yes -oIdentityFile=/root/.ssh/runcrate_cluster "
        "root@10.77.0.1 -s sftp",
        "91 holds a cluster's key open: sleep 600",
    ]


def test_a_cluster_process_is_a_difference_whatever_the_baseline_says():
    now = baseline() | {"cluster_processes": ["77 uses a cluster's key: ssh -i k root@10.77.0.1"]}
    then = baseline() | {"programs": ["/usr/sbin/sshd", "/usr/bin/ssh"]}
    assert pristine.differences(then, now) == [
        pristine.Difference("process", "process 77 uses a cluster's key: ssh -i k root@10.77.0.1")
    ]


def test_the_report_for_staff_says_how_many_it_leaves_out():
    found = [pristine.Difference("file", f"/tmp/{i} was added") for i in range(pristine.SHOWN + 3)]
    lines = pristine.report(found).splitlines()
    assert len(lines) == pristine.SHOWN + 1
    assert lines[-1] == "… and 3 more differences."


def test_the_reimage_command_gets_the_host_in_its_environment(db, tmp_path):
    host = HostFactory(name="gpu-7", driver="ssh", address="203.0.113.7", port=2222)
    out = tmp_path / "env"
    command = f'echo "$RUNCRATE_HOST_NAME $RUNCRATE_HOST_ADDRESS $RUNCRATE_HOST_PORT" > {out}'

    assert pristine.run_reimage(host, command=command, timeout=10) is None
    assert out.read_text() == "gpu-7 203.0.113.7 2222\n"


def test_a_reimage_that_prints_a_new_host_key_hands_it_back(db):
    host = HostFactory(driver="ssh")
    key = "ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIOMqqnkVzrm0SdG6UOoqKLsabgH5C9okWi0dh2l9GKJl"
    command = f"echo rebuilding; echo 'host_key={key}'"
    assert pristine.run_reimage(host, command=command, timeout=10) == key


@pytest.mark.parametrize(
    "command, message",
    [
        ("echo 'BMC refused'; exit 3", "failed (exit status 3): BMC refused"),
        ("sleep 5", "did not finish within 1 seconds"),
    ],
)
def test_a_reimage_that_fails_or_hangs_says_so(db, command, message):
    host = HostFactory(name="gpu-8", driver="ssh")
    with pytest.raises(pristine.ReimageFailed) as failed:
        pristine.run_reimage(host, command=command, timeout=1)
    assert failed.value.message.startswith("the reimage of gpu-8 ")
    assert message in failed.value.message


class Planted:
    """An SFTP server over planted files: path -> bytes (a regular file), or a st_mode of
    something else (a FIFO, a link). Opening anything but a regular file fails the test: on a
    host it would hang (a FIFO) or never end (a link to /dev/zero)."""

    def __init__(self, files: dict[str, bytes | int], links: dict[str, str] | None = None):
        self.files = files
        self.links = links or {}
        self.opened: list[str] = []

    def lstat(self, path):
        import os

        if path not in self.files:
            raise FileNotFoundError(path)
        entry = self.files[path]
        mode = entry if isinstance(entry, int) else 0o100644
        size = 0 if isinstance(entry, int) else len(entry)
        return os.stat_result((mode, 0, 0, 1, 0, 0, size, 0, 0, 0))

    def readlink(self, path):
        return self.links[path]

    def open(self, path, mode):
        import io

        if path not in self.files:
            raise FileNotFoundError(path)
        entry = self.files[path]
        assert isinstance(entry, bytes), f"{path} is not a regular file and was opened"
        self.opened.append(path)
        return io.BytesIO(entry)


FIFO = 0o010644
LINK = 0o120777
PASSWD = b"root:x:0:0:root:/root:/bin/bash\nevil:x:1000:1000::/home/evil:/bin/sh\n"


def test_a_fifo_or_a_link_where_a_file_is_read_is_never_opened_and_is_a_difference():
    sftp = Planted(
        {
            "/etc/passwd": PASSWD,
            "/var/lib/dpkg/status": LINK,
            "/root/.ssh/authorized_keys": b"ssh-ed25519 AAAA staff\n",
            "/home/evil/.ssh/authorized_keys": FIFO,
            "/home/evil/.ssh/authorized_keys2": LINK,
        },
        links={
            "/var/lib/dpkg/status": "/dev/zero",
            "/home/evil/.ssh/authorized_keys2": "/dev/zero",
        },
    )
    bounds, irregular = pristine._Bounds(60), {}
    passwd = pristine._text(sftp, "/etc/passwd", bounds=bounds, irregular=irregular)
    status = pristine._text(sftp, "/var/lib/dpkg/status", bounds=bounds, irregular=irregular)
    keys = pristine._authorized_keys(sftp, passwd, bounds=bounds, irregular=irregular)

    assert status == ""
    assert sftp.opened == ["/etc/passwd", "/root/.ssh/authorized_keys"]
    assert irregular == {
        "/var/lib/dpkg/status": "a link to /dev/zero",
        "/home/evil/.ssh/authorized_keys": "a FIFO",
        "/home/evil/.ssh/authorized_keys2": "a link to /dev/zero",
    }
    now = baseline() | {"irregular": irregular}
    assert [d.message for d in pristine.differences(baseline(), now)] == [
        "/home/evil/.ssh/authorized_keys is a FIFO, not a regular file: not read",
        "/home/evil/.ssh/authorized_keys2 is a link to /dev/zero, not a regular file: not read",
        "/var/lib/dpkg/status is a link to /dev/zero, not a regular file: not read",
    ]
    assert set(keys) == {
        "/root/.ssh/authorized_keys",
        "/home/evil/.ssh/authorized_keys",
        "/home/evil/.ssh/authorized_keys2",
    }


def test_a_file_longer_than_its_cap_is_not_read_past_it(monkeypatch):
    monkeypatch.setattr(pristine, "READ_CAP", 1000)
    sftp = Planted({"/etc/passwd": PASSWD * 100})
    with pytest.raises(pristine.Unverified, match="more than the 1000 bytes"):
        pristine._text(sftp, "/etc/passwd", bounds=pristine._Bounds(60), irregular={})


def test_a_read_past_its_deadline_is_not_a_verification():
    bounds = pristine._Bounds(30)
    bounds.check()
    bounds.deadline -= 31  # 31 s later, on the monotonic clock
    with pytest.raises(pristine.Unverified, match="did not finish within 30 s"):
        pristine._text(Planted({"/etc/passwd": PASSWD}), "/etc/passwd", bounds=bounds, irregular={})


# --- the host's own hashing, and when it is believed (issue 33, item 8) ------------------------


class LocalSFTP:
    """The SFTP calls the reader makes, over a folder standing for the host's root."""

    def __init__(self, root) -> None:
        self.root = str(root)

    def _at(self, path: str) -> str:
        return self.root + path

    def lstat(self, path):
        import paramiko

        return paramiko.SFTPAttributes.from_stat(os.lstat(self._at(path)))

    def listdir_attr(self, path):
        import paramiko

        return [
            paramiko.SFTPAttributes.from_stat(os.lstat(f"{self._at(path)}/{name}"), name)
            for name in os.listdir(self._at(path))
        ]

    def listdir(self, path):
        return os.listdir(self._at(path))

    def readlink(self, path):
        return os.readlink(self._at(path))

    def open(self, path, mode):
        return LocalFile(self._at(path), "rb")


class LocalFile(io.FileIO):
    """A file LocalSFTP opened: read as paramiko's SFTPFile is."""

    def prefetch(self, file_size=None):
        """paramiko asks its reads ahead; a local file has nothing to ask."""


class HostRun:
    """The host's sha256sum run by `Session.run`: answers for the files under the root, and
    remembers every command; `meanwhile` runs during the first (a tenant's process)."""

    def __init__(self, root, meanwhile=None) -> None:
        self.root, self.meanwhile, self.commands = str(root), meanwhile, []

    def __call__(self, command, *, timeout, max_bytes, name):
        import hashlib
        import shlex

        self.commands.append(command)
        if self.meanwhile:
            self.meanwhile()
            self.meanwhile = None
        words = shlex.split(command)
        assert words[:4] == ["exec", pristine.TOOL, "--zero", "--"] and words[-1] == "2>/dev/null"
        out = ""
        for path in words[4:-1]:
            with open(self.root + path, "rb") as handle:
                out += f"{hashlib.sha256(handle.read()).hexdigest()}  {path}\0"
        return 0, out


def host_root(tmp_path):
    for folder in ("etc", "root", "usr/bin", "usr/local/bin", "var/lib/app"):
        (tmp_path / folder).mkdir(parents=True)
    (tmp_path / "etc/passwd").write_text("root:x:0:0:root:/root:/bin/bash\n")
    (tmp_path / "root/.bashrc").write_text("PS1='# '\n")
    with open(os.path.realpath(shutil.which("sha256sum") or "/usr/bin/sha256sum"), "rb") as tool:
        (tmp_path / "usr/bin/sha256sum").write_bytes(tool.read())  # an ELF program
    (tmp_path / "usr/bin/pgrep").write_bytes(b"#!/bin/sh\n" + b"x" * 100)
    (tmp_path / "usr/local/bin/big").write_bytes(b"y" * 3000)
    return tmp_path


def test_a_fresh_host_is_hashed_on_the_host_once_and_reads_as_its_baseline(tmp_path):
    root = host_root(tmp_path)
    run = HostRun(root)
    then = pristine.read(LocalSFTP(root), run=run)
    assert len(run.commands) == 1 and then["distrusted"] == []
    assert then["files"]["/usr/local/bin/big"].startswith("f 0644 ")
    assert then["files"]["/usr/local/bin/big"].split()[3:] == [
        "3000",
        hashlib.sha256(b"y" * 3000).hexdigest(),
    ]
    assert then["trust"]["/root/.bashrc"].startswith("/root/.bashrc 0644 ")

    now = pristine.read(LocalSFTP(root), run=HostRun(root), baseline=then)
    assert pristine.differences(then, now) == []


class CountingSFTP(LocalSFTP):
    """LocalSFTP that counts what it is asked: (call, path) -> times."""

    def __init__(self, root) -> None:
        super().__init__(root)
        self.asked: collections.Counter = collections.Counter()

    def lstat(self, path):
        self.asked["lstat", path] += 1
        return super().lstat(path)

    def readlink(self, path):
        self.asked["readlink", path] += 1
        return super().readlink(path)

    def open(self, path, mode):
        self.asked["open", path] += 1
        return super().open(path, mode)


def test_one_trust_read_asks_the_host_about_each_path_once(tmp_path):
    root = host_root(tmp_path)
    (root / "usr/lib").mkdir()
    (root / "lib").symlink_to("usr/lib")  # a merged image: /lib leads into /usr
    (root / "etc/pam.d").mkdir()
    for name in ("sshd", "login", "common-auth"):
        (root / "etc/pam.d" / name).write_text(f"# {name}\n")
    sftp = CountingSFTP(root)

    found = pristine.trust(sftp, PASSWD.decode(), user="root", bounds=pristine._Bounds(60))

    # Every folder on the way to the pam.d files, the program and the libraries it searches
    # for was asked about once, and each file opened once, however many paths lead there.
    assert found["/etc/pam.d/sshd"].startswith("/etc/pam.d/sshd 0644 ")
    assert found[pristine.TOOL].startswith(f"{pristine.TOOL} 0644 0:0 ")
    assert sftp.asked["lstat", "/etc"] == 1 and sftp.asked["lstat", "/lib"] == 1
    assert max(sftp.asked.values()) == 1, sftp.asked.most_common(3)
    # The second trust read of `read` asks again: a change meanwhile is seen (next tests).
    pristine.trust(sftp, PASSWD.decode(), user="root", bounds=pristine._Bounds(60))
    assert sftp.asked["lstat", "/etc"] == 2


def test_a_changed_file_the_host_hashing_depends_on_means_the_host_is_never_asked(tmp_path):
    root = host_root(tmp_path)
    then = pristine.read(LocalSFTP(root), run=HostRun(root))
    (root / "root/.bashrc").write_text("sha256sum() { echo lies; }\n")
    # Same size, new content: only a hash finds it, and the host's is not believed now.
    (root / "usr/bin/pgrep").write_bytes(b"#!/bin/sh\n" + b"z" * 100)
    (root / "var/lib/app/planted").write_text("x")
    run = HostRun(root)

    now = pristine.read(LocalSFTP(root), run=run, baseline=then)

    assert run.commands == []
    assert now["distrusted"] == ["/root/.bashrc is not what it was"]
    assert now["files"]["/usr/bin/pgrep"].endswith(" ?")
    messages = [d.message for d in pristine.differences(then, now)]
    assert messages[0].startswith("the host's own sha256sum was not trusted")
    assert "/root/.bashrc is not what it was" in messages[0]
    assert "/var/lib/app/planted was added" in messages
    assert "/usr/bin/pgrep changed" not in messages  # no content claimed, same size


def test_what_the_hashing_depends_on_changing_while_it_runs_is_not_believed(tmp_path):
    root = host_root(tmp_path)
    then = pristine.read(LocalSFTP(root), run=HostRun(root))
    swap = lambda: (root / "usr/bin/sha256sum").write_bytes(b"\x7fELF another")  # noqa: E731

    now = pristine.read(LocalSFTP(root), run=HostRun(root, meanwhile=swap), baseline=then)

    assert now["distrusted"] == ["what the host's sha256sum depends on changed while it ran"]
    assert all(not e.startswith("f ") or e.endswith(" ?") for e in now["files"].values())


@pytest.mark.parametrize(
    ("change", "reason"),
    [
        ({"trust": {"/usr/bin/sha256sum": "/usr/bin/sha256sum 0755 0:0 bb"}}, "is not what it was"),
        ({"trust": {"/usr/bin/sha256sum": "/usr/bin/sha256sum 0755 0:0 aa",
                    "/etc/ld.so.preload": "/etc/ld.so.preload 0644 0:0 cc"}},
         "/etc/ld.so.preload is new"),
        ({"trust": {}}, "/usr/bin/sha256sum is gone"),
        ({"programs": ["/usr/sbin/sshd", "/usr/bin/perl"]},
         "/usr/bin/perl is running, which the baseline had not"),
        ({"cluster_processes": ["77 uses a cluster's key: ssh"]}, "a cluster's process"),
    ],
)  # fmt: skip
def test_the_host_hashing_is_believed_only_when_all_it_depends_on_is_as_it_was(change, reason):
    then = baseline() | {"trust": {"/usr/bin/sha256sum": "/usr/bin/sha256sum 0755 0:0 aa"}}
    assert pristine.distrust(then, then) == []
    assert pristine.distrust(None, then | change) == []  # recording: staff vouch for it
    reasons = pristine.distrust(then, then | change)
    assert len(reasons) == 1 and reason in reasons[0]


def test_a_program_the_dashboard_cannot_read_the_libraries_of_is_never_believed():
    script = {
        "/bin/bash": f"/usr/bin/bash 0755 0:0 aa (not an ELF program: {pristine.NEVER_TRUSTED})"
    }
    then = baseline() | {"trust": script}
    [reason] = pristine.distrust(then, then)
    assert reason.startswith("/bin/bash: ") and "not an ELF program" in reason


def test_a_baseline_of_an_older_version_is_one_difference_that_says_record_it_again(db):
    old = baseline() | {"version": 1, "files": {}}
    [only] = pristine.differences(old, baseline())
    assert only.what == "baseline" and "Record baseline again" in only.message
    # Nothing is read: the host's address leads nowhere.
    host = HostFactory(driver="ssh", address="192.0.2.1", baseline=old)
    from clusters.machines.ssh import verify_host

    assert verify_host(host) == [only]


def test_the_hosts_answer_is_taken_only_as_records_of_the_files_asked():
    digest = "a" * 64
    batch = ["/a", "/b\n" + "f" * 64 + "  /etc/x", "/c"]
    assert pristine.parse_hashes(f"{digest}  {batch[1]}\0{digest}  /c\0", batch) == {
        "/a": "unreadable",
        batch[1]: digest,
        "/c": digest,
    }
    for forged in (f"{digest}  /etc/shadow\0", f"{digest}  /c\0{digest}  /a\0", f"{digest}  /a"):
        with pytest.raises(pristine.Unverified):
            pristine.parse_hashes(forged, batch)


def test_batches_fit_one_command_and_spread_the_content():
    sizes = {f"/usr/lib/{i:05d}-{'x' * 80}": 1 for i in range(3000)}
    sizes |= {"/usr/local/big-1": 2 * pristine.BATCH_BYTES, "/usr/local/big-2": 10}
    batches = pristine._batches(sizes)
    assert sorted(p for b in batches for p in b) == sorted(sizes)
    assert batches[0] == ["/usr/local/big-1"]  # alone, and first
    assert all(len(" ".join(b)) <= pristine.BATCH_COMMAND for b in batches)


def test_it_reads_the_interpreter_and_libraries_of_a_real_program():
    real = os.path.realpath(shutil.which("sha256sum") or "/usr/bin/sha256sum")
    with open(real, "rb") as handle:
        program = pristine.elf_program(handle.read())
    assert program is not None
    interpreter, needed, _ = program
    assert interpreter and interpreter.startswith("/lib") and "libc.so.6" in needed
    assert pristine.elf_program(b"#!/bin/sh\necho\n") is None
