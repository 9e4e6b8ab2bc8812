#!/bin/sh
# Runcrate: Ray on an ssh host (clusters/machines/ssh.py runs it as root after the bootstrap, on
# every node of a cluster with software `ray`; docs/drivers.md, "Ray on ssh hosts").
#
# It reads software.env (beside this script: NODE_NAME, ROLE, HEAD_IP, PRIVATE_IP,
# GPUS_PER_NODE, APT_MIRROR, PIP_INDEX_URL, RAY_REQUIREMENT) and, each step only where
# something differs: makes the virtualenv /opt/runcrate/ray (python3-venv from the location's
# APT_MIRROR if the host lacks it) with the pinned Ray from the location's PIP_INDEX_URL; links
# `ray` into /usr/local/bin; starts the head on node-0 bound to its private address (GCS 6379,
# dashboard 8265, client 10001) or, on the others, waits for the head and joins it. Every node
# tells Ray its GPUs (--num-gpus). Ray runs with its token authentication (RAY_AUTH_MODE=token):
# the cluster's token (RAY_AUTH_TOKEN in software.env, derived per cluster, the same on every
# node) in root's ~/.ray/auth_token, where Ray and `ray get-auth-token` read it, and
# RAY_AUTH_MODE=token in /etc/environment (a block of its own), so the `ray` commands of every
# login send it. Like the bootstrap it prints "runcrate: changed WHAT" per change and ends with
# "runcrate: ok", or "runcrate: failed: WHY" (exit 4).
INSTALLER=Ray
# shellcheck source-path=SCRIPTDIR source=installer.sh
. "$(dirname "$0")/installer.sh"
VENV=/opt/runcrate/ray
VERSION=${RAY_REQUIREMENT##*==}
# "VERSION auth=HASH ARGS…": what this node's Ray was started with; drain.sh starts an undrained
# node again with the ARGS (every word from the third on).
STATE=/etc/runcrate/ray.args
LOG="$SOFTWARE_DIR/ray-install.log"
# Ray sends nothing home, and its programs are found on PATH by the jobs it runs.
export RAY_USAGE_STATS_ENABLED=0
PATH="$VENV/bin:$PATH"
export PATH

# --- python3-venv: only if missing, from the location's mirror only ----------------------------
if ! python3 -c 'import ensurepip, venv' >/dev/null 2>&1; then apt_install python3-venv; fi

# --- the pinned Ray in its own virtualenv ------------------------------------------------------
installed=$("$VENV/bin/python" -c 'import ray; print(ray.__version__)' 2>/dev/null || true)
if [ "$installed" != "$VERSION" ]; then
  rm -rf "$VENV"
  python3 -m venv "$VENV" >"$LOG" 2>&1 || { tail -n 20 "$LOG"; fail "python3 -m venv $VENV failed"; }
  # --no-compile: no .pyc for Ray's thousands of modules at install (CPU every node spends at
  # once); Python compiles what `ray start` imports when it first imports it.
  set -- --disable-pip-version-check --no-input --no-cache-dir --no-compile --quiet
  if [ -n "${PIP_INDEX_URL:-}" ]; then
    set -- "$@" --index-url "$PIP_INDEX_URL"
    case "$PIP_INDEX_URL" in
      # A mirror served over plain http on the location's own network.
      http://*) index_host=${PIP_INDEX_URL#http://}; set -- "$@" --trusted-host "${index_host%%[/:]*}" ;;
    esac
  fi
  if ! "$VENV/bin/pip" install "$@" "$RAY_REQUIREMENT" >"$LOG" 2>&1; then
    tail -n 20 "$LOG"
    rm -rf "$VENV"
    fail "could not install $RAY_REQUIREMENT from ${PIP_INDEX_URL:-the default index}"
  fi
  say "changed ray-$VERSION"
fi
if [ "$(readlink /usr/local/bin/ray 2>/dev/null)" != "$VENV/bin/ray" ]; then
  mkdir -p /usr/local/bin
  ln -sfn "$VENV/bin/ray" /usr/local/bin/ray
  say "changed ray-command"
fi

# --- token authentication: the cluster's token for root, the mode for every login -------------
[ -n "${RAY_AUTH_TOKEN:-}" ] || fail "software.env gives no RAY_AUTH_TOKEN"
export RAY_AUTH_MODE=token
ROOT_HOME=$(getent passwd root | cut -d: -f6)
TOKEN_FILE="${ROOT_HOME:-/root}/.ray/auth_token"
if [ "$(cat "$TOKEN_FILE" 2>/dev/null)" != "$RAY_AUTH_TOKEN" ]; then
  mkdir -p "$(dirname "$TOKEN_FILE")"
  chmod 700 "$(dirname "$TOKEN_FILE")"
  (umask 077; printf '%s' "$RAY_AUTH_TOKEN" > "$TOKEN_FILE.runcrate.$$")
  mv -f "$TOKEN_FILE.runcrate.$$" "$TOKEN_FILE"
  say "changed ray-token"
fi
ENV_BEGIN="# BEGIN runcrate ray"
ENV_END="# END runcrate ray"
if ! grep -qx "$ENV_BEGIN" /etc/environment 2>/dev/null \
  || ! grep -qx "RAY_AUTH_MODE=token" /etc/environment; then
  env_tmp="/etc/environment.runcrate.$$"
  awk -v b="$ENV_BEGIN" -v e="$ENV_END" '$0==b{on=1;next} $0==e{on=0;next} !on' \
    /etc/environment 2>/dev/null > "$env_tmp" || true
  printf '%s\nRAY_AUTH_MODE=token\n%s\n' "$ENV_BEGIN" "$ENV_END" >> "$env_tmp"
  cat "$env_tmp" > /etc/environment
  rm -f "$env_tmp"
  say "changed ray-environment"
fi

# --- the head on node-0, every other node joined to it -----------------------------------------
if [ "$ROLE" = head ]; then
  set -- --head --node-ip-address="$PRIVATE_IP" --port=6379 --dashboard-host="$PRIVATE_IP" \
    --dashboard-port=8265 --ray-client-server-port=10001 --num-gpus="$GPUS_PER_NODE" \
    --disable-usage-stats
else
  set -- --address="$HEAD_IP:6379" --node-ip-address="$PRIVATE_IP" --num-gpus="$GPUS_PER_NODE" \
    --disable-usage-stats
fi
# The token's hash: a new token restarts Ray.
wanted="$VERSION auth=$(printf '%s' "$RAY_AUTH_TOKEN" | sha256sum | cut -c1-16) $*"
running() { pgrep -f "$VENV/.*/[r]aylet" >/dev/null 2>&1; }
if running && [ "$(cat "$STATE" 2>/dev/null)" != "$wanted" ]; then
  ray stop --force >/dev/null 2>&1 || true
  say "changed ray-stopped"
fi
if ! running; then
  if [ "$ROLE" != head ]; then
    # The head's installer runs at the same time: wait for its GCS (bounded), then join.
    python3 - "$HEAD_IP" <<'EOF' || fail "the Ray head at $HEAD_IP:6379 did not answer in 300 s"
import socket, sys, time
deadline = time.monotonic() + 300
while True:
    try:
        socket.create_connection((sys.argv[1], 6379), timeout=2).close()
        break
    except OSError:
        if time.monotonic() > deadline:
            sys.exit(1)
        time.sleep(1)
EOF
  fi
  if ! ray start "$@" >"$LOG" 2>&1; then
    tail -n 30 "$LOG"
    fail "ray start did not start this node"
  fi
  mkdir -p "$(dirname "$STATE")"
  echo "$wanted" > "$STATE"
  say "changed ray-running"
fi
say "ray=$VERSION"
say "ok"
