"""What the reconciler carries, typed: the work it hands to a node (`Action`), what that work
came back with (an `Outcome` per kind of work), and every outcome a node has (`NodeWork`).

`Node.driver_state` stays the storage: `NodeWork.from_state(node.driver_state)` reads it and
`NodeWork.to_state()` writes it, here and nowhere else. It holds one outcome per kind of work
under the kind's name (`"start"`, `"install"`, ...), beside what the driver keeps about its
machine (what its `start` returned: `started_at`, `bootstrapped_at`, the plan it applied).
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from datetime import datetime, timedelta
from enum import StrEnum
from typing import Any, ClassVar

from django.utils.dateparse import parse_datetime

from clusters.machines.base import CheckState
from clusters.models import Node

# What one piece of work keeps of a driver's output: its tail, where the error is.
OUTPUT_CHARS = 20_000


class ActionKind(StrEnum):
    """The kinds of slow work a node is handed under a lease (rules.LEASE_SECONDS, by kind)."""

    START = "start"  # boot the machine and bootstrap it with its node plan
    REPLAN = "replan"  # a worker joined: the plan again, naming it (key: the worker's name)
    PRUNE = "prune"  # a node left: the plan without it (key: the node's name)
    AGENT = "agent"  # a driver that plays the agent: its check-in
    NETWORK = "network"  # ... and its network report
    INSTALL = "install"  # the software's installer (key: which install, `install_key`)
    CHECK = "check"  # the software's readiness check, on the head (key: the install's)
    STOP = "stop"  # stop the machine and make it fit for the next tenant
    # on the head: its software's scheduling made to hold exactly the drained workers (key:
    # their names, "node-2,node-3"; steps/drain.py)
    DRAIN = "drain"


@dataclass(frozen=True)
class Action:
    """One piece of work for a node: a kind, and for some kinds what it is about (`key`)."""

    kind: ActionKind
    key: str = ""

    def to_task(self) -> str:
        """The action as the task queue carries it (`clusters.tasks.node_work`'s argument):
        `"start"`, `"install:install-2"`. Read back by `from_task`, its only reader."""
        return f"{self.kind}:{self.key}" if self.key else str(self.kind)

    @classmethod
    def from_task(cls, text: str) -> Action:
        kind, _, key = text.partition(":")
        try:
            return cls(ActionKind(kind), key)
        except ValueError:
            raise ValueError(f"unknown node work {text!r}") from None

    def __str__(self) -> str:
        return self.to_task()


def _at(value: Any) -> datetime | None:
    return parse_datetime(value) if isinstance(value, str) and value else None


@dataclass(frozen=True)
class Outcome:
    """What a piece of work came back with. `at` (when it was written back) and `attempts`
    (how many results of its kind landed) are stamped by the write-back (`NodeWork.land`).
    A failed one says why (`error`; `reason`: an Event reason to fail the node with at once)."""

    ok: bool
    key: str = ""
    error: str = ""
    reason: str = ""
    output: str = ""
    at: datetime | None = None
    attempts: int = 0

    @classmethod
    def failed(cls, *, key: str = "", error: str, reason: str = "", output: str = "") -> Outcome:
        """Work that failed, saying why (the error's first 500 characters, the output's tail)."""
        return cls(
            ok=False, key=key, error=error[:500], reason=reason, output=output[-OUTPUT_CHARS:]
        )

    @classmethod
    def from_state(cls, state: dict) -> Outcome:
        return cls(**cls._read(state))

    @staticmethod
    def _read(state: dict) -> dict[str, Any]:
        return {
            "ok": bool(state.get("ok")),
            "key": state.get("key") or "",
            "error": state.get("error") or "",
            "reason": state.get("reason") or "",
            "output": state.get("output") or "",
            "at": _at(state.get("at")),
            "attempts": state.get("attempts") or 0,
        }

    def to_state(self) -> dict[str, Any]:
        state: dict[str, Any] = {"ok": self.ok}
        for name in ("key", "error", "reason", "output"):
            if getattr(self, name):
                state[name] = getattr(self, name)
        state["at"] = self.at.isoformat() if self.at else None
        state["attempts"] = self.attempts
        return state

    def backing_off(self, now: datetime, retry_after: timedelta) -> bool:
        """Whether it was written back less than `retry_after` ago (a failed one is retried
        only after that)."""
        return self.at is not None and now < self.at + retry_after


@dataclass(frozen=True)
class StartOutcome(Outcome):
    """A start (also what a failed one records). `began`: when the driver was handed it."""

    began: datetime | None = None

    @classmethod
    def from_state(cls, state: dict) -> StartOutcome:
        return cls(**cls._read(state), began=_at(state.get("began")))

    def to_state(self) -> dict[str, Any]:
        return super().to_state() | {"began": self.began.isoformat() if self.began else None}


@dataclass(frozen=True)
class CheckOutcome(Outcome):
    """The readiness check's verdict: the nodes it found ready, and why the others are not."""

    state: CheckState | None = None
    ready: tuple[str, ...] = ()
    problems: dict[str, str] = field(default_factory=dict)

    @classmethod
    def from_state(cls, state: dict) -> CheckOutcome:
        verdict = state.get("state")
        return cls(
            **cls._read(state),
            state=CheckState(verdict) if verdict else None,
            ready=tuple(state.get("ready") or ()),
            problems=dict(state.get("problems") or {}),
        )

    def to_state(self) -> dict[str, Any]:
        state = super().to_state()
        if self.ok:
            state |= {
                "state": str(self.state),
                "ready": list(self.ready),
                "problems": self.problems,
                "output": self.output,
            }
        return state


@dataclass(frozen=True)
class StopOutcome(Outcome):
    """What a stop left: whether the host is `pristine` (else `why` not, for staff), and a
    `warning` for the user (with the output) when something failed without stopping it."""

    pristine: bool = False
    why: str = ""
    warning: str = ""

    @classmethod
    def from_state(cls, state: dict) -> StopOutcome:
        return cls(
            **cls._read(state),
            pristine=bool(state.get("pristine")),
            why=state.get("why") or "",
            warning=state.get("warning") or "",
        )

    def to_state(self) -> dict[str, Any]:
        state = super().to_state()
        if self.ok:
            state |= {"pristine": self.pristine, "why": self.why}
            if self.warning:
                state["warning"] = self.warning
        return state


OUTCOMES: dict[ActionKind, type[Outcome]] = {
    ActionKind.START: StartOutcome,
    ActionKind.CHECK: CheckOutcome,
    ActionKind.STOP: StopOutcome,
}


def outcome_type(kind: ActionKind) -> type[Outcome]:
    """The record a kind of work's outcome is kept as."""
    return OUTCOMES.get(kind, Outcome)


@dataclass
class NodeWork:
    """Every outcome a node's work has written back, by kind, and what its driver keeps about
    the machine (`machine`): `Node.driver_state`, typed."""

    outcomes: dict[ActionKind, Outcome] = field(default_factory=dict)
    machine: dict[str, Any] = field(default_factory=dict)

    KINDS: ClassVar[frozenset[str]] = frozenset(ActionKind)

    @classmethod
    def from_state(cls, state: dict) -> NodeWork:
        work = cls()
        for name, value in (state or {}).items():
            if name in cls.KINDS:
                kind = ActionKind(name)
                work.outcomes[kind] = outcome_type(kind).from_state(value or {})
            else:
                work.machine[name] = value
        return work

    @classmethod
    def of(cls, node: Node) -> NodeWork:
        return cls.from_state(node.driver_state)

    def to_state(self) -> dict[str, Any]:
        return self.machine | {kind.value: o.to_state() for kind, o in self.outcomes.items()}

    def get(self, kind: ActionKind) -> Outcome | None:
        return self.outcomes.get(kind)

    @property
    def start(self) -> StartOutcome | None:
        found = self.outcomes.get(ActionKind.START)
        return found if isinstance(found, StartOutcome) else None

    @property
    def check(self) -> CheckOutcome | None:
        found = self.outcomes.get(ActionKind.CHECK)
        return found if isinstance(found, CheckOutcome) else None

    @property
    def stop(self) -> StopOutcome | None:
        found = self.outcomes.get(ActionKind.STOP)
        return found if isinstance(found, StopOutcome) else None

    @property
    def stopped(self) -> bool:
        """Whether a stop of the machine succeeded."""
        return self.stop is not None and self.stop.ok

    @property
    def install(self) -> Outcome | None:
        return self.outcomes.get(ActionKind.INSTALL)

    def land(
        self, kind: ActionKind, outcome: Outcome, *, at: datetime, machine: dict | None = None
    ) -> None:
        """Record `outcome` as written back `at`, counting the attempt; `machine` is what a
        start's driver keeps about the machine."""
        previous = self.outcomes.get(kind)
        attempts = (previous.attempts if previous else 0) + 1
        self.outcomes[kind] = replace(outcome, at=at, attempts=attempts)
        if machine:
            self.machine.update(machine)


@dataclass
class Failure:
    """Why a node failed its step: the Event reason, and what the user is told."""

    reason: str
    node: Node
    step: str
    message: str
    output: str = ""
