"""The kubeconfig users download: node-0's API at an address that works (directly, or through
an SSH tunnel behind a gateway, named or by IP), verified against the cluster's own CA, which
is derived from the secret key and the cluster, byte for byte the same every time."""

import base64
import ipaddress
import json
from datetime import UTC, datetime, timedelta

import pytest
import yaml
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID
from cryptography.x509.verification import PolicyBuilder, Store, VerificationError

from clusters.connect import (
    ClusterShape,
    NodeAccess,
    NoRoute,
    details,
    kube_api_server,
    kube_ca,
    kube_tunnel,
    kubeconfig,
)


def shape(*, gateway: str | None = None, cluster_id: int = 42, name: str = "train"):
    return ClusterShape(
        cluster_id=cluster_id,
        name=name,
        nodes=tuple(
            NodeAccess(index=i, address=None if gateway else f"203.0.113.{10 + i}")
            for i in range(2)
        ),
        gpus_per_node=8,
        machine_kind="vm",
        software="kubernetes",
        gateway=gateway,
    )


def certificate_of(config: dict) -> x509.Certificate:
    data = config["clusters"][0]["cluster"]["certificate-authority-data"]
    return x509.load_pem_x509_certificate(base64.b64decode(data))


def serving_certificate(ca_key_pem: str, ca: x509.Certificate, ip: str) -> x509.Certificate:
    """What k3s makes for its API with the CA's key: a leaf naming `ip`."""
    ca_key = serialization.load_pem_private_key(ca_key_pem.encode(), password=None)
    key = ec.generate_private_key(ec.SECP256R1())
    now = datetime.now(UTC)
    return (
        x509.CertificateBuilder()
        .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "k3s")]))
        .issuer_name(ca.subject)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - timedelta(minutes=1))
        .not_valid_after(now + timedelta(days=1))
        .add_extension(
            x509.SubjectAlternativeName([x509.IPAddress(ipaddress.ip_address(ip))]),
            critical=False,
        )
        .add_extension(x509.ExtendedKeyUsage([ExtendedKeyUsageOID.SERVER_AUTH]), critical=False)
        .add_extension(
            x509.AuthorityKeyIdentifier.from_issuer_public_key(ca.public_key()), critical=False
        )
        .sign(ca_key, hashes.SHA256())
    )


def test_it_points_the_kubeconfig_at_the_head_and_trusts_the_clusters_own_ca(settings):
    settings.SECRET_KEY = "k" * 50
    text = kubeconfig(shape())
    config = yaml.safe_load(text)
    token = config["users"][0]["user"]["token"]
    data = config["clusters"][0]["cluster"]["certificate-authority-data"]
    assert config == {
        "apiVersion": "v1",
        "kind": "Config",
        "clusters": [
            {
                "name": "train",
                "cluster": {
                    # The local end of the tunnel: node-0's firewall lets only SSH in.
                    "server": "https://127.0.0.1:20042",
                    "certificate-authority-data": data,
                },
            }
        ],
        "users": [{"name": "train-admin", "user": {"token": token}}],
        "contexts": [{"name": "train", "context": {"cluster": "train", "user": "train-admin"}}],
        "current-context": "train",
    }
    assert "insecure" not in text
    assert len(token) == 64 and int(token, 16) >= 0

    ca = certificate_of(config)
    assert ca.subject.get_attributes_for_oid(NameOID.COMMON_NAME)[0].value == (
        "train Kubernetes CA"
    )
    assert ca.extensions.get_extension_for_class(x509.BasicConstraints).value.ca is True
    assert ca.extensions.get_extension_for_class(x509.KeyUsage).value.key_cert_sign is True
    assert isinstance(ca.public_key(), ec.EllipticCurvePublicKey)
    assert ca.public_key().curve.name == "secp256r1"
    ca.verify_directly_issued_by(ca)  # self-signed

    settings.SECRET_KEY = "z" * 50
    other = yaml.safe_load(kubeconfig(shape()))
    assert other["users"][0]["user"]["token"] != token
    assert other["clusters"][0]["cluster"]["certificate-authority-data"] != data


def test_it_makes_the_same_ca_every_time_and_another_for_another_cluster(settings):
    settings.SECRET_KEY = "k" * 50
    first, again = kube_ca(shape()), kube_ca(shape())
    assert first == again  # the certificate and the key, byte for byte
    assert kubeconfig(shape()) == kubeconfig(shape())
    assert kube_ca(shape(cluster_id=43)).certificate != first.certificate
    assert kube_ca(shape(cluster_id=43)).key != first.key
    # The key is the certificate's: what k3s signs with is what users trust.
    certificate = x509.load_pem_x509_certificate(first.certificate.encode())
    key = serialization.load_pem_private_key(first.key.encode(), password=None)
    assert key.public_key() == certificate.public_key()
    assert first.key.startswith("-----BEGIN EC PRIVATE KEY-----\n")


def test_a_serving_certificate_signed_with_the_cas_key_verifies_and_another_does_not(settings):
    settings.SECRET_KEY = "k" * 50
    ca = kube_ca(shape())
    trusted = certificate_of(yaml.safe_load(kubeconfig(shape())))
    verifier = (
        PolicyBuilder()
        .store(Store([trusted]))
        .build_server_verifier(x509.IPAddress(ipaddress.ip_address("203.0.113.10")))
    )
    verifier.verify(serving_certificate(ca.key, trusted, "203.0.113.10"), [])

    stranger = kube_ca(shape(cluster_id=43))
    stranger_ca = x509.load_pem_x509_certificate(stranger.certificate.encode())
    with pytest.raises(VerificationError):
        verifier.verify(serving_certificate(stranger.key, stranger_ca, "203.0.113.10"), [])


@pytest.mark.parametrize("gateway", ["203.0.113.5:22", "gw.fra-1.runcrate.net:2222"])
def test_behind_a_gateway_named_or_by_ip_the_api_is_reached_through_a_tunnel(gateway):
    behind = shape(gateway=gateway)
    assert kube_api_server(behind) == "https://127.0.0.1:20042"
    assert kube_tunnel(behind) == (f"ssh -J c42@{gateway} -N -L 20042:10.77.0.1:6443 root@node-0")
    config = yaml.safe_load(kubeconfig(behind))
    assert config["clusters"][0]["cluster"]["server"] == "https://127.0.0.1:20042"
    assert "c42." not in json.dumps(config)
    panel = details(behind)["software"]
    assert (panel["api_server"], panel["tunnel"]) == (
        "https://127.0.0.1:20042",
        kube_tunnel(behind),
    )


def test_each_cluster_has_its_own_tunnel_port_and_a_direct_head_is_tunnelled_too():
    assert kube_api_server(shape(gateway="203.0.113.5:22", cluster_id=7)).endswith(":20007")
    assert kube_api_server(shape(gateway="203.0.113.5:22", cluster_id=10_007)).endswith(":20007")
    # node-0's API listens on its private address only, so a head with an address of its own
    # is reached through a tunnel to it as well.
    direct = shape()
    assert kube_api_server(direct) == "https://127.0.0.1:20042"
    assert kube_tunnel(direct) == "ssh -N -L 20042:10.77.0.1:6443 root@203.0.113.10"
    assert details(direct)["software"]["tunnel"] == kube_tunnel(direct)
    ipv6 = ClusterShape(
        **{**direct.__dict__, "nodes": (NodeAccess(index=0, address="2001:db8::1"),)}
    )
    assert kube_tunnel(ipv6) == "ssh -N -L 20042:10.77.0.1:6443 root@2001:db8::1"
    nowhere = ClusterShape(**{**direct.__dict__, "nodes": (NodeAccess(index=0, address=None),)})
    with pytest.raises(NoRoute):
        kube_api_server(nowhere)
    assert kube_tunnel(nowhere) is None


def test_it_writes_block_yaml_whose_values_cannot_change_its_structure():
    from clusters.connect import _yaml

    tricky = {"a": "x: y\n- z", "list": [{"name": "#not a comment", "b": {"c": "'\""}}, "plain"]}
    text = _yaml(tricky)
    assert yaml.safe_load(text) == tricky
    assert text.splitlines()[2] == '  - name: "#not a comment"'
