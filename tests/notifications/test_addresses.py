"""Where webhooks may go: https only outside DEBUG, public addresses only unless
RUNCRATE_WEBHOOKS_ALLOW_PRIVATE, checked again at each delivery (no DNS rebinding). Only
address literals and a stubbed resolver here: no outside name is ever resolved."""

import socket

import pytest

from notifications import addresses, delivery
from notifications.addresses import UrlRefused, check_url
from notifications.endpoints import create_endpoint
from notifications.models import Attempt, Delivery
from notifications.tasks import run_notifications
from tests.notifications.conftest import ready_event


@pytest.fixture
def production(settings):
    settings.DEBUG = False
    settings.RUNCRATE_WEBHOOKS_ALLOW_PRIVATE = False
    return settings


@pytest.mark.parametrize(
    "url",
    [
        "https://127.0.0.1/hook",
        "https://10.1.2.3/hook",
        "https://192.168.0.10:8443/hook",
        "https://169.254.169.254/latest/meta-data",
        "https://[::1]/hook",
        "https://[fe80::1]/hook",
        "https://[::ffff:10.0.0.1]/hook",
        "https://224.0.0.1/hook",
        "https://0.0.0.0/hook",
        "https://240.0.0.1/hook",
        # IPv6 forms that carry an IPv4 address inside: 6to4, Teredo, NAT64 (well-known and
        # local-use prefixes), SIIT and IPv4-compatible, each wrapping 169.254.169.254 or
        # 10.0.0.1, and a public one inside too (no receiver needs these forms).
        "https://[2002:a9fe:a9fe::1]/x",
        "https://[2002:0a00:0001::1]/x",
        "https://[2001:0:4136:e378:8000:63bf:5601:5601]/x",
        "https://[64:ff9b::a9fe:a9fe]/x",
        "https://[64:ff9b::a00:1]/x",
        "https://[64:ff9b:1::a9fe:a9fe]/x",
        "https://[::ffff:0:a9fe:a9fe]/x",
        "https://[::a9fe:a9fe]/x",
        "https://[2002:5db8:d70e::1]/x",
    ],
)
def test_it_refuses_a_private_address_without_the_setting(production, url):
    with pytest.raises(UrlRefused) as refused:
        check_url(url)

    assert refused.value.code == "url_private"
    assert refused.value.status == 422
    assert "public addresses only" in refused.value.message


def test_it_allows_a_private_address_with_the_setting(production):
    production.RUNCRATE_WEBHOOKS_ALLOW_PRIVATE = True

    target = check_url("https://127.0.0.1:8443/hook?x=1")

    assert target.pinned_url == "https://127.0.0.1:8443/hook?x=1"


def test_it_allows_a_public_address(production):
    target = check_url("https://93.184.215.14/hook")

    assert (target.host, target.address, target.port) == ("93.184.215.14", "93.184.215.14", 443)


def test_it_refuses_http_outside_debug(production):
    production.RUNCRATE_WEBHOOKS_ALLOW_PRIVATE = True

    with pytest.raises(UrlRefused) as refused:
        check_url("http://127.0.0.1/hook")

    assert refused.value.code == "url_not_https"


@pytest.mark.parametrize(
    "url", ["", "ftp://127.0.0.1/x", "https://", "https://u:p@127.0.0.1/", "https://x:99999/"]
)
def test_it_refuses_what_is_not_a_webhook_url(production, url):
    with pytest.raises(UrlRefused) as refused:
        check_url(url)

    assert refused.value.code == "invalid_url"


def test_a_name_resolving_to_any_private_address_is_refused(production, monkeypatch):
    monkeypatch.setattr(addresses, "resolve", lambda host, port: ["93.184.215.14", "10.0.0.7"])

    with pytest.raises(UrlRefused, match="10.0.0.7"):
        check_url("https://hooks.example.com/runcrate")


def test_it_checks_the_address_again_at_delivery(owner, receiver, local_webhooks, monkeypatch):
    """A name public when the endpoint is made and private at delivery (DNS rebinding) is
    refused at the attempt, which is logged and retried: nothing is sent."""
    local_webhooks.RUNCRATE_WEBHOOKS_ALLOW_PRIVATE = False
    answers = {"hooks.example.com": ["93.184.215.14"]}
    monkeypatch.setattr(addresses, "resolve", lambda host, port: answers[host])
    endpoint = create_endpoint(
        project=owner.project,
        user=owner.user,
        url="http://hooks.example.com/runcrate",
        events=["cluster.ready"],
    )
    answers["hooks.example.com"] = ["127.0.0.1"]
    ready_event(owner.project)

    run_notifications()

    sent = Delivery.objects.get(endpoint=endpoint)
    assert (sent.state, sent.attempts, sent.last_status_code) == ("pending", 1, None)
    assert "127.0.0.1" in sent.last_error
    assert Attempt.objects.get(delivery=sent).error == sent.last_error
    assert receiver.received == []


def test_the_post_goes_to_the_checked_address_with_the_name_as_host(
    owner, receiver, local_webhooks, monkeypatch
):
    port = receiver.url.split(":")[2].split("/")[0]
    monkeypatch.setattr(addresses, "resolve", lambda host, port: ["127.0.0.1"])
    real_getaddrinfo = socket.getaddrinfo
    resolved = []

    def only_literals(host, *args, **kwargs):
        resolved.append(host)
        assert host == "127.0.0.1", f"resolved {host}"
        return real_getaddrinfo(host, *args, **kwargs)

    monkeypatch.setattr(socket, "getaddrinfo", only_literals)
    endpoint = create_endpoint(
        project=owner.project,
        user=owner.user,
        url=f"http://hooks.example.com:{port}/runcrate",
        events=["cluster.ready"],
    )

    outcome = delivery.post(endpoint, {"type": "ping"}, now=endpoint.created_at)

    assert outcome.status_code == 200
    [got] = receiver.received
    assert got.headers["host"] == f"hooks.example.com:{port}"
    assert resolved == ["127.0.0.1"]  # the connection went to the checked address
