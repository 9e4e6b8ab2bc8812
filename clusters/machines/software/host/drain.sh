#!/bin/sh
# Runcrate: take a cluster's nodes out of scheduling, and give back those it took out
# (clusters/machines/ssh.py runs it as root on the head, node-0; docs/drivers.md, "Draining a
# node").
#
# It reads, beside it, drain.env (SOFTWARE, NODE_NAME, HEAD_IP, NODES: every joined node) and
# drain.list (one line per node to drain, `node-2<TAB>why, in words`; empty: drain nothing), and
# makes the scheduler match the list: each listed node drained with the reason
# "runcrate: WHY", and each other node that the product drained before (its reason, annotation
# or marker starts with "runcrate:") resumed. What a user drained by hand is never touched, not
# even when the list names that node. Only what differs changes. It prints
# "runcrate: drained N", "runcrate: resumed N" or "runcrate: skipped N (WHY)" per node and ends
# with "runcrate: ok", or "runcrate: failed: WHY" (exit 4) after trying every node. Every
# command it runs is bounded (`timeout`).
set -eu
umask 022
DRAIN_DIR="$(dirname "$0")"
say() { echo "runcrate: $*"; }
fail() { say "failed: $*"; exit 4; }

[ -f "$DRAIN_DIR/drain.env" ] || fail "no drain.env in $DRAIN_DIR"
[ -f "$DRAIN_DIR/drain.list" ] || fail "no drain.list in $DRAIN_DIR"
# shellcheck disable=SC1091
. "$DRAIN_DIR/drain.env"
[ "$(id -u)" = 0 ] || fail "drain.sh must run as root"
PREFIX="runcrate: "
TAB="$(printf '\t')"
failures=""
failed_on() { failures="${failures:+$failures; }$*"; }

is_node() {
  case "$1" in '' | *[!A-Za-z0-9._-]*) return 1 ;; esac
  case " $NODES " in *" $1 "*) return 0 ;; esac
  return 1
}
ours() { case "$1" in "runcrate:"*) return 0 ;; esac; return 1; }
# A reason as the schedulers take it: no quotes or backslashes (it travels inside commands),
# no control characters, at most 200 bytes.
clean() {
  printf '%s' "$1" | tr -d "\"'\\\\\`" | tr '\001-\037\177' ' ' | cut -c1-200
}
last() { printf '%s\n' "$1" | sed '/^[[:space:]]*$/d' | tail -n 1; }

# --- the list, cleaned: only this cluster's nodes, each once ------------------------------------
WANTED="$DRAIN_DIR/wanted"
: > "$WANTED"
while IFS= read -r line || [ -n "$line" ]; do
  [ -n "$line" ] || continue
  node=${line%%"$TAB"*}
  why=""
  [ "$node" = "$line" ] || why=$(clean "${line#*"$TAB"}")
  [ -n "$why" ] || why="no reason given"
  if ! is_node "$node"; then
    say "skipped $(clean "$node") (not a node of this cluster)"
  elif ! grep -q "^$node$TAB" "$WANTED"; then
    printf '%s\t%s\n' "$node" "$why" >> "$WANTED"
  fi
done < "$DRAIN_DIR/drain.list"
# wanted NODE: prints "runcrate: WHY" where the list names NODE; fails otherwise.
wanted() {
  why=$(awk -F "$TAB" -v n="$1" '$1 == n { print substr($0, length($1) + 2); found = 1; exit }
    END { exit !found }' "$WANTED") || return 1
  printf '%s%s\n' "$PREFIX" "$why"
}

# --- Slurm: scontrol on the head ---------------------------------------------------------------
drain_slurm() {
  table="$DRAIN_DIR/slurm-nodes"
  out=$(timeout 30 sinfo -h -N -o '%N|%T|%E' 2>&1) \
    || fail "sinfo on $NODE_NAME failed: $(last "$out")"
  printf '%s\n' "$out" > "$table"
  for node in $NODES; do
    # One line per node and partition: the first is enough. A node missing from it is not in
    # slurm.conf yet (a worker still joining).
    line=$(awk -F '|' -v n="$node" '$1 == n { print; exit }' "$table")
    rest=${line#*|}
    state=${rest%%|*}
    reason=${rest#*|}
    case "$state" in *drain* | *DRAIN*) drained=1 ;; *) drained=0 ;; esac
    if want=$(wanted "$node"); then
      if [ -z "$line" ]; then
        say "skipped $node (Slurm does not know it yet: it is not in slurm.conf)"
      elif [ "$drained" = 1 ] && [ "$reason" = "$want" ]; then
        continue
      elif [ "$drained" = 1 ] && ! ours "$reason"; then
        say "skipped $node (drained by hand: ${reason:-no reason})"
      elif out=$(timeout 30 scontrol update NodeName="$node" State=DRAIN Reason="$want" 2>&1); then
        say "drained $node"
      else
        failed_on "scontrol could not drain $node: $(last "$out")"
      fi
    elif [ -n "$line" ] && ours "$reason"; then
      if out=$(timeout 30 scontrol update NodeName="$node" State=RESUME 2>&1); then
        say "resumed $node"
      else
        failed_on "scontrol could not resume $node: $(last "$out")"
      fi
    fi
  done
}

# --- Kubernetes (k3s): kubectl on the head ------------------------------------------------------
# The product's drain is a cordon plus the annotation runcrate.drained that holds its reason; a
# node cordoned without it was cordoned by hand. The annotation is written before the cordon
# and taken away after the uncordon, so a run cut short is finished by the next.
drain_kubernetes() {
  table="$DRAIN_DIR/kubernetes-nodes"
  out=$(timeout 30 kubectl get nodes -o jsonpath='{range .items[*]}{.metadata.name}{"|"}{.spec.unschedulable}{"|"}{.metadata.annotations.runcrate\.drained}{"\n"}{end}' 2>&1) \
    || fail "kubectl get nodes on $NODE_NAME failed: $(last "$out")"
  printf '%s\n' "$out" > "$table"
  for node in $NODES; do
    line=$(awk -F '|' -v n="$node" '$1 == n { print; exit }' "$table")
    rest=${line#*|}
    cordoned=${rest%%|*}
    note=${rest#*|}
    if want=$(wanted "$node"); then
      if [ -z "$line" ]; then
        say "skipped $node (Kubernetes does not know it yet)"
      elif [ "$cordoned" = true ] && [ "$note" = "$want" ]; then
        continue
      elif [ "$cordoned" = true ] && ! ours "$note"; then
        say "skipped $node (cordoned by hand)"
      elif ! out=$(timeout 30 kubectl annotate node "$node" "runcrate.drained=$want" --overwrite 2>&1); then
        failed_on "kubectl could not annotate $node: $(last "$out")"
      elif ! out=$(timeout 30 kubectl cordon "$node" 2>&1); then
        failed_on "kubectl could not cordon $node: $(last "$out")"
      else
        say "drained $node"
      fi
    elif [ -n "$line" ] && ours "$note"; then
      if ! out=$(timeout 30 kubectl uncordon "$node" 2>&1); then
        failed_on "kubectl could not uncordon $node: $(last "$out")"
      elif ! out=$(timeout 30 kubectl annotate node "$node" runcrate.drained- 2>&1); then
        failed_on "kubectl could not remove the annotation of $node: $(last "$out")"
      else
        say "resumed $node"
      fi
    fi
  done
}

# --- Ray: the node's raylet, over the cluster's own SSH key -------------------------------------
# Ray 2.60 (RAY_REQUIREMENT) has `ray drain-node`, but hidden and, in its own words, "NOT a
# public API" (its docs call it a developer API outside Ray's stability guarantees): it wants
# the node's hex id, takes only the reasons IDLE_TERMINATION or PREEMPTION, and has no undo:
# a drained node is meant to be killed. So a node is drained here the way Ray loses one: its
# raylet stopped (`ray stop --force`, which also ends the tasks running there; Ray reschedules
# what it may), and a marker /etc/runcrate/ray.drained on the node holds the reason. Undrained,
# it starts again with the arguments install-ray.sh started it with (/etc/runcrate/ray.args:
# "VERSION auth=HASH ARGS…") and joins the head, and the marker goes. The head's raylet is
# never stopped: it is the cluster's GCS. Each remote script prints its verdict as its last
# line; the reason travels on stdin, never on a command line.
# shellcheck disable=SC2016 # expanded on the node
RAY_ENV='PATH=/opt/runcrate/ray/bin:$PATH; RAY_USAGE_STATS_ENABLED=0; RAY_AUTH_MODE=token
export PATH RAY_USAGE_STATS_ENABLED RAY_AUTH_MODE
marker=/etc/runcrate/ray.drained
running() { pgrep -f "/opt/runcrate/ray/.*/[r]aylet" >/dev/null 2>&1; }
'
# shellcheck disable=SC2016 # expanded on the node
RAY_DRAIN=$RAY_ENV'want=$(cat)
if [ "$(cat "$marker" 2>/dev/null)" = "$want" ] && ! running; then echo same; exit 0; fi
mkdir -p /etc/runcrate && printf "%s\n" "$want" > "$marker" || { echo "cannot write $marker"; exit 1; }
timeout 30 ray stop --force >/dev/null 2>&1 || true
if running; then echo "its raylet still runs after ray stop --force"; exit 1; fi
echo drained'
# shellcheck disable=SC2016 # expanded on the node
RAY_RESUME=$RAY_ENV'[ -f "$marker" ] || { echo none; exit 0; }
if ! running; then
  args=$(cut -d " " -f 3- /etc/runcrate/ray.args 2>/dev/null) || args=""
  [ -n "$args" ] || { echo "no /etc/runcrate/ray.args to start its raylet with"; exit 1; }
  if ! out=$(timeout 90 ray start $args 2>&1); then
    printf "%s\n" "$out" | tail -n 5; echo "ray start failed"; exit 1
  fi
fi
rm -f "$marker"
echo resumed'
ray_on() {  # ray_on NODE SECONDS SCRIPT: the script's output; its status, 255 if unreachable
  timeout "$2" ssh -o BatchMode=yes -o ConnectTimeout=10 "$1" "$3" 2>&1
}
drain_ray() {
  for node in $NODES; do
    if want=$(wanted "$node"); then
      if [ "$node" = "$NODE_NAME" ]; then
        say "skipped $node (the Ray head: stopping its raylet would stop the whole cluster)"
        continue
      fi
      status=0
      out=$(printf '%s\n' "$want" | ray_on "$node" 40 "$RAY_DRAIN") || status=$?
      verdict=$(last "$out")
      case "$status:$verdict" in
        0:same) ;;
        0:drained) say "drained $node" ;;
        255:*) say "skipped $node (not reachable over SSH from $NODE_NAME: $verdict)" ;;
        *) failed_on "could not stop the raylet of $node: ${verdict:-no answer in 40 s}" ;;
      esac
    elif [ "$node" != "$NODE_NAME" ]; then
      status=0
      out=$(ray_on "$node" 120 "$RAY_RESUME" < /dev/null) || status=$?
      verdict=$(last "$out")
      case "$status:$verdict" in
        0:none) ;;
        0:resumed) say "resumed $node" ;;
        255:*) say "skipped $node (not reachable over SSH from $NODE_NAME to undo a drain: $verdict)" ;;
        *) failed_on "could not start the raylet of $node again: ${verdict:-no answer in 120 s}" ;;
      esac
    fi
  done
}

case "$SOFTWARE" in
  slurm) drain_slurm ;;
  kubernetes) drain_kubernetes ;;
  ray) drain_ray ;;
  none) ;;
  *) fail "unknown SOFTWARE $SOFTWARE" ;;
esac
[ -z "$failures" ] || fail "$failures"
say "ok"
