"""What a node's agent tells the lifecycle, checked and recorded on the node: that it is up and
which GPUs it sees (`check_in`), which peers it reached and what it measured (`network_report`).
The one way facts from a node reach its record: the agent's endpoints (clusters/telemetry/
agent_service.py) call these on the node they locked, and so does the unit of work for what a
driver that plays the agent (the simulated data center) reports (`record_report`).

They only record facts; the reconciler judges them against the node's deadlines. What is not
of the right shape is refused (`AgentRefused`, with the status the endpoints answer).
"""

from __future__ import annotations

import hmac
import re
from typing import Any

from django.utils import timezone

from clusters.lifecycle.rules import token_hash
from clusters.machines.base import AgentCheckIn, AgentReport
from clusters.models import Node

_WIREGUARD_KEY = re.compile(r"[A-Za-z0-9+/]{42}[AEIMQUYcgkosw480]=")
_METHODS = {"iperf3", "tcp-stream", "simulated"}
_SHARED_METHODS = {"nfs", "sshfs", "simulated"}


class AgentRefused(Exception):
    """A report the node's agent must not retry as is."""

    STATUS = {
        "bad_token": 403,
        "node_released": 410,
        "invalid_report": 422,
        "too_many_reports": 429,
    }

    def __init__(self, code: str, message: str) -> None:
        super().__init__(message)
        self.code = code
        self.message = message

    @property
    def status(self) -> int:
        return self.STATUS.get(self.code, 400)


# An unknown node and a wrong token get the same answer: a caller learns nothing about which
# node ids exist, and the agent stops on either (403).
NOT_THIS_NODE = "No node with this id has this token."


def parse_nvidia_smi(csv: str) -> list[dict[str, Any]]:
    """Rows of `nvidia-smi --query-gpu=name,memory.total,uuid,driver_version --format=csv,
    noheader,nounits` as dictionaries."""
    gpus = []
    for number, line in enumerate(csv.splitlines(), start=1):
        if not line.strip():
            continue
        fields = [f.strip() for f in line.split(",")]
        if len(fields) != 4:
            raise AgentRefused(
                "invalid_report", f"GPU line {number} has {len(fields)} fields, not 4: {line!r}"
            )
        name, memory, uuid, driver = fields
        try:
            memory_mib = int(float(memory))
        except (ValueError, OverflowError):  # "nan", "1e999"
            raise AgentRefused(
                "invalid_report", f"GPU line {number}: memory {memory!r} is not a number."
            ) from None
        gpus.append(
            {"name": name, "memory_total_mib": memory_mib, "uuid": uuid, "driver_version": driver}
        )
    return gpus


def clean_gpus(gpus: Any) -> list[dict[str, Any]]:
    if isinstance(gpus, str):
        return parse_nvidia_smi(gpus)
    if not isinstance(gpus, list) or not all(isinstance(g, dict) for g in gpus):
        raise AgentRefused("invalid_report", "gpus must be a list of objects (or nvidia-smi CSV).")
    cleaned = []
    for gpu in gpus:
        try:
            cleaned.append(
                {
                    "name": str(gpu["name"])[:100],
                    "memory_total_mib": int(gpu["memory_total_mib"]),
                    "uuid": str(gpu.get("uuid", ""))[:100],
                    "driver_version": str(gpu.get("driver_version", ""))[:40],
                }
            )
        except (KeyError, TypeError, ValueError, OverflowError):
            raise AgentRefused(
                "invalid_report", "Each GPU needs a name and memory_total_mib (a whole number)."
            ) from None
    return cleaned


def clean_wireguard_key(key: Any) -> str | None:
    if key is None or key == "":
        return None
    if not isinstance(key, str) or not _WIREGUARD_KEY.fullmatch(key):
        raise AgentRefused(
            "invalid_report", "wireguard_public_key must be a WireGuard public key (44 base64)."
        )
    return key


def _clean_acceptance(acceptance: Any) -> dict[str, Any]:
    """What the agent measured to node-0: latency (ms), bandwidth (Mbit/s), how, and why not."""
    if acceptance is None:
        return {}
    if not isinstance(acceptance, dict):
        raise AgentRefused("invalid_report", "acceptance must be an object.")
    cleaned: dict[str, Any] = {}
    for key in ("latency_ms", "bandwidth_mbit"):
        value = acceptance.get(key)
        if value is not None and (
            isinstance(value, bool) or not isinstance(value, int | float) or not 0 <= value < 1e9
        ):
            raise AgentRefused("invalid_report", f"acceptance.{key} must be a number ≥ 0 or null.")
        cleaned[key] = None if value is None else round(float(value), 3)
    method = acceptance.get("method")
    if method is not None and method not in _METHODS:
        raise AgentRefused(
            "invalid_report", f"acceptance.method must be one of {', '.join(sorted(_METHODS))}."
        )
    cleaned["method"] = method
    error = acceptance.get("error")
    if error is not None and not isinstance(error, str):
        raise AgentRefused("invalid_report", "acceptance.error must be a string or null.")
    cleaned["error"] = error[:300] if error else None
    # The machine's own vCPUs and memory (MemTotal, MiB), compared with what was sold.
    for key, ceiling in (("vcpus", 100_000), ("memory_mib", 1 << 40)):
        value = acceptance.get(key)
        if value is not None and (
            isinstance(value, bool) or not isinstance(value, int) or not 0 <= value < ceiling
        ):
            raise AgentRefused(
                "invalid_report", f"acceptance.{key} must be a whole number ≥ 0 or null."
            )
        if key in acceptance:
            cleaned[key] = value
    # A worker's mount of node-0's /shared (made before it measured): how, or why not.
    if "shared" in acceptance:
        shared, shared_error = acceptance.get("shared"), acceptance.get("shared_error")
        if shared is not None and shared not in _SHARED_METHODS:
            raise AgentRefused(
                "invalid_report",
                f"acceptance.shared must be one of {', '.join(sorted(_SHARED_METHODS))} or null.",
            )
        if shared_error is not None and not isinstance(shared_error, str):
            raise AgentRefused(
                "invalid_report", "acceptance.shared_error must be a string or null."
            )
        cleaned["shared"] = shared
        cleaned["shared_error"] = shared_error[:300] if shared_error else None
    return cleaned


# What a driver that plays the agent (the simulated data center) reports is recorded through
# these, on a node the write-back of its work has locked and read: the same checks and the
# same record as the agent's endpoints (clusters/telemetry/agent_service.py), saved with the
# write-back and followed by its advance.


def record_check_in(found: Node, *, token: str, gpus: Any, wireguard_key: Any = None) -> list[str]:
    """The check-in (as the agent's endpoint records it, clusters/telemetry/agent_service.py
    `agent_check_in`) on a locked `found`, unsaved; returns the fields it changed."""
    cleaned = clean_gpus(gpus)
    key = clean_wireguard_key(wireguard_key)
    _require_token(found, token)
    return check_in(found, gpus=cleaned, wireguard_key=key)


def record_network_report(
    found: Node, *, token: str, reachability: Any, acceptance: Any = None
) -> list[str]:
    """The network report (as `agent_report_network` records it) on a locked `found`, unsaved;
    returns the fields it changed."""
    measured = clean_network_report(reachability, acceptance)
    _require_token(found, token)
    return network_report(found, reachability=reachability, measured=measured)


def record_report(found: Node, *, token: str, report: AgentReport) -> list[str]:
    """What a driver that plays the agent reported (`Driver.agent_report`), recorded on a
    locked `found`, unsaved, as the endpoints record the real agent's; returns the fields it
    changed."""
    if isinstance(report, AgentCheckIn):
        return record_check_in(
            found, token=token, gpus=report.gpus, wireguard_key=report.wireguard_key
        )
    return record_network_report(
        found, token=token, reachability=report.reachability, acceptance=report.acceptance
    )


def _require_token(found: Node, token: str) -> None:
    expected = found.agent_token_hash
    if not token or not expected or not hmac.compare_digest(token_hash(token), expected):
        raise AgentRefused("bad_token", NOT_THIS_NODE)


def check_in(found: Node, *, gpus: list[dict], wireguard_key: str | None) -> list[str]:
    fields = ["heartbeat_at"]
    now = timezone.now()
    found.heartbeat_at = now
    if found.agent_at is None:
        found.agent_at = now
        found.gpus = gpus
        fields += ["agent_at", "gpus"]
    if wireguard_key and wireguard_key != found.wireguard_key:
        found.wireguard_key = wireguard_key
        fields.append("wireguard_key")
    return fields


def clean_network_report(reachability: Any, acceptance: Any) -> dict[str, Any]:
    if not isinstance(reachability, dict) or not all(
        isinstance(k, str) and isinstance(v, bool) for k, v in reachability.items()
    ):
        raise AgentRefused("invalid_report", "reachability must map peer names to true or false.")
    return _clean_acceptance(acceptance)


def network_report(found: Node, *, reachability: dict, measured: dict) -> list[str]:
    if found.status != Node.Status.STARTING:
        return []
    found.reachability = reachability
    found.acceptance = measured
    found.network_reported_at = timezone.now()
    return ["reachability", "acceptance", "network_reported_at"]
