"""X-Runcrate-Signature and the receiver's documented check, `verify`."""

import pytest

from notifications.signing import SignatureInvalid, sign, signature, verify

SECRET = "whsec_test"
BODY = b'{"type":"cluster.ready","created":1900000000,"data":{}}'
T = 1_900_000_000


def test_it_signs_the_time_and_the_body_with_hmac_sha256():
    header = sign(SECRET, BODY, timestamp=T)

    assert header == f"t={T},v1={signature(SECRET, T, BODY)}"
    assert verify(SECRET, header, BODY, now=T + 299) == T


def test_it_refuses_a_replay_signed_longer_ago_than_the_tolerance():
    header = sign(SECRET, BODY, timestamp=T)

    with pytest.raises(SignatureInvalid, match="beyond 300 s"):
        verify(SECRET, header, BODY, now=T + 301)
    assert verify(SECRET, header, BODY, now=T + 301, tolerance=600) == T


def test_it_refuses_an_altered_body():
    header = sign(SECRET, BODY, timestamp=T)

    with pytest.raises(SignatureInvalid, match="matches"):
        verify(SECRET, header, BODY.replace(b"ready", b"fails"), now=T)


def test_it_refuses_an_altered_time_or_another_secret():
    v1 = signature(SECRET, T, BODY)

    with pytest.raises(SignatureInvalid):
        verify(SECRET, f"t={T + 1},v1={v1}", BODY, now=T)
    with pytest.raises(SignatureInvalid):
        verify("whsec_other", sign(SECRET, BODY, timestamp=T), BODY, now=T)


@pytest.mark.parametrize("header", ["", "v1=abc", "t=soon,v1=abc", f"t={T}"])
def test_it_refuses_a_malformed_header(header):
    with pytest.raises(SignatureInvalid):
        verify(SECRET, header, BODY, now=T)
