"""Real OpenSSH public keys for tests, made with `cryptography`, and blob surgery helpers."""

import base64
import hashlib
import struct

from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import ec, ed25519, rsa

# Made with `ssh-keygen -t ed25519 -C alice@laptop`; `ssh-keygen -lf` printed the fingerprint.
KEYGEN_ED25519 = (
    "ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIOhElcKRaPCZGIgoYfrTKnpVfYrMWJDP8Sn4Wixc28cF alice@laptop"
)
KEYGEN_ED25519_FINGERPRINT = "SHA256:6oo15xvd/dWuQrQmf4tlIV/pTqNN0swmOQBh6kdNPhQ"
# `ssh-keygen -t ecdsa -b 384 -C e`, and what `ssh-keygen -lf` printed.
KEYGEN_ECDSA384 = (
    "ecdsa-sha2-nistp384 AAAAE2VjZHNhLXNoYTItbmlzdHAzODQAAAAIbmlzdHAzODQAAABhBEWFS6D6Yd3RVE/1Pvzq"
    "fhNHI0o7/plXe1g/HKAllU/wS0QyAC0CJW6P7ChVrMcVgbEzfbNhE5xrvvsv2A7SUWalztUEfQmmaCUjkpbEtTzVzdJg"
    "bpS16nq5pO7+MMTxNA== e"
)
KEYGEN_ECDSA384_FINGERPRINT = "SHA256:lmPi9PBoynQUAzpWYWNdr3PnO8g/tXTsvbOoMYp66uA"

_OPENSSH = (serialization.Encoding.OpenSSH, serialization.PublicFormat.OpenSSH)


def ed25519_line(comment: str = "") -> str:
    line = ed25519.Ed25519PrivateKey.generate().public_key().public_bytes(*_OPENSSH).decode()
    return f"{line} {comment}".strip()


def rsa_line(bits: int = 2048, comment: str = "") -> str:
    key = rsa.generate_private_key(public_exponent=65537, key_size=bits)
    return f"{key.public_key().public_bytes(*_OPENSSH).decode()} {comment}".strip()


def ecdsa_line(curve: ec.EllipticCurve, comment: str = "") -> str:
    key = ec.generate_private_key(curve)
    return f"{key.public_key().public_bytes(*_OPENSSH).decode()} {comment}".strip()


def private_key_pem() -> str:
    return (
        ed25519.Ed25519PrivateKey.generate()
        .private_bytes(
            serialization.Encoding.PEM,
            serialization.PrivateFormat.OpenSSH,
            serialization.NoEncryption(),
        )
        .decode()
    )


def blob_of(line: str) -> bytes:
    return base64.b64decode(line.split()[1])


def line_of(key_type: str, blob: bytes, comment: str = "") -> str:
    return f"{key_type} {base64.b64encode(blob).decode()} {comment}".strip()


def wire(*parts: bytes) -> bytes:
    """SSH wire format: each part as a uint32-length-prefixed string."""
    return b"".join(struct.pack(">I", len(part)) + part for part in parts)


def keygen_fingerprint(line: str) -> str:
    """What `ssh-keygen -lf` prints: base64 of the blob's SHA256, without the padding."""
    digest = hashlib.sha256(blob_of(line)).digest()
    return "SHA256:" + base64.b64encode(digest).decode().rstrip("=")
