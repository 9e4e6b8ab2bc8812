"""Where a webhook may be sent: the one check, made when an endpoint is created and again
before every attempt (docs/notifications.md, "Addresses").

https only unless DEBUG; the host is resolved and every address it resolves to must be a
public one (no private, loopback, link-local, multicast, reserved or unspecified address)
unless RUNCRATE_WEBHOOKS_ALLOW_PRIVATE is set. The delivery then connects to the address that
was checked, not to a second resolution of the name, so a name that resolves to a public
address at the check and a private one at the connect (DNS rebinding) reaches nothing inside.
"""

import ipaddress
import socket
from dataclasses import dataclass
from urllib.parse import urlsplit

from django.conf import settings

from runcrate.errors import Refused

MAX_URL_LENGTH = 2000


class UrlRefused(Refused):
    """A webhook URL we will not send to (`invalid_url`, `url_not_https`, `url_private`)."""

    STATUS = {"invalid_url": 422, "url_not_https": 422, "url_private": 422}


@dataclass(frozen=True)
class Target:
    """A checked URL: its host name, and the address to connect to in its place."""

    url: str
    host: str
    address: str
    port: int

    @property
    def pinned_url(self) -> str:
        """The URL with the checked address for its host (brackets around an IPv6 one)."""
        parts = urlsplit(self.url)
        literal = f"[{self.address}]" if ":" in self.address else self.address
        netloc = f"{literal}:{self.port}"
        path = parts.path or "/"
        query = f"?{parts.query}" if parts.query else ""
        return f"{parts.scheme}://{netloc}{path}{query}"


# IPv6 forms that carry an IPv4 address inside (6to4, Teredo, NAT64, SIIT, IPv4-compatible): a
# router or relay on the way may deliver them to the address inside, which could be any of ours
# (2002:a9fe:a9fe::1 is 169.254.169.254). No webhook receiver needs one: refused outright.
CARRIERS = tuple(
    ipaddress.IPv6Network(network)
    for network in (
        "2002::/16",  # 6to4
        "2001::/32",  # Teredo
        "64:ff9b::/96",  # NAT64, well-known prefix
        "64:ff9b:1::/48",  # NAT64, local use
        "::ffff:0:0:0/96",  # SIIT (IPv4-translated)
        "::/96",  # IPv4-compatible (deprecated)
    )
)


def is_public(address: str) -> bool:
    ip = ipaddress.ip_address(address.split("%")[0])
    if isinstance(ip, ipaddress.IPv6Address):
        if ip.ipv4_mapped is not None:
            ip = ip.ipv4_mapped
        elif any(ip in carrier for carrier in CARRIERS):
            return False
    return ip.is_global and not (
        ip.is_private
        or ip.is_loopback
        or ip.is_link_local
        or ip.is_multicast
        or ip.is_reserved
        or ip.is_unspecified
    )


def resolve(host: str, port: int) -> list[str]:
    """Every address `host` resolves to (an address literal is itself)."""
    try:
        infos = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)
    except (socket.gaierror, UnicodeError):
        raise UrlRefused(
            "invalid_url", f"The host {host!r} does not resolve to any address.", field="url"
        ) from None
    return sorted({str(info[4][0]) for info in infos})


def check_url(url: str) -> Target:
    """The target `url` may be sent to, or UrlRefused saying why not."""
    if not isinstance(url, str) or not url or len(url) > MAX_URL_LENGTH:
        raise UrlRefused(
            "invalid_url", f"A webhook URL is 1 to {MAX_URL_LENGTH} characters.", field="url"
        )
    try:
        parts = urlsplit(url)
        port = parts.port
    except ValueError:
        raise UrlRefused("invalid_url", f"{url!r} is not a URL.", field="url") from None
    if parts.scheme not in {"http", "https"} or not parts.hostname:
        raise UrlRefused("invalid_url", f"{url!r} is not an http(s) URL with a host.", field="url")
    if parts.scheme != "https" and not settings.DEBUG:
        raise UrlRefused(
            "url_not_https",
            "A webhook URL must be https://, so what it carries is private.",
            field="url",
        )
    if parts.username or parts.password:
        raise UrlRefused(
            "invalid_url", "A webhook URL carries no user name or password.", field="url"
        )
    port = port or (443 if parts.scheme == "https" else 80)
    addresses = resolve(parts.hostname, port)
    if not settings.RUNCRATE_WEBHOOKS_ALLOW_PRIVATE:
        inside = [address for address in addresses if not is_public(address)]
        if inside:
            raise UrlRefused(
                "url_private",
                f"{parts.hostname} resolves to {', '.join(inside)}, a private, loopback, "
                "link-local, multicast or reserved address, or one that carries an IPv4 address "
                "inside it (6to4, Teredo, NAT64): webhooks go to public addresses only.",
                field="url",
            )
    return Target(url=url, host=parts.hostname, address=addresses[0], port=port)
