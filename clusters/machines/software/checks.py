"""Readiness checks that read the real commands' output (DESIGN.md "The agent").

- Slurm: `sinfo -h -N -o '%N|%T|%G'`: every node exactly `idle` (`idle*` is not responding,
  `drain`/`drained`/`down` are out of service), with its GPUs in the gres column.
- Kubernetes: `kubectl get nodes -o json`: condition `Ready` is `"True"`, the node is not
  cordoned (`spec.unschedulable`), carries no `NoSchedule`/`NoExecute` taint, and
  `status.allocatable["nvidia.com/gpu"]` equals its GPUs.
- Ray: `ray list nodes -f state=ALIVE --format json`: every node's private address alive, with
  `resources_total.GPU` equal to its GPUs.

Each check returns `ready` when every expected node passes, `pending` while some do not yet
(the lifecycle checks again until the install deadline), and `failed` when the output cannot be
read at all: then the check itself is broken and waiting will not help.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterable
from dataclasses import dataclass

from clusters.machines.base import CheckResult, CheckState

SLURM_COMMAND = "sinfo -h -N -o '%N|%T|%G'"
KUBERNETES_COMMAND = "kubectl get nodes -o json"
RAY_COMMAND = "ray list nodes -f state=ALIVE --format json"

COMMANDS = {"slurm": SLURM_COMMAND, "kubernetes": KUBERNETES_COMMAND, "ray": RAY_COMMAND}

_BLOCKING_TAINTS = {"NoSchedule", "NoExecute"}
_GRES_GPU = re.compile(r"^gpu(?::[^:(]+)?:(\d+)")


@dataclass(frozen=True)
class ExpectedNode:
    name: str
    private_ip: str
    gpus: int


def _verdict(
    expected: Iterable[ExpectedNode], problems: dict[str, str], output: str
) -> CheckResult:
    names = [node.name for node in expected]
    ready = frozenset(name for name in names if name not in problems)
    state = CheckState.READY if len(ready) == len(names) else CheckState.PENDING
    return CheckResult(state=state, ready_nodes=ready, problems=problems, output=output)


def _unreadable(output: str, why: str) -> CheckResult:
    return CheckResult(state=CheckState.FAILED, problems={"*": why}, output=output)


def _gres_gpus(gres: str) -> int:
    total = 0
    for part in gres.split(","):
        match = _GRES_GPU.match(part.strip())
        if match:
            total += int(match.group(1))
    return total


# What sinfo prints (on stderr, exit 1) while slurmctld is still starting: not ready yet, not a
# broken check ("slurm_load_node: Unable to contact slurm controller (connect failure)").
_SLURM_NO_CONTROLLER = "Unable to contact slurm controller"
# What `ray list nodes` prints (exit 0) when no node matches the filter yet.
_RAY_NO_NODES = "No resource in the cluster"
# What it prints while Ray is still starting (tests/clusters/data/ray/): before the head has
# written its address (a ConnectionError, exit 1), and while the dashboard, which answers the
# state API, does not yet (exit 2).
_RAY_STARTING = {
    "Could not find any running Ray instance": "Ray is not running on the head yet",
    "Failed to connect to API server": "Ray's dashboard is still starting",
}


def _not_yet(expected: Iterable[ExpectedNode], why: str, output: str) -> CheckResult:
    """The software is still starting: no node is ready yet, and asking again will tell."""
    problems = {node.name: why for node in expected} or {"*": why}
    return CheckResult(state=CheckState.PENDING, problems=problems, output=output)


def check_slurm(output: str, expected: list[ExpectedNode]) -> CheckResult:
    if _SLURM_NO_CONTROLLER in output:
        return _not_yet(expected, "the Slurm controller does not answer yet", output)
    # A node in several partitions has a line per partition: every line must be idle.
    seen: dict[str, list[tuple[str, int]]] = {}
    for number, line in enumerate(output.splitlines(), start=1):
        if not line.strip():
            continue
        fields = line.strip().split("|")
        if len(fields) != 3:
            return _unreadable(output, f"line {number} is not 'NODE|STATE|GRES': {line!r}")
        name, state, gres = (f.strip() for f in fields)
        seen.setdefault(name, []).append((state, _gres_gpus(gres)))
    problems = {}
    for node in expected:
        lines = seen.get(node.name)
        if not lines:
            problems[node.name] = "not listed by sinfo"
            continue
        states = sorted({state for state, _ in lines})
        if states != ["idle"]:
            problems[node.name] = f"state {', '.join(states)} (needs idle)"
        elif any(gpus != node.gpus for _, gpus in lines):
            found = lines[0][1]
            problems[node.name] = f"{found} GPUs in gres (needs {node.gpus})"
    return _verdict(expected, problems, output)


def check_kubernetes(output: str, expected: list[ExpectedNode]) -> CheckResult:
    try:
        document = json.loads(output)
        items = document["items"]
        by_name = {item["metadata"]["name"]: item for item in items}
    except (ValueError, KeyError, TypeError) as error:
        return _unreadable(output, f"not the JSON of 'kubectl get nodes -o json' ({error})")
    problems = {}
    for node in expected:
        item = by_name.get(node.name)
        if item is None:
            problems[node.name] = "not registered with the cluster"
            continue
        spec = item.get("spec") or {}
        status = item.get("status") or {}
        conditions = {c.get("type"): c.get("status") for c in status.get("conditions") or []}
        taints = [
            f"{t.get('key')}:{t.get('effect')}"
            for t in spec.get("taints") or []
            if t.get("effect") in _BLOCKING_TAINTS
        ]
        allocatable = (status.get("allocatable") or {}).get("nvidia.com/gpu")
        if conditions.get("Ready") != "True":
            problems[node.name] = f"Ready is {conditions.get('Ready', 'missing')}"
        elif spec.get("unschedulable"):
            problems[node.name] = "cordoned (unschedulable)"
        elif taints:
            problems[node.name] = f"tainted {', '.join(taints)}"
        elif str(allocatable) != str(node.gpus):
            problems[node.name] = f"nvidia.com/gpu allocatable is {allocatable} (needs {node.gpus})"
    return _verdict(expected, problems, output)


def check_ray(output: str, expected: list[ExpectedNode]) -> CheckResult:
    if output.strip() == _RAY_NO_NODES:
        return _not_yet(expected, "no node is alive in Ray yet", output)
    for words, why in _RAY_STARTING.items():
        if words in output:
            return _not_yet(expected, why, output)
    try:
        nodes = json.loads(output)
        if not isinstance(nodes, list):
            raise TypeError("expected a list of nodes")
        alive = {
            n["node_ip"]: n for n in nodes if isinstance(n, dict) and n.get("state") == "ALIVE"
        }
    except (ValueError, KeyError, TypeError) as error:
        return _unreadable(output, f"not the JSON of 'ray list nodes --format json' ({error})")
    problems = {}
    for node in expected:
        found = alive.get(node.private_ip)
        if found is None:
            problems[node.name] = f"{node.private_ip} is not alive in Ray"
            continue
        try:
            gpus = float((found.get("resources_total") or {}).get("GPU", 0))
        except (TypeError, ValueError):
            gpus = 0.0
        if gpus != node.gpus:
            problems[node.name] = f"Ray sees {gpus:g} GPUs (needs {node.gpus})"
    return _verdict(expected, problems, output)


CHECKS = {"slurm": check_slurm, "kubernetes": check_kubernetes, "ray": check_ray}


def run_check(software: str, output: str, expected: list[ExpectedNode]) -> CheckResult:
    return CHECKS[software](output, expected)


# An installer's lines as they reach us: `[node-1] error: …` from the simulated one, `runcrate:
# failed: …` from the shell installers (clusters/machines/software/host/installer.sh), plain text
# else.
_NODE_PREFIX = re.compile(r"^\[[^\]]{1,40}\]\s*")
_VERDICT_PREFIXES = ("runcrate: failed:", "runcrate: error:", "runcrate:", "error:", "fatal:")
VERDICT_MAX_CHARS = 300


def installer_verdict(output: str) -> str:
    """What an installer said when it failed, in one line for a person: its last line that
    says `failed`/`error`, else its last non-empty line, without the node or script prefix;
    "" for no output. The whole output stays in the failure's event."""
    lines = [_NODE_PREFIX.sub("", line.strip()) for line in output.splitlines()]
    lines = [line for line in lines if line]
    if not lines:
        return ""
    telling = [line for line in lines if re.search(r"\b(failed|error|fatal)\b", line, re.I)]
    line = (telling or lines)[-1]
    for prefix in _VERDICT_PREFIXES:
        if line.lower().startswith(prefix):
            line = line[len(prefix) :].strip()
            break
    line = line.rstrip(".")
    if len(line) > VERDICT_MAX_CHARS:
        line = line[: VERDICT_MAX_CHARS - 1].rstrip() + "…"
    return line
