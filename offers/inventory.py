"""The inventory: GPU models, locations, machine types and hosts, loaded from a JSON file.

`load_inventory` is an idempotent upsert (SPEC §1, §9). The whole document is validated first,
every problem collected with the entry and field it is about; only a document without any
problem is written, in one transaction. The file format and its rules are in docs/inventory.md.

The same module holds the operator's other inventory actions (taking hosts out of service and
back), so admin and commands share one implementation.
"""

import ipaddress
import json
import re
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field
from decimal import Decimal
from pathlib import Path
from typing import Any

from django.conf import settings
from django.db import models, transaction
from django.db.models import Q
from django.utils import timezone

from offers.models import (
    MOST_MEASUREMENTS_AT_ONCE,
    SPEC_FIELDS,
    GpuModel,
    Host,
    Location,
    MachineType,
)
from offers.offers import inventory_changed
from runcrate.errors import Refused
from runcrate.money import TOO_LARGE, NotAnAmount, read_amount
from runcrate.text import InvalidText, check_json, too_deep

DEMO_INVENTORY = Path(settings.BASE_DIR) / "demo" / "inventory.json"

MAX_GROUP_COUNT = 10_000
# Hosts a node holds: the loader never moves these to another machine type or driver.
HELD_STATES = frozenset({Host.State.RESERVED, Host.State.IN_USE, Host.State.CLEANING})
# Errors shown in a message; InventoryError.errors keeps them all.
SHOWN_ERRORS = 50
# Rows per IN (...) lookup: SQLite's conservative limit on parameters is 999.
LOOKUP_CHUNK = 900


class InventoryError(Refused):
    """A refused inventory: nothing was written. `errors` names each entry and field."""

    def __init__(self, errors: list[str]):
        self.errors = errors
        super().__init__("invalid_inventory", self.summary())

    def summary(self, source: str = "the inventory", limit: int = SHOWN_ERRORS) -> str:
        count = len(self.errors)
        lines = [
            f"Refused {source}, nothing was loaded ({count} problem{'s' if count != 1 else ''}):"
        ]
        lines += [f"  - {error}" for error in self.errors[:limit]]
        if count > limit:
            lines.append(f"  … and {count - limit} more")
        return "\n".join(lines)


@dataclass
class KindReport:
    created: int = 0
    updated: int = 0
    unchanged: int = 0
    not_in_file: int = 0  # rows of the database the file did not mention: left as they are


@dataclass
class LoadReport:
    gpu_models: KindReport = field(default_factory=KindReport)
    locations: KindReport = field(default_factory=KindReport)
    machine_types: KindReport = field(default_factory=KindReport)
    hosts: KindReport = field(default_factory=KindReport)
    dry_run: bool = False

    def kinds(self) -> Iterator[tuple[str, KindReport]]:
        yield "GPU models", self.gpu_models
        yield "Locations", self.locations
        yield "Machine types", self.machine_types
        yield "Hosts", self.hosts

    def __str__(self) -> str:
        lines = ["Checked only, nothing written (--check):"] if self.dry_run else []
        for title, kind in self.kinds():
            lines.append(
                f"{title + ':':<15}{kind.created:>6} created{kind.updated:>6} updated"
                f"{kind.unchanged:>6} unchanged{kind.not_in_file:>6} not in the file (kept)"
            )
        return "\n".join(lines)


# --- reading the file -------------------------------------------------------------------------


class _Object(dict):
    """A JSON object that remembers the keys it had twice (json keeps only the last one)."""

    duplicates: tuple[str, ...] = ()


def _object_pairs(pairs: list[tuple[str, Any]]) -> _Object:
    obj = _Object(pairs)
    if len(obj) != len(pairs):
        seen: set[str] = set()
        duplicates = []
        for k, _ in pairs:
            if k in seen:
                duplicates.append(k)
            seen.add(k)
        obj.duplicates = tuple(duplicates)
    return obj


def _refuse_constant(name: str) -> None:
    raise ValueError(f"{name} is not a number JSON allows")


def parse_inventory(text: str) -> Any:
    """The JSON document in `text`; a syntax error names its line and column. A document nested
    deeper than any inventory is, or with text no input may hold (NUL: runcrate/text.py), is
    refused here, before anything reads it."""
    try:
        data = json.loads(text, object_pairs_hook=_object_pairs, parse_constant=_refuse_constant)
    except json.JSONDecodeError as error:
        raise InventoryError(
            [f"line {error.lineno}, column {error.colno}: invalid JSON ({error.msg})"]
        ) from None
    except ValueError as error:  # NaN, Infinity
        raise InventoryError([f"invalid JSON ({error})"]) from None
    except RecursionError:  # json's parser recurses once per level
        raise InventoryError([too_deep(name="the document").message]) from None
    try:
        check_json(data, name="the document")
    except InvalidText as refusal:
        raise InventoryError([refusal.message]) from None
    return data


def read_inventory_file(path: Path | str) -> Any:
    path = Path(path)
    try:
        text = path.read_text(encoding="utf-8-sig")  # a byte-order mark is fine
    except FileNotFoundError:
        raise InventoryError(["no such file"]) from None
    except IsADirectoryError:
        raise InventoryError(["it is a directory, not a JSON file"]) from None
    except PermissionError:
        raise InventoryError(["not allowed to read the file"]) from None
    except UnicodeDecodeError as error:
        raise InventoryError([f"not UTF-8 text (byte {error.start})"]) from None
    return parse_inventory(text)


def load_inventory_file(path: Path | str, *, dry_run: bool = False) -> LoadReport:
    return load_inventory(read_inventory_file(path), dry_run=dry_run)


# --- checks on single values --------------------------------------------------------------------


class _Invalid(Exception):
    def __init__(self, problem: str):
        self.problem = problem


def _show(value: Any) -> str:
    shown = json.dumps(value, ensure_ascii=False)
    return shown if len(shown) <= 60 else shown[:57] + "…"


_SLUG = re.compile(r"[a-z0-9]+(?:-[a-z0-9]+)*")
_HOST_NAME = re.compile(r"[A-Za-z0-9](?:[A-Za-z0-9._-]*[A-Za-z0-9])?")
_NAME_PREFIX = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]*")
_DNS_LABEL = r"[A-Za-z0-9](?:[A-Za-z0-9-]{0,61}[A-Za-z0-9])?"
_DNS_NAME = re.compile(rf"(?=.{{1,253}}$){_DNS_LABEL}(?:\.{_DNS_LABEL})*")
_UNIX_USER = re.compile(r"[a-z_][a-z0-9_-]{0,31}")
_HOST_KEY = re.compile(
    r"(ssh-ed25519|ssh-rsa|ecdsa-sha2-nistp256|ecdsa-sha2-nistp384|ecdsa-sha2-nistp521)"
    r" [A-Za-z0-9+/]+={0,2}"
)
_AMOUNT = re.compile(r"[0-9]+(?:\.[0-9]+)?")


def _string(value: Any) -> str:
    if not isinstance(value, str):
        raise _Invalid("must be a string")
    return value


def _slug(max_length: int) -> Callable[[Any], str]:
    def check(value: Any) -> str:
        if not isinstance(value, str) or len(value) > max_length or not _SLUG.fullmatch(value):
            raise _Invalid(
                f"must be lowercase letters and digits joined by hyphens,"
                f" at most {max_length} characters"
            )
        return value

    return check


def _text(max_length: int) -> Callable[[Any], str]:
    def check(value: Any) -> str:
        if not isinstance(value, str) or not value.strip() or len(value) > max_length:
            raise _Invalid(f"must be a non-empty string of at most {max_length} characters")
        return value.strip()

    return check


def _integer(low: int, high: int) -> Callable[[Any], int]:
    def check(value: Any) -> int:
        if isinstance(value, bool) or not isinstance(value, int) or not low <= value <= high:
            raise _Invalid(f"must be a whole number from {low} to {high}")
        return value

    return check


def _one_of(*allowed: Any) -> Callable[[Any], Any]:
    def check(value: Any) -> Any:
        # bool is an int in Python: true must not pass for 1.
        if isinstance(value, bool) or value not in allowed:
            raise _Invalid("must be " + _or(allowed))
        return value

    return check


def _or(values: Iterable[Any]) -> str:
    shown = [_show(v) if not isinstance(v, int) else str(v) for v in values]
    return ", ".join(shown[:-1]) + " or " + shown[-1] if len(shown) > 1 else shown[0]


def _boolean(value: Any) -> bool:
    if not isinstance(value, bool):
        raise _Invalid("must be true or false")
    return value


def _amount(*, places: int, max_digits: int, positive: bool) -> Callable[[Any], Decimal]:
    """A decimal amount given as a string ("23.92") or a JSON number (23.92, read by its text)."""
    kind = "a positive amount" if positive else "an amount of 0 or more"
    problem = f"must be {kind} with at most {places} decimals"
    ceiling = Decimal(10) ** (max_digits - places)

    def check(value: Any) -> Decimal:
        if isinstance(value, bool) or not isinstance(value, str | int | float):
            raise _Invalid(problem)
        text = value if isinstance(value, str) else repr(value)
        if not _AMOUNT.fullmatch(text):
            raise _Invalid(problem)
        try:
            amount = read_amount(text, minimum=Decimal(0), maximum=ceiling, places=places)
        except NotAnAmount as error:
            raise _Invalid(
                f"must be below {ceiling}" if error.reason == TOO_LARGE else problem
            ) from None
        if amount == ceiling:
            raise _Invalid(f"must be below {ceiling}")
        if positive and amount <= 0:
            raise _Invalid(problem)
        return amount

    return check


def _country(value: Any) -> str:
    if not isinstance(value, str) or not re.fullmatch(r"[A-Z]{2}", value):
        raise _Invalid('must be a two-letter country code in capitals (ISO 3166-1), like "US"')
    return value


def _is_address(text: str) -> bool:
    try:
        ipaddress.ip_address(text)
    except ValueError:
        return bool(_DNS_NAME.fullmatch(text))
    return True


def _address(value: Any) -> str:
    if not isinstance(value, str) or not _is_address(value):
        raise _Invalid("must be a host name or an IP address")
    return value


def _gateway(value: Any) -> str:
    """null (hosts have their own public address) or "host:port"; stored as "" for null."""
    if value is None:
        return ""
    problem = 'must be null or "host:port" with a port from 1 to 65535'
    if not isinstance(value, str) or ":" not in value:
        raise _Invalid(problem)
    host, _, port = value.rpartition(":")
    if host.startswith("[") and host.endswith("]"):
        host = host[1:-1]
        try:
            ipaddress.IPv6Address(host)
        except ValueError:
            raise _Invalid(problem) from None
    elif ":" in host or not _is_address(host):  # an IPv6 gateway is written [::1]:22
        raise _Invalid(problem)
    if not port.isascii() or not port.isdigit() or not 1 <= int(port) <= 65535:
        raise _Invalid(problem)
    return value


def _fault(value: Any) -> str:
    """null, or what the simulated host does wrong; stored as "" for null."""
    if value is None:
        return ""
    if isinstance(value, str) and value in Host.Fault.values:
        return value
    raise _Invalid("must be null, " + _or(Host.Fault.values))


def _host_name(value: Any) -> str:
    if not isinstance(value, str) or len(value) > 100 or not _HOST_NAME.fullmatch(value):
        raise _Invalid(
            "must be letters, digits, dots, hyphens or underscores, starting and ending"
            " with a letter or digit, at most 100 characters"
        )
    return value


def _name_prefix(value: Any) -> str:
    if not isinstance(value, str) or len(value) > 90 or not _NAME_PREFIX.fullmatch(value):
        raise _Invalid(
            "must be letters, digits, dots, hyphens or underscores, starting with a letter"
            " or digit, at most 90 characters"
        )
    return value


def _unix_user(value: Any) -> str:
    if not isinstance(value, str) or not _UNIX_USER.fullmatch(value):
        raise _Invalid("must be a Unix user name (lowercase, at most 32 characters)")
    return value


def _host_key(value: Any) -> str:
    if not isinstance(value, str):
        raise _Invalid("must be a string")
    value = " ".join(value.split()[:2])  # a trailing comment is dropped
    if value and not _HOST_KEY.fullmatch(value):
        raise _Invalid('must be "<key type> <base64 key>", e.g. "ssh-ed25519 AAAAC3…"')
    return value


def _absolute_path(value: Any) -> str:
    """An absolute folder path of plain characters (it is used in commands on a host)."""
    if not isinstance(value, str) or not re.fullmatch(r"(/[A-Za-z0-9._-]+)+", value):
        raise _Invalid(
            "must be an absolute path like /srv/runcrate/volumes (letters, digits, . _ -)"
        )
    if "/../" in f"{value}/" or "/./" in f"{value}/":
        raise _Invalid("must not contain . or .. parts")
    return value


def _command(value: Any) -> str:
    """A shell command on one line (a location's or host's `reimage`), run by the machines
    worker; empty for none."""
    if not isinstance(value, str) or len(value) > 1000:
        raise _Invalid("must be a shell command of at most 1000 characters")
    if any(ord(c) < 32 for c in value):
        raise _Invalid("must be one line, without control characters")
    return value.strip()


def _http_url(value: Any) -> str:
    """An http(s) URL with a host and no spaces (a location's apt mirror or pip index)."""
    if value is None:
        return ""
    if not isinstance(value, str) or len(value) > 200:
        raise _Invalid("must be an http:// or https:// URL of at most 200 characters")
    scheme, sep, rest = value.partition("://")
    if not sep or scheme not in ("http", "https") or not rest or any(c.isspace() for c in value):
        raise _Invalid(f"must be an http:// or https:// URL, not {json.dumps(value)}")
    return value


def check_host_field(field_name: str, value: str) -> str:
    """A host's `address`, `user` or `host_key` as the loader accepts it (admin's form uses
    the same rules); raises ValueError with the problem."""
    checks = {"address": _address, "user": _unix_user, "host_key": _host_key}
    if field_name == "address" and value == "":
        return value
    try:
        return checks[field_name](value)
    except _Invalid as invalid:
        raise ValueError(invalid.problem) from None


# A machine type's specs (docs/inventory.md, "Machine specs"): each optional, null or left out
# for "not stated". The admin form checks them with `check_spec_field`, the same rules.
SPEC_KEYS = SPEC_FIELDS
_DRIVER_VERSION = re.compile(r"[0-9]{2,4}(?:\.[0-9]{1,4}){0,2}")
_CUDA_VERSION = re.compile(r"[0-9]{1,2}\.[0-9]{1,2}")
_OS_IMAGE = re.compile(r"[A-Za-z0-9][A-Za-z0-9 .+_()/-]*")


def _optional(check: Callable[[Any], Any], empty: Any) -> Callable[[Any], Any]:
    def optional(value: Any) -> Any:
        return empty if value is None else check(value)

    return optional


def _driver_version(value: Any) -> str:
    if not isinstance(value, str) or not _DRIVER_VERSION.fullmatch(value):
        raise _Invalid(
            'must be an NVIDIA driver version as nvidia-smi prints it, like "570" or "570.124.06"'
        )
    return value


def _cuda_version(value: Any) -> str:
    if not isinstance(value, str) or not _CUDA_VERSION.fullmatch(value):
        raise _Invalid('must be a CUDA version like "12.8" (major.minor, as a string)')
    return value


def _os_image(value: Any) -> str:
    if not isinstance(value, str) or len(value) > 60 or not _OS_IMAGE.fullmatch(value.strip()):
        raise _Invalid(
            "must name the OS image in at most 60 letters, digits, spaces and . + _ ( ) / -, "
            'like "Ubuntu 22.04"'
        )
    return value.strip()


_SPEC_CHECKS: dict[str, Callable[[Any], Any]] = {
    "vcpus": _optional(_integer(1, 4096), None),
    "memory_gib": _optional(_integer(1, 65_536), None),
    "nvme_gib": _optional(_integer(0, 1_048_576), None),
    "gpu_link": _optional(_one_of(*MachineType.GpuLink.values), ""),
    "os_image": _optional(_os_image, ""),
    "driver_version": _optional(_driver_version, ""),
    "cuda_version": _optional(_cuda_version, ""),
}


def _spec_default(key: str) -> Any:
    return None if key in ("vcpus", "memory_gib", "nvme_gib") else ""


def check_spec_field(field_name: str, value: str) -> str:
    """A machine type's `os_image`, `driver_version` or `cuda_version` as the loader accepts it
    ("" for not stated); raises ValueError with the problem (admin's form uses it)."""
    if value == "":
        return value
    try:
        return _SPEC_CHECKS[field_name](value)
    except _Invalid as invalid:
        raise ValueError(invalid.problem) from None


def check_gateway(value: str) -> str:
    """A location's `ssh_gateway` ("" for none) as the loader accepts it; ValueError if bad."""
    try:
        return _gateway(value or None)
    except _Invalid as invalid:
        raise ValueError(invalid.problem.replace("null or ", "empty or ")) from None


def host_setup_problems(
    *, driver: str, fault: str, address: str, host_key: str = ""
) -> list[tuple[str, str]]:
    """(field, problem) for a host whose driver, fault and address do not go together.

    Shared by the loader and the admin form.
    """
    problems = []
    if fault and driver != Host.Driver.SIMULATED:
        problems.append(
            ("fault", f'only simulated hosts take a fault; this host\'s driver is "{driver}"')
        )
    if driver == Host.Driver.SSH and not address:
        problems.append(("address", "is required for the ssh driver"))
    if driver == Host.Driver.SSH and not host_key:
        problems.append(
            ("host_key", "is required for the ssh driver: the host key is pinned, never trusted")
        )
    return problems


def group_host_names(prefix: str, count: int) -> list[str]:
    """Names of a grouped host entry: prefix + 1-based index, zero-padded to 3 digits.

    Indices above 999 simply take more digits (prefix1000), so growing a group never renames
    the hosts it already has.
    """
    return [f"{prefix}{index:03d}" for index in range(1, count + 1)]


# --- checking the document ------------------------------------------------------------------------

_MISSING = object()

_SECTIONS = ("gpu_models", "locations", "machine_types", "hosts")


class _Entry:
    """One object of a section, with its label for messages: `machine_types[3] (use2-h100x8)`."""

    def __init__(self, errors: list[str], label: str, raw: dict, allowed: Iterable[str]):
        self.errors = errors
        self.label = label
        self.raw = raw
        self.ok = True
        allowed = tuple(allowed)
        for key in raw:
            if key not in allowed:
                self.fail(key, "unknown key; allowed keys are " + ", ".join(allowed))
        for key in getattr(raw, "duplicates", ()):
            self.fail(key, "appears twice in this entry")

    def fail(self, field_name: str, problem: str) -> None:
        self.ok = False
        self.errors.append(f"{self.label}.{field_name}: {problem}")

    def get(self, name: str, check: Callable[[Any], Any], default: Any = _MISSING) -> Any:
        if name not in self.raw:
            if default is _MISSING:
                self.fail(name, "is required")
                return None
            return default
        value = self.raw[name]
        try:
            return check(value)
        except _Invalid as invalid:
            self.fail(name, f"{invalid.problem}, not {_show(value)}")
            return None


@dataclass
class _Spec:
    """A checked entry: the model fields it sets and where it came from."""

    label: str
    fields: dict[str, Any]
    refs: dict[str, str] = field(default_factory=dict)  # field -> slug/code of another entry


@dataclass
class _Document:
    gpu_models: dict[str, _Spec] = field(default_factory=dict)
    locations: dict[str, _Spec] = field(default_factory=dict)
    machine_types: dict[str, _Spec] = field(default_factory=dict)
    hosts: dict[str, _Spec] = field(default_factory=dict)
    # Every slug/code/name the file gives, also of entries with problems (which are left out
    # above): a reference to one of those is not reported a second time as missing.
    named: dict[str, dict[str, str]] = field(
        default_factory=lambda: {section: {} for section in _SECTIONS}
    )


def _json_type(value: Any) -> str:
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "true/false"
    if isinstance(value, dict):
        return "an object"
    if isinstance(value, list):
        return "a list"
    if isinstance(value, str):
        return "a string"
    return "a number"


def _label(section: str, index: int, raw: Any, key: str) -> str:
    ident = raw.get(key) if isinstance(raw, dict) else None
    if isinstance(ident, str) and ident and len(ident) <= 100:
        return f"{section}[{index}] ({ident})"
    return f"{section}[{index}]"


def _entries(
    data: dict, section: str, key: str, errors: list[str]
) -> Iterator[tuple[int, str, Any]]:
    raw_list = data.get(section, [])
    if not isinstance(raw_list, list):
        errors.append(f"{section}: must be a list, not {_json_type(raw_list)}")
        return
    for index, raw in enumerate(raw_list):
        label = _label(section, index, raw, key)
        if not isinstance(raw, dict):
            errors.append(f"{label}: must be an object, not {_json_type(raw)}")
            continue
        yield index, label, raw


def _claim(
    seen: dict[str, str], key: str | None, spec_label: str, entry: _Entry, field_name: str
) -> bool:
    """Record `key` for this entry; a key already used in the file is an error."""
    if key is None:
        return False
    if key in seen:
        entry.fail(field_name, f'"{key}" is already used by {seen[key]}')
        return False
    seen[key] = spec_label
    return True


_GPU_KEYS = ("slug", "name", "memory_gib")
_LOCATION_KEYS = (
    "code",
    "name",
    "country",
    "capacity_reporting",
    "ssh_gateway",
    "ssh_gateway_host_key",
    "volume_price_per_gb_month",
    "apt_mirror",
    "pip_index_url",
    "storage_host",
    "storage_host_key",
    "storage_path",
    "reimage",
    "drill",
    "measurements_at_once",
)
_MACHINE_TYPE_KEYS = (
    "slug", "location", "gpu", "gpus_per_machine", "machine_kind", "interconnect", "community",
    "price_per_hour", "boot_seconds", "slow_boot", "link_mbit", *SPEC_KEYS,
)  # fmt: skip
_HOST_KEYS = (
    "name", "machine_type", "driver", "fault", "address", "port", "user", "host_key", "reimage",
)  # fmt: skip
_HOST_GROUP_KEYS = ("machine_type", "count", "name_prefix")


def _check_document(data: Any, errors: list[str]) -> _Document:
    doc = _Document()
    if not isinstance(data, dict):
        errors.append(
            "the inventory must be a JSON object with the lists "
            + ", ".join(_SECTIONS)
            + f", not {_json_type(data)}"
        )
        return doc
    for key in data:
        if key not in _SECTIONS:
            errors.append(f"{key}: unknown section; allowed are " + ", ".join(_SECTIONS))
    for key in getattr(data, "duplicates", ()):
        errors.append(f"{key}: the section appears twice in the file")
    _check_gpu_models(data, doc, errors)
    _check_locations(data, doc, errors)
    _check_machine_types(data, doc, errors)
    seen = doc.named["hosts"]
    for index, label, raw in _entries(data, "hosts", "name", errors):
        if "count" in raw or "name_prefix" in raw:
            _check_host_group(doc, seen, errors, index, raw)
        else:
            _check_host(doc, seen, errors, label, raw)
    return doc


def _check_gpu_models(data: dict, doc: _Document, errors: list[str]) -> None:
    seen = doc.named["gpu_models"]
    for _, label, raw in _entries(data, "gpu_models", "slug", errors):
        entry = _Entry(errors, label, raw, _GPU_KEYS)
        slug = entry.get("slug", _slug(40))
        fields = {
            "name": entry.get("name", _text(80)),
            "memory_gib": entry.get("memory_gib", _integer(1, 10_000)),
        }
        if _claim(seen, slug, label, entry, "slug") and entry.ok:
            doc.gpu_models[slug] = _Spec(label, fields)


def _check_locations(data: dict, doc: _Document, errors: list[str]) -> None:
    seen = doc.named["locations"]
    default_volume_price = Location._meta.get_field("volume_price_per_gb_month").default
    for _, label, raw in _entries(data, "locations", "code", errors):
        entry = _Entry(errors, label, raw, _LOCATION_KEYS)
        code = entry.get("code", _slug(40))
        fields = {
            "name": entry.get("name", _text(100)),
            "country": entry.get("country", _country),
            "capacity_reporting": entry.get(
                "capacity_reporting", _one_of(*Location.CapacityReporting.values)
            ),
            "ssh_gateway": entry.get("ssh_gateway", _gateway, default=""),
            "ssh_gateway_host_key": entry.get("ssh_gateway_host_key", _host_key, default=""),
            "apt_mirror": entry.get("apt_mirror", _http_url, default=""),
            "pip_index_url": entry.get("pip_index_url", _http_url, default=""),
            "storage_host": entry.get("storage_host", _gateway, default=""),
            "storage_host_key": entry.get("storage_host_key", _host_key, default=""),
            "storage_path": entry.get(
                "storage_path",
                _absolute_path,
                default=Location._meta.get_field("storage_path").default,
            ),
            "volume_price_per_gb_month": entry.get(
                "volume_price_per_gb_month",
                _amount(places=4, max_digits=8, positive=False),
                default=default_volume_price,
            ),
            "reimage": entry.get("reimage", _command, default=""),
            "drill": entry.get("drill", _boolean, default=False),
            "measurements_at_once": entry.get(
                "measurements_at_once",
                _optional(_integer(1, MOST_MEASUREMENTS_AT_ONCE), None),
                default=None,
            ),
        }
        if fields["storage_host"] and not fields["storage_host_key"]:
            entry.fail(
                "storage_host_key",
                "is required with a storage_host: its host key is pinned, never trusted",
            )
        if _claim(seen, code, label, entry, "code") and entry.ok:
            doc.locations[code] = _Spec(label, fields)


def _check_machine_types(data: dict, doc: _Document, errors: list[str]) -> None:
    seen = doc.named["machine_types"]
    for _, label, raw in _entries(data, "machine_types", "slug", errors):
        entry = _Entry(errors, label, raw, _MACHINE_TYPE_KEYS)
        slug = entry.get("slug", _slug(60))
        refs = {"location": entry.get("location", _string), "gpu": entry.get("gpu", _string)}
        kind = entry.get("machine_kind", _one_of(*MachineType.Kind.values))
        fields = {
            "gpus_per_machine": entry.get("gpus_per_machine", _one_of(1, 2, 4, 8)),
            "machine_kind": kind,
            "interconnect": entry.get(
                "interconnect",
                _one_of(*MachineType.Interconnect.values),
                default=MachineType.Interconnect.ETHERNET.value,
            ),
            "community": entry.get("community", _boolean, default=False),
            "price_per_hour": entry.get(
                "price_per_hour", _amount(places=2, max_digits=10, positive=True)
            ),
            "boot_seconds": entry.get(
                "boot_seconds",
                _integer(1, 3600),
                default=MachineType.DEFAULT_BOOT_SECONDS.get(kind),
            ),
            "slow_boot": entry.get("slow_boot", _boolean, default=False),
            # null: the default of its interconnect (MachineType.DEFAULT_LINK_MBIT)
            "link_mbit": entry.get("link_mbit", _integer(1, 1_000_000), default=None),
        }
        for key in SPEC_KEYS:
            fields[key] = entry.get(key, _SPEC_CHECKS[key], default=_spec_default(key))
        if _claim(seen, slug, label, entry, "slug") and entry.ok:
            doc.machine_types[slug] = _Spec(label, fields, refs)


def _check_host(
    doc: _Document, seen: dict[str, str], errors: list[str], label: str, raw: dict
) -> None:
    entry = _Entry(errors, label, raw, _HOST_KEYS)
    name = entry.get("name", _host_name)
    machine_type = entry.get("machine_type", _string)
    fields = {
        "driver": entry.get(
            "driver", _one_of(*Host.Driver.values), default=Host.Driver.SIMULATED.value
        ),
        "fault": entry.get("fault", _fault, default=""),
        "address": entry.get("address", _address, default=""),
        "port": entry.get("port", _integer(1, 65535), default=22),
        "user": entry.get("user", _unix_user, default="root"),
        "host_key": entry.get("host_key", _host_key, default=""),
        "reimage": entry.get("reimage", _command, default=""),
    }
    if entry.ok:
        for field_name, problem in host_setup_problems(
            driver=fields["driver"],
            fault=fields["fault"],
            address=fields["address"],
            host_key=fields["host_key"],
        ):
            entry.fail(field_name, problem)
    if _claim(seen, name, label, entry, "name") and entry.ok:
        doc.hosts[name] = _Spec(label, fields, {"machine_type": machine_type})


def _check_host_group(
    doc: _Document, seen: dict[str, str], errors: list[str], index: int, raw: dict
) -> None:
    prefix, count = raw.get("name_prefix"), raw.get("count")
    label = f"hosts[{index}]"
    if isinstance(prefix, str) and isinstance(count, int) and 1 <= count <= MAX_GROUP_COUNT:
        names = group_host_names(prefix, count)
        label = (
            f"hosts[{index}] ({names[0]}…{names[-1]})"
            if count > 1
            else f"hosts[{index}] ({names[0]})"
        )
    entry = _Entry(errors, label, raw, _HOST_GROUP_KEYS)
    machine_type = entry.get("machine_type", _string)
    count = entry.get("count", _integer(1, MAX_GROUP_COUNT))
    prefix = entry.get("name_prefix", _name_prefix)
    if not entry.ok:
        return
    fields = {
        "driver": Host.Driver.SIMULATED.value,
        "fault": "",
        "address": "",
        "port": 22,
        "user": "root",
        "host_key": "",
        "reimage": "",
    }
    clashes = []
    for name in group_host_names(prefix, count):
        if name in seen:
            clashes.append(f'"{name}" ({seen[name]})')
        else:
            seen[name] = label
            doc.hosts[name] = _Spec(label, dict(fields), {"machine_type": machine_type})
    if clashes:
        shown = ", ".join(clashes[:3]) + (
            f" and {len(clashes) - 3} more" if len(clashes) > 3 else ""
        )
        entry.fail("name_prefix", f"makes names already used in the file: {shown}")


# --- the database ------------------------------------------------------------------------------


def _chunks(items: list, size: int = LOOKUP_CHUNK) -> Iterator[list]:
    for start in range(0, len(items), size):
        yield items[start : start + size]


def _existing(model: type[models.Model], key: str, values: Iterable[str]) -> dict[str, Any]:
    """Rows of `model` whose `key` is one of `values`, by that key."""
    found: dict[str, Any] = {}
    for chunk in _chunks(sorted(set(values))):
        for obj in model._default_manager.filter(**{f"{key}__in": chunk}):
            found[getattr(obj, key)] = obj
    return found


def _check_references(
    specs: dict[str, _Spec],
    ref: str,
    in_file: dict[str, str],
    in_db: dict[str, Any],
    what: str,
    errors: list[str],
) -> None:
    reported: set[tuple[str, str]] = set()  # a group of hosts shares one entry: one message
    for spec in specs.values():
        value = spec.refs[ref]
        if value not in in_file and value not in in_db and (spec.label, value) not in reported:
            reported.add((spec.label, value))
            errors.append(f'{spec.label}.{ref}: no {what} "{value}" in the file or the database')


def _check_machine_type_changes(
    doc: _Document,
    current: dict[str, MachineType],
    gpus: dict[str, GpuModel],
    locations: dict[str, Location],
    errors: list[str],
) -> None:
    """Location, GPU, GPUs and kind of a machine type change only while none of its hosts is held:
    running clusters depend on them."""
    for slug, spec in doc.machine_types.items():
        machine_type = current.get(slug)
        if machine_type is None:
            continue
        gpu, location = gpus.get(spec.refs["gpu"]), locations.get(spec.refs["location"])
        changing = [
            name
            for name, changed in (
                ("location", location is None or location.pk != machine_type.location_id),
                ("gpu", gpu is None or gpu.pk != machine_type.gpu_id),
                (
                    "gpus_per_machine",
                    spec.fields["gpus_per_machine"] != machine_type.gpus_per_machine,
                ),
                ("machine_kind", spec.fields["machine_kind"] != machine_type.machine_kind),
            )
            if changed
        ]
        if not changing:
            continue
        problem = why_fixed_while_serving(machine_type)
        if problem:
            errors.append(f"{spec.label}.{changing[0]}: {problem}")


# What running clusters depend on: a machine type changes these only while none of its hosts
# is held. load_inventory and the admin both apply this.
FIXED_WHILE_SERVING = ("location", "gpu", "gpus_per_machine", "machine_kind")


def why_fixed_while_serving(machine_type: MachineType) -> str:
    """Why the type's FIXED_WHILE_SERVING fields cannot change now, or "" when they can.

    Locks every host of the type, so that none can be reserved before the caller's
    transaction (the load, the admin's save) commits."""
    hosts = (
        Host.objects.select_for_update()
        .filter(machine_type=machine_type)
        .order_by("name")
        .values_list("name", "state")
    )
    held = [name for name, state in hosts if state in HELD_STATES]
    if not held:
        return ""
    return (
        f"cannot change while {_some(held)} {'is' if len(held) == 1 else 'are'} reserved, in"
        " use or cleaning; location, gpu, gpus_per_machine and machine_kind change only when"
        " every host of the type is free or offline"
    )


def _some(names: list[str], shown: int = 3) -> str:
    text = ", ".join(names[:shown])
    return text + (f" and {len(names) - shown} more" if len(names) > shown else "")


def _check_host_moves(
    doc: _Document, hosts: dict[str, Host], machine_types: dict[str, MachineType], errors: list[str]
) -> None:
    """A held host keeps its machine type and driver; its other static fields may change."""
    moving = []
    for name, spec in doc.hosts.items():
        host = hosts.get(name)
        if host is None:
            continue
        target = machine_types.get(spec.refs["machine_type"])
        if (
            target is None
            or target.pk != host.machine_type_id
            or host.driver != spec.fields["driver"]
        ):
            moving.append(host.pk)
    if not moving:
        return
    # Lock the hosts that move and read their state again under the lock: none of them can be
    # reserved between this check and the commit.
    states: dict[int, str] = {}
    for chunk in _chunks(moving):
        states.update(
            Host.objects.select_for_update().filter(pk__in=chunk).values_list("pk", "state")
        )
    by_entry: dict[str, list[str]] = {}
    for name, spec in doc.hosts.items():
        host = hosts.get(name)
        state = states.get(host.pk) if host is not None else None
        if state in HELD_STATES:
            by_entry.setdefault(spec.label, []).append(f"{name} ({state.replace('_', ' ')})")
    for label, names in by_entry.items():
        errors.append(
            f"{label}.machine_type: {_some(names)} cannot move to another machine type or"
            " driver; a host moves only when it is free or offline"
        )


def _upsert(
    model: type[models.Model],
    key: str,
    specs: dict[str, _Spec],
    existing: dict[str, Any],
    report: KindReport,
) -> None:
    """Create what is new, update what changed (only the fields the file sets), count the rest."""
    to_create, to_update, changed = [], [], set()
    for value, spec in specs.items():
        obj = existing.get(value)
        if obj is None:
            to_create.append(model(**{key: value}, **spec.fields))
            continue
        diff = [name for name, new in spec.fields.items() if getattr(obj, name) != new]
        if diff:
            for name in diff:
                setattr(obj, name, spec.fields[name])
            to_update.append(obj)
            changed.update(diff)
        else:
            report.unchanged += 1
    model._default_manager.bulk_create(to_create, batch_size=1000)
    if to_update:
        model._default_manager.bulk_update(to_update, sorted(changed), batch_size=500)
    report.created = len(to_create)
    report.updated = len(to_update)
    report.not_in_file = model._default_manager.count() - len(specs)


def _set_references(
    specs: dict[str, _Spec], ref: str, field_name: str, model: type[models.Model], key: str
) -> None:
    """Point each spec at the row it names (which exists by now) by primary key."""
    ids: dict[str, int] = {}
    for chunk in _chunks(sorted({spec.refs[ref] for spec in specs.values()})):
        ids.update(model._default_manager.filter(**{f"{key}__in": chunk}).values_list(key, "pk"))
    for spec in specs.values():
        spec.fields[field_name] = ids[spec.refs[ref]]


def load_inventory(data: Any, *, dry_run: bool = False) -> LoadReport:
    """Check the whole inventory document, then upsert it in one transaction.

    Raises InventoryError (nothing written) listing every problem, each naming its entry and
    field. Rows the file does not mention are never deleted; a host's state and the node it
    serves are never changed. With `dry_run`, everything is checked and counted, then rolled
    back.
    """
    errors: list[str] = []
    doc = _check_document(data, errors)
    report = LoadReport(dry_run=dry_run)
    mt_specs, host_specs = doc.machine_types.values(), doc.hosts.values()
    with transaction.atomic():
        gpus = _existing(GpuModel, "slug", [*doc.gpu_models, *(s.refs["gpu"] for s in mt_specs)])
        locations = _existing(
            Location, "code", [*doc.locations, *(s.refs["location"] for s in mt_specs)]
        )
        machine_types = _existing(
            MachineType, "slug", [*doc.machine_types, *(s.refs["machine_type"] for s in host_specs)]
        )
        hosts = _existing(Host, "name", doc.hosts)
        named = doc.named
        _check_references(
            doc.machine_types, "location", named["locations"], locations, "location", errors
        )
        _check_references(doc.machine_types, "gpu", named["gpu_models"], gpus, "GPU model", errors)
        _check_references(
            doc.hosts, "machine_type", named["machine_types"], machine_types, "machine type", errors
        )
        _check_machine_type_changes(doc, machine_types, gpus, locations, errors)
        _check_host_moves(doc, hosts, machine_types, errors)
        if errors:
            raise InventoryError(errors)

        _upsert(GpuModel, "slug", doc.gpu_models, gpus, report.gpu_models)
        _upsert(Location, "code", doc.locations, locations, report.locations)
        _set_references(doc.machine_types, "gpu", "gpu_id", GpuModel, "slug")
        _set_references(doc.machine_types, "location", "location_id", Location, "code")
        _upsert(MachineType, "slug", doc.machine_types, machine_types, report.machine_types)
        _set_references(doc.hosts, "machine_type", "machine_type_id", MachineType, "slug")
        _upsert(Host, "name", doc.hosts, hosts, report.hosts)
        if dry_run:
            transaction.set_rollback(True)
        else:
            inventory_changed()
    return report


# --- taking hosts out of service and back ---------------------------------------------------------


def waiting_for_baseline():
    """The `ssh` hosts with no baseline recorded: offered to no one until staff record it
    (`manage.py record_baselines`; offers.offers.offered_hosts)."""
    return Host.objects.filter(driver=Host.Driver.SSH, baseline_at__isnull=True)


def take_hosts_offline(*, host_ids: Iterable[int]) -> int:
    """Take free hosts out of service; returns how many went offline.

    A reserved, in-use or cleaning host is left alone: its cluster's lifecycle releases it.
    """
    changed = Host.objects.filter(pk__in=list(host_ids), state=Host.State.FREE).update(
        state=Host.State.OFFLINE, state_changed_at=timezone.now()
    )
    if changed:
        inventory_changed()
    return changed


def return_hosts_to_service(*, host_ids: Iterable[int], verified: Iterable[int] = ()) -> int:
    """Make offline or dirty hosts free again; returns how many did. A host a node still holds
    stays, and so does an ssh host that is not in `verified`, found pristine against its
    baseline just now (`clusters.machines.hosts.return_to_service`, what staff's Mark free runs):
    the
    hosts that went offline or dirty are exactly the ones that could not be wiped or reimaged."""
    changed = (
        Host.objects.filter(pk__in=list(host_ids), state__in=[Host.State.OFFLINE, Host.State.DIRTY])
        .filter(Q(driver=Host.Driver.SIMULATED) | Q(pk__in=list(verified)))
        .exclude(nodes__holds_host=True)
        .update(state=Host.State.FREE, state_changed_at=timezone.now(), pristine_report="")
    )
    if changed:
        inventory_changed()
    return changed


def set_host_dirty(host: Host, report: str) -> None:
    """A free, offline or dirty host that must not be offered (a verification found it differ
    from its baseline): dirty, with what differs, until staff reimage it."""
    changed = (
        Host.objects.filter(
            pk=host.pk, state__in=[Host.State.FREE, Host.State.OFFLINE, Host.State.DIRTY]
        )
        .exclude(nodes__holds_host=True)
        .update(state=Host.State.DIRTY, state_changed_at=timezone.now(), pristine_report=report)
    )
    if changed:
        inventory_changed()
