"""`runcrate ssh-keys list|add|remove` against a live server: add from the default file in the
test's HOME and from stdin, refusals passed through (a duplicate, a damaged key), a missing
default file and a private key refused before any request, removal (confirmed) by id, name or
fingerprint, and a CLI-only user who had no key and can create a cluster once one is added."""

import base64
import hashlib
import json
from pathlib import Path

import pytest
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from accounts import keys
from accounts.models import SshKey
from clusters.models import Cluster
from tests.cli.kit import assert_no_traceback, cli_env, run_cli, run_cli_tty
from tests.clusters.lifecycle_kit import inventory, new_project
from tests.factories import issue_key

pytestmark = pytest.mark.django_db(transaction=True)

# Nothing listens here: a command that sent a request would fail `unreachable` instead.
NOWHERE = "http://127.0.0.1:9"


def keypair(comment: str = "me@laptop") -> tuple[str, str]:
    """A fresh Ed25519 key: its OpenSSH private key file and its public line."""
    private = Ed25519PrivateKey.generate()
    pem = private.private_bytes(
        serialization.Encoding.PEM,
        serialization.PrivateFormat.OpenSSH,
        serialization.NoEncryption(),
    ).decode()
    public = private.public_key().public_bytes(
        serialization.Encoding.OpenSSH, serialization.PublicFormat.OpenSSH
    )
    line = public.decode() + (f" {comment}" if comment else "")
    return pem, line


def fingerprint(line: str) -> str:
    blob = base64.b64decode(line.split()[1])
    return "SHA256:" + base64.b64encode(hashlib.sha256(blob).digest()).decode().rstrip("=")


def home_key(env: dict[str, str], line: str) -> Path:
    ssh_dir = Path(env["HOME"]) / ".ssh"
    ssh_dir.mkdir(exist_ok=True)
    path = ssh_dir / "id_ed25519.pub"
    path.write_text(line + "\n")
    return path


def test_it_adds_the_default_key_from_home_and_lists_it(env, tmp_path, account):
    _, line = keypair("me@laptop")
    home_key(env, line)

    added = run_cli("ssh-keys", "add", env=env, tmp_path=tmp_path)

    assert added.code == 0, added.stderr
    key = SshKey.objects.get(project=account.project, fingerprint=fingerprint(line))
    assert key.name == "me@laptop"  # the key's comment
    assert added.json()["id"] == key.pk and added.json()["fingerprint"] == fingerprint(line)
    listed = run_cli("ssh-keys", "list", env=env, tmp_path=tmp_path)
    assert listed.code == 0, listed.stderr
    assert listed.json() == account.api_data("/ssh-keys")
    assert key.pk in [k["id"] for k in listed.json()]


def test_it_adds_a_key_from_stdin_under_the_name_given(env, tmp_path, account):
    _, line = keypair(comment="")

    added = run_cli("ssh-keys", "add", "-", "--name", "ci runner", env=env, tmp_path=tmp_path,
                    stdin=line + "\n")  # fmt: skip

    assert added.code == 0, added.stderr
    key = SshKey.objects.get(project=account.project, fingerprint=fingerprint(line))
    assert key.name == "ci runner" and key.public_key == line


def test_a_key_from_stdin_without_a_comment_or_name_asks_for_a_name(tmp_path, account):
    env = cli_env(tmp_path / "home", url=NOWHERE, key=account.key)
    _, line = keypair(comment="")

    result = run_cli("ssh-keys", "add", "-", env=env, tmp_path=tmp_path, stdin=line)

    assert result.code == 1
    assert result.json()["error"]["code"] == "invalid_name"
    assert "--name" in result.stderr


def test_a_key_without_a_comment_is_named_after_its_file(env, tmp_path, account):
    _, line = keypair(comment="")
    path = tmp_path / "deploy.pub"
    path.write_text(line)

    added = run_cli("ssh-keys", "add", str(path), env=env, tmp_path=tmp_path)

    assert added.code == 0, added.stderr
    assert SshKey.objects.get(project=account.project, name="deploy.pub")


def test_a_key_already_in_the_project_is_refused_with_the_apis_code(env, tmp_path, account):
    _, line = keypair("me@laptop")
    home_key(env, line)
    assert run_cli("ssh-keys", "add", env=env, tmp_path=tmp_path).code == 0

    again = run_cli("ssh-keys", "add", "-", "--name", "other", env=env, tmp_path=tmp_path,
                    stdin=line)  # fmt: skip

    assert again.code == 1
    assert again.json()["error"]["code"] == "ssh_key_exists"
    assert "already in your project, as 'me@laptop'" in again.stderr
    assert SshKey.objects.filter(project=account.project, fingerprint=fingerprint(line)).count()
    assert not SshKey.objects.filter(project=account.project, name="other").exists()
    assert_no_traceback(again)


def test_a_damaged_key_is_refused_with_the_servers_message(env, tmp_path, account):
    _, line = keypair()
    kind, data, comment = line.split()
    truncated = f"{kind} {data[:40]} {comment}"
    with pytest.raises(keys.KeyRefused) as refusal:
        keys.parse_public_key(truncated)

    result = run_cli("ssh-keys", "add", "-", env=env, tmp_path=tmp_path, stdin=truncated)

    assert result.code == 1
    assert result.json()["error"]["code"] == "invalid_ssh_key"
    assert refusal.value.message in result.stderr
    assert SshKey.objects.filter(project=account.project).count() == 1  # the fixture's


def test_a_missing_default_key_says_how_to_make_one_and_sends_nothing(tmp_path, account):
    env = cli_env(tmp_path / "home", url=NOWHERE, key=account.key)

    result = run_cli("ssh-keys", "add", env=env, tmp_path=tmp_path)

    assert result.code == 1
    assert result.json()["error"]["code"] == "no_public_key"
    assert "There is no ~/.ssh/id_ed25519.pub" in result.stderr
    assert "ssh-keygen -t ed25519" in result.stderr
    assert_no_traceback(result)


def test_another_key_in_ssh_is_suggested_when_the_default_is_missing(tmp_path, account):
    env = cli_env(tmp_path / "home", url=NOWHERE, key=account.key)
    ssh_dir = tmp_path / "home" / ".ssh"
    ssh_dir.mkdir()
    (ssh_dir / "id_rsa.pub").write_text("ssh-rsa AAAA me@laptop\n")

    result = run_cli("ssh-keys", "add", env=env, tmp_path=tmp_path)

    assert result.code == 1
    assert f"runcrate ssh-keys add {ssh_dir / 'id_rsa.pub'}" in result.stderr


@pytest.mark.parametrize("source", ["file", "stdin"])
def test_a_private_key_is_refused_before_any_request_and_never_printed(source, tmp_path, account):
    env = cli_env(tmp_path / "home", url=NOWHERE, key=account.key)
    pem, _ = keypair()
    path = tmp_path / "id_ed25519"
    path.write_text(pem)
    args, stdin = (["ssh-keys", "add", str(path)], None) if source == "file" else (
        ["ssh-keys", "add", "-"], pem
    )  # fmt: skip

    result = run_cli(*args, env=env, tmp_path=tmp_path, stdin=stdin)

    assert result.code == 1
    assert result.json()["error"]["code"] == "private_key"  # not `unreachable`: nothing sent
    assert "private key" in result.stderr and "nothing was sent" in result.stderr
    if source == "file":
        assert f"({path}.pub)" in result.stderr  # the public half beside it
    secret_lines = [line for line in pem.splitlines() if line and "-----" not in line]
    for secret in secret_lines:
        assert secret not in result.stdout + result.stderr


def test_it_removes_a_key_by_name_fingerprint_or_id_after_confirming(env, tmp_path, account):
    lines = [keypair(f"comment-{i}")[1] for i in range(3)]
    for i, line in enumerate(lines):
        added = run_cli("ssh-keys", "add", "-", "--name", f"added-{i}", env=env,
                        tmp_path=tmp_path, stdin=line)  # fmt: skip
        assert added.code == 0, added.stderr
    first, _, last = SshKey.objects.filter(name__startswith="added-").order_by("name")

    unconfirmed = run_cli("ssh-keys", "remove", "added-0", env=env, tmp_path=tmp_path)
    assert unconfirmed.code == 2
    assert "nothing was removed; pass --yes" in unconfirmed.stderr
    assert SshKey.objects.filter(pk=first.pk).exists()

    for ref in ("added-0", fingerprint(lines[1]), str(last.pk)):
        removed = run_cli("ssh-keys", "remove", ref, "--yes", env=env, tmp_path=tmp_path)
        assert removed.code == 0, removed.stderr
    assert removed.json() == {"id": last.pk, "removed": True}
    names = {k["name"] for k in account.api_data("/ssh-keys")}
    assert names == {"key-0"}  # only the fixture's key is left


def test_on_a_terminal_remove_asks_and_a_no_keeps_the_key(env, tmp_path, account):
    key = SshKey.objects.get(project=account.project)

    kept = run_cli_tty("ssh-keys", "remove", key.name, env=env, tmp_path=tmp_path, answer="n")
    assert kept.code == 2
    assert "Nothing was removed" in kept.stderr
    assert f"Remove SSH key {key.name} (id {key.pk}, {key.fingerprint})?" in kept.stdout
    assert SshKey.objects.filter(pk=key.pk).exists()

    removed = run_cli_tty("ssh-keys", "remove", key.name, env=env, tmp_path=tmp_path, answer="y")
    assert removed.code == 0, removed.stderr
    assert f"Removed SSH key {key.name} (id {key.pk})." in removed.stdout
    assert not SshKey.objects.filter(pk=key.pk).exists()
    assert "no SSH key left" in removed.stderr  # it was the last one


def test_removing_an_unknown_or_ambiguous_key_removes_nothing(env, tmp_path, account):
    for _ in range(2):
        line = keypair()[1]
        run_cli("ssh-keys", "add", "-", "--name", "twin", env=env, tmp_path=tmp_path, stdin=line)

    unknown = run_cli("ssh-keys", "remove", "nope", "--yes", env=env, tmp_path=tmp_path)
    ambiguous = run_cli("ssh-keys", "remove", "twin", "--yes", env=env, tmp_path=tmp_path)

    assert unknown.code == 1 and unknown.json()["error"]["code"] == "not_found"
    assert ambiguous.code == 1 and ambiguous.json()["error"]["code"] == "ambiguous_ssh_key"
    assert "give the id or the fingerprint" in ambiguous.stderr
    assert SshKey.objects.filter(project=account.project).count() == 3


def test_with_json_on_a_terminal_a_refusal_is_the_apis_envelope_on_stdout(env, tmp_path, account):
    result = run_cli_tty(
        "ssh-keys", "remove", "nope", "--yes", "--json", env=env, tmp_path=tmp_path
    )

    assert result.code == 1
    assert json.loads(result.stdout)["error"]["code"] == "not_found"


@pytest.mark.parametrize("columns", [80, 160])
def test_the_list_shows_whole_ids_names_and_fingerprints(columns, env, tmp_path, account):
    _, line = keypair()
    run_cli("ssh-keys", "add", "-", "--name", "laptop@studio", env=env, tmp_path=tmp_path,
            stdin=line)  # fmt: skip

    result = run_cli_tty("ssh-keys", "list", env=env, tmp_path=tmp_path, columns=columns)

    assert result.code == 0, result.stderr
    lines = [line.rstrip() for line in result.stdout.splitlines()]
    assert max(len(line) for line in lines) <= columns, result.stdout
    for key in SshKey.objects.filter(project=account.project):
        if columns == 160:  # a table: one row per key
            row = next(line for line in lines if f" {key.fingerprint} " in line)
            assert f" {key.pk} " in row and f" {key.name} " in row
        else:  # too narrow for a 50-character fingerprint beside the rest: a block per key
            assert f"fingerprint  {key.fingerprint}" in lines
            assert f"name         {key.name}" in lines
    assert_no_traceback(result)


def test_a_cli_only_user_without_a_key_can_create_once_one_is_added(tmp_path, live_server, sim):
    user, project = new_project(keys=0)
    env = cli_env(tmp_path / "home", url=live_server.url, key=issue_key(user=user, project=project))
    offer = inventory(hosts=2)
    create = (
        "clusters", "create", "--offer", offer.slug, "--nodes", "2", "--name", "first", "--yes",
    )  # fmt: skip

    refused = run_cli(*create, env=env, tmp_path=tmp_path)
    assert refused.code == 1
    assert refused.json()["error"]["code"] == "no_ssh_keys"
    assert not Cluster.objects.filter(project=project).exists()

    _, line = keypair("me@laptop")
    home_key(env, line)
    added = run_cli("ssh-keys", "add", env=env, tmp_path=tmp_path)
    assert added.code == 0, added.stderr

    created = run_cli(*create, env=env, tmp_path=tmp_path)
    assert created.code == 0, created.stderr
    cluster = Cluster.objects.get(project=project)
    assert [k.fingerprint for k in cluster.ssh_keys.all()] == [fingerprint(line)]
