"""The reconciler's typed records: an action as the task queue carries it, and a node's work
read from and written to its `driver_state` in one place, in the shape it is stored."""

from datetime import UTC, datetime, timedelta

import pytest

from clusters.lifecycle.records import (
    Action,
    ActionKind,
    CheckOutcome,
    NodeWork,
    Outcome,
    StartOutcome,
    StopOutcome,
)
from clusters.machines.base import CheckState

T0 = datetime(2025, 3, 1, 12, 0, 0, 250_000, tzinfo=UTC)


@pytest.mark.parametrize(
    ("action", "text"),
    [
        (Action(ActionKind.START), "start"),
        (Action(ActionKind.INSTALL, "install-2"), "install:install-2"),
        (Action(ActionKind.CHECK, "workers-5"), "check:workers-5"),
        (Action(ActionKind.PRUNE, "node-2"), "prune:node-2"),
    ],
)
def test_it_carries_an_action_on_the_queue_as_text_and_reads_it_back(action, text):
    assert action.to_task() == text
    assert Action.from_task(text) == action


def test_it_refuses_work_it_does_not_know():
    with pytest.raises(ValueError, match="unknown node work 'reboot'"):
        Action.from_task("reboot")


def test_it_reads_what_was_stored_and_writes_it_back_unchanged():
    stored = {
        "started_at": T0.isoformat(),  # what the driver keeps about its machine
        "plan": {"hostname": "node-0"},
        "start": {
            "ok": True,
            "began": T0.isoformat(),
            "at": (T0 + timedelta(seconds=3)).isoformat(),
            "attempts": 1,
        },
        "check": {
            "ok": True,
            "key": "install-1",
            "state": "pending",
            "ready": ["node-0"],
            "problems": {"node-1": "not registered"},
            "output": "sinfo",
            "at": T0.isoformat(),
            "attempts": 2,
        },
        "stop": {
            "ok": False,
            "error": "the wipe of h1 failed",
            "output": "rm: busy",
            "at": T0.isoformat(),
            "attempts": 1,
        },
    }
    work = NodeWork.from_state(stored)
    assert work.machine == {"started_at": T0.isoformat(), "plan": {"hostname": "node-0"}}
    assert work.start == StartOutcome(ok=True, began=T0, at=T0 + timedelta(seconds=3), attempts=1)
    assert work.check.state is CheckState.PENDING and work.check.ready == ("node-0",)
    assert work.stop.error == "the wipe of h1 failed" and not work.stopped
    assert work.install is None
    assert work.to_state() == stored


def test_it_counts_the_attempts_of_each_kind_of_work_as_they_land():
    work = NodeWork()
    failed = StopOutcome.failed(error="x" * 600, output="y" * 30_000)
    work.land(ActionKind.STOP, failed, at=T0)
    work.land(ActionKind.STOP, StopOutcome(ok=True, pristine=True), at=T0 + timedelta(1))
    work.land(ActionKind.AGENT, Outcome(ok=True), at=T0)
    state = work.to_state()
    assert state["stop"] == {
        "ok": True,
        "pristine": True,
        "why": "",
        "at": (T0 + timedelta(1)).isoformat(),
        "attempts": 2,
    }
    assert state["agent"] == {"ok": True, "at": T0.isoformat(), "attempts": 1}
    assert len(failed.error) == 500 and len(failed.output) == 20_000
    assert work.stopped


def test_a_start_keeps_what_its_driver_returned_beside_its_outcome():
    work = NodeWork()
    work.land(
        ActionKind.START,
        StartOutcome(ok=True, began=T0),
        at=T0,
        machine={"bootstrapped_at": T0.isoformat()},
    )
    assert work.to_state() == {
        "bootstrapped_at": T0.isoformat(),
        "start": {"ok": True, "began": T0.isoformat(), "at": T0.isoformat(), "attempts": 1},
    }


def test_a_check_that_failed_has_no_verdict():
    work = NodeWork.from_state({"check": {"ok": False, "key": "install-1", "error": "timeout"}})
    assert work.check == CheckOutcome(ok=False, key="install-1", error="timeout")
    assert work.check.state is None and work.check.ready == ()
