"""The rules for SSH public keys (accounts/keys.py), shared by the pages, the API and admin."""

import pytest
from cryptography.hazmat.primitives.asymmetric import ec

from accounts.keys import KeyRefused, add_ssh_key, parse_public_key
from accounts.models import SshKey
from tests.accounts.sshkeys import (
    KEYGEN_ECDSA384,
    KEYGEN_ECDSA384_FINGERPRINT,
    KEYGEN_ED25519,
    KEYGEN_ED25519_FINGERPRINT,
    blob_of,
    ecdsa_line,
    ed25519_line,
    keygen_fingerprint,
    line_of,
    private_key_pem,
    rsa_line,
    wire,
)


def test_it_fingerprints_a_key_exactly_as_ssh_keygen_does():
    assert parse_public_key(KEYGEN_ED25519).fingerprint == KEYGEN_ED25519_FINGERPRINT
    assert parse_public_key(KEYGEN_ECDSA384).fingerprint == KEYGEN_ECDSA384_FINGERPRINT


def test_it_adds_a_generated_ed25519_key_with_its_fingerprint(owner):
    line = ed25519_line("alice@laptop")

    key = add_ssh_key(project=owner.project, user=owner.user, name="laptop", public_key=line)

    key.refresh_from_db()
    assert key.project == owner.project
    assert key.created_by == owner.user
    assert key.name == "laptop"
    assert key.key_type == "ssh-ed25519"
    assert key.fingerprint == keygen_fingerprint(line)
    assert key.public_key == line


def test_it_adds_a_generated_rsa_key_with_its_fingerprint(owner):
    line = rsa_line(3072, "ci")

    key = add_ssh_key(project=owner.project, user=owner.user, name="", public_key=line)

    assert key.key_type == "ssh-rsa"
    assert key.fingerprint == keygen_fingerprint(line)
    assert key.name == "ci", "an empty name takes the key's comment"


@pytest.mark.parametrize(
    ("curve", "key_type"),
    [
        (ec.SECP256R1(), "ecdsa-sha2-nistp256"),
        (ec.SECP384R1(), "ecdsa-sha2-nistp384"),
        (ec.SECP521R1(), "ecdsa-sha2-nistp521"),
    ],
)
def test_it_accepts_every_ecdsa_curve(curve, key_type):
    line = ecdsa_line(curve)

    parsed = parse_public_key(line)

    assert parsed.key_type == key_type
    assert parsed.fingerprint == keygen_fingerprint(line)


def test_it_accepts_security_key_types():
    ed_point = blob_of(ed25519_line())[-32:]
    sk_ed = wire(b"sk-ssh-ed25519@openssh.com", ed_point, b"ssh:")
    ec_point = blob_of(ecdsa_line(ec.SECP256R1()))[-65:]
    sk_ec = wire(b"sk-ecdsa-sha2-nistp256@openssh.com", b"nistp256", ec_point, b"ssh:")

    assert parse_public_key(line_of("sk-ssh-ed25519@openssh.com", sk_ed)).bits == 256
    assert parse_public_key(line_of("sk-ecdsa-sha2-nistp256@openssh.com", sk_ec)).bits == 256


def test_it_keeps_the_key_in_one_canonical_line():
    line = ed25519_line()
    messy = f"\n  {line.split()[0]}   {line.split()[1]}   my  laptop \n"

    assert parse_public_key(messy).openssh == f"{line} my  laptop"


def _rsa_1024() -> str:
    return rsa_line(1024)


def _truncated_blob() -> str:
    line = ed25519_line()
    return line_of("ssh-ed25519", blob_of(line)[:30])


def _line_cut_short() -> str:
    return ed25519_line()[:50]


def _type_mismatch() -> str:
    return line_of("ssh-rsa", blob_of(ed25519_line()))


def _extra_data() -> str:
    return line_of("ssh-ed25519", blob_of(ed25519_line()) + wire(b"more"))


def _ecdsa_point_off_the_curve() -> str:
    blob = bytearray(blob_of(ecdsa_line(ec.SECP256R1())))
    blob[-1] ^= 0x01
    return line_of("ecdsa-sha2-nistp256", bytes(blob))


def _ecdsa_wrong_curve() -> str:
    point = blob_of(ecdsa_line(ec.SECP256R1()))[-65:]
    return line_of("ecdsa-sha2-nistp256", wire(b"ecdsa-sha2-nistp256", b"nistp384", point))


BAD_KEYS = [
    ("empty", lambda: "   ", "Paste a public key"),
    ("not a key", lambda: "hello world", "not an OpenSSH public key"),
    ("one word", lambda: "ssh-ed25519", "not an OpenSSH public key"),
    ("private key", private_key_pem, "This is a private key"),
    ("unknown type", lambda: "ssh-dss AAAAB3NzaC1kc3MAAACBAP", "Unknown key type 'ssh-dss'"),
    ("certificate", lambda: "ssh-ed25519-cert-v01@openssh.com AAAA", "Unknown key type"),
    ("not base64", lambda: "ssh-ed25519 AAAA$$$$-not-base64", "not valid base64"),
    ("blob truncated", _truncated_blob, "truncated"),
    ("line cut short", _line_cut_short, "truncated"),
    ("type mismatch", _type_mismatch, "holds a 'ssh-ed25519' key"),
    ("extra data", _extra_data, "extra data"),
    ("rsa too short", _rsa_1024, "RSA key is 1024 bits, too short"),
    ("ecdsa point off the curve", _ecdsa_point_off_the_curve, "is not a valid key"),
    ("ecdsa wrong curve", _ecdsa_wrong_curve, "names the wrong curve"),
    ("two keys", lambda: ed25519_line() + "\n" + ed25519_line(), "one key at a time"),
    (
        "ssh2 format",
        lambda: "---- BEGIN SSH2 PUBLIC KEY ----\nAAAA\n---- END SSH2 PUBLIC KEY ----",
        "ssh-keygen -i",
    ),
]


@pytest.mark.parametrize(
    ("make_key", "message"),
    [(make, message) for _, make, message in BAD_KEYS],
    ids=[kind for kind, _, _ in BAD_KEYS],
)
def test_it_refuses_a_bad_key_with_what_is_wrong_and_saves_nothing(owner, make_key, message):
    with pytest.raises(KeyRefused) as refused:
        add_ssh_key(project=owner.project, user=owner.user, name="bad", public_key=make_key())

    assert refused.value.code == "invalid_ssh_key"
    assert refused.value.field == "public_key"
    assert message in refused.value.message
    assert not SshKey.objects.exists()


def test_it_refuses_a_key_already_in_the_project(owner):
    line = ed25519_line()
    add_ssh_key(project=owner.project, user=owner.user, name="first", public_key=line)

    with pytest.raises(KeyRefused) as refused:
        add_ssh_key(project=owner.project, user=owner.user, name="again", public_key=line + " x")

    assert refused.value.code == "ssh_key_exists"
    assert refused.value.status == 409
    assert "already in your project, as 'first'" in refused.value.message
    assert SshKey.objects.count() == 1


def test_it_lets_two_projects_hold_the_same_key(owner, stranger):
    line = ed25519_line()
    add_ssh_key(project=owner.project, user=owner.user, name="mine", public_key=line)

    add_ssh_key(project=stranger.project, user=stranger.user, name="mine too", public_key=line)

    assert SshKey.objects.count() == 2


def test_it_needs_a_name_when_the_key_has_no_comment(owner):
    with pytest.raises(KeyRefused) as refused:
        add_ssh_key(project=owner.project, user=owner.user, name=" ", public_key=ed25519_line())

    assert refused.value.code == "invalid_name"
    assert refused.value.field == "name"
    assert not SshKey.objects.exists()


def test_it_refuses_a_name_that_is_too_long(owner):
    with pytest.raises(KeyRefused, match="keep it to 100"):
        add_ssh_key(
            project=owner.project, user=owner.user, name="x" * 101, public_key=ed25519_line()
        )

    assert not SshKey.objects.exists()
