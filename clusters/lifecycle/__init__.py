"""Every transition of a cluster and its nodes (SPEC §2-§3, DESIGN.md "The lifecycle is a
reconciler"). Views, the API, tasks and the admin call these functions; none re-implements them.

- `create_cluster` validates, then reserves every host in one transaction with row locks; made
  with an API key, it must fit the key's limits (`key_spend_per_hour` is what the hourly one
  counts); given `Quoted` terms (staff, from a won quote), it lifts only the self-serve rules.
  `plan_create` runs every one of its checks, in its order, and reserves nothing (the plan).
- `advance` is level-triggered: it reads the cluster's rows and the clock, does what is due in
  one transaction with the cluster row locked, and returns what it did. Running it twice does
  nothing new. Slow work (starting a machine, an install, a check, wiping a host) is handed to a
  per-node task under a lease (one task for a cluster's nodes where the driver batches) and
  never runs inside the transaction; the task writes its results back only while their lease
  tokens still match, and advances the cluster in the same transaction (`do_work`).
- `terminate`, `retry_install`, `add_workers`, `replace_node` change what the reconciler aims
  for; `plan_add_workers` and `plan_replace` run their checks and reserve nothing (the plans).
- `run_network_test` measures the private network of a ready cluster on request, in a task.

Every write to a cluster's nodes happens with the cluster row locked, so `advance`, the agent's
check-ins and the tasks' write-backs never overwrite each other. The rules decided here where
SPEC is silent are written down in docs/lifecycle.md.

The package, by concern: `rules` (limits, deadlines, tokens, the cluster lock, the judgements on
what agents report), `dispatch` (handing work to Celery or to memory), `reserve` (create and
reservation), `unit` (the unit of work: a locked cluster loaded once, its changes collected and
written back once), `steps` (what each step decides on it), `records` (what it carries, typed:
`Action`, the `Outcome` of each kind of work, a node's `NodeWork`), `reconcile` (`advance`: one
unit over a cluster), `work` (per-node work under a lease, talking to drivers),
`actions` (terminate, stop, retry, add workers), `grow` (the checks and the plan of adding
workers), `repair` (replacing a lost or unhealthy
worker in place, the `auto` repair policy), `stops` (the meter's stops for balance and
budget), `observe` (the record of what a node's agent says: its check-in, its network report),
`network_test` (the network test a user asks for: the action, its task, how it reads), `watch`
(what the periodic tasks look at). The dispatcher finds the work it hands on by registration:
`@dispatch.runs` on the functions here, `register_task` from clusters/tasks.py for the Celery
tasks, so nothing here imports what sits above it (docs/architecture.md, "Inside clusters").
Callers import this package, never its modules.
"""

from clusters.lifecycle.actions import add_workers, mark_lost, retry_install, stop, terminate
from clusters.lifecycle.dispatch import (
    CollectingDispatcher,
    Dispatcher,
    advance_pending_key,
    dispatching_to,
    enqueue_advance,
    register_task,
)
from clusters.lifecycle.grow import WorkersPlan, plan_add_workers
from clusters.lifecycle.network_test import (
    NETWORK_TEST_SECONDS,
    do_network_test,
    network_test_report,
    run_network_test,
)
from clusters.lifecycle.reconcile import advance, step_deadlines
from clusters.lifecycle.records import Action, ActionKind, Failure, NodeWork, Outcome
from clusters.lifecycle.repair import (
    HEAD_REFUSAL,
    ReplacePlan,
    auto_repair,
    node_problem,
    plan_replace,
    replace_node,
    set_repair_policy,
)
from clusters.lifecycle.reserve import (
    Checked,
    Quoted,
    create_cluster,
    key_spend_per_hour,
    plan_create,
    reserve_hosts,
    size_refusal,
)
from clusters.lifecycle.rules import (
    CHECK_EVERY,
    INSTALL_SECONDS,
    LEASE_SECONDS,
    RELEASE_ATTEMPTS,
    RETRY_AFTER,
    START_ATTEMPTS,
    agent_token,
    hardware_problem,
    joining,
    lock_cluster,
    reachability_matrix,
    step_deadline,
    token_hash,
)
from clusters.lifecycle.unit import NODE_FIELDS, UnitOfWork
from clusters.lifecycle.watch import clusters_needing_work, sweep_orphan_hosts, watch_heartbeats
from clusters.lifecycle.work import do_node_work, do_work, install_plan, node_plan_for

__all__ = [
    "CHECK_EVERY",
    "HEAD_REFUSAL",
    "ReplacePlan",
    "WorkersPlan",
    "plan_add_workers",
    "auto_repair",
    "node_problem",
    "plan_replace",
    "replace_node",
    "set_repair_policy",
    "INSTALL_SECONDS",
    "LEASE_SECONDS",
    "NETWORK_TEST_SECONDS",
    "NODE_FIELDS",
    "Quoted",
    "RELEASE_ATTEMPTS",
    "RETRY_AFTER",
    "START_ATTEMPTS",
    "Action",
    "ActionKind",
    "Checked",
    "CollectingDispatcher",
    "Dispatcher",
    "Failure",
    "NodeWork",
    "Outcome",
    "add_workers",
    "advance",
    "advance_pending_key",
    "agent_token",
    "clusters_needing_work",
    "create_cluster",
    "dispatching_to",
    "do_network_test",
    "do_node_work",
    "do_work",
    "enqueue_advance",
    "hardware_problem",
    "install_plan",
    "joining",
    "key_spend_per_hour",
    "lock_cluster",
    "mark_lost",
    "network_test_report",
    "node_plan_for",
    "plan_create",
    "reachability_matrix",
    "register_task",
    "reserve_hosts",
    "size_refusal",
    "retry_install",
    "run_network_test",
    "step_deadline",
    "step_deadlines",
    "stop",
    "sweep_orphan_hosts",
    "terminate",
    "token_hash",
    "UnitOfWork",
    "watch_heartbeats",
]
