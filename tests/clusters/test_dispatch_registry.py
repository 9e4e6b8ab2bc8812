"""The dispatcher finds the work it hands on by registration (clusters/lifecycle/dispatch.py):
the Celery tasks register as clusters/tasks.py defines them, loaded by the app's `ready`, and the
lifecycle's functions mark themselves with `@dispatch.runs`. Nothing in the lifecycle imports
the tasks (tests/test_layers.py)."""

import pytest

from clusters import lifecycle, tasks
from clusters.lifecycle import dispatch, network_test, reconcile, work


def test_every_kind_handed_on_has_the_task_that_carries_it():
    assert {kind: dispatch.task(kind) for kind in dispatch.KINDS} == {
        "advance": tasks.advance,
        "node_work": tasks.node_work,
        "release": tasks.release_work,
        "network_test": tasks.network_test,
        "fetch_logs": tasks.fetch_logs,
    }


def test_the_work_run_in_process_is_the_lifecycle_s_own_function():
    assert dispatch._run("advance") is reconcile.advance is lifecycle.advance
    assert dispatch._run("node_work") is work.do_work
    assert dispatch._run("network_test") is network_test.do_network_test


def test_a_kind_no_one_hands_on_is_refused_by_name():
    with pytest.raises(ValueError, match="'reimage' is not a kind of work handed on"):
        dispatch.register_task("reimage", tasks.advance)
    with pytest.raises(ValueError, match="'reimage' is not a kind"):
        dispatch.runs("reimage")
    with pytest.raises(LookupError, match="nothing registered runs 'fetch_logs'"):
        dispatch._run("fetch_logs")
