#!/bin/sh
# Runcrate: Ray on an ssh host (clusters/drivers/ssh.py runs it as root after the bootstrap, on
# every node of a cluster with software `ray`; docs/drivers.md, "Ray on ssh hosts").
#
# It reads software.env (beside this script: NODE_NAME, ROLE, HEAD_IP, PRIVATE_IP,
# GPUS_PER_NODE, APT_MIRROR, PIP_INDEX_URL, RAY_REQUIREMENT) and, each step only where
# something differs: makes the virtualenv /opt/runcrate/ray (python3-venv from the location's
# APT_MIRROR if the host lacks it) with the pinned Ray from the location's PIP_INDEX_URL; links
# `ray` into /usr/local/bin; starts the head on node-0 bound to its private address (GCS 6379,
# dashboard 8265, client 10001) or, on the others, waits for the head and joins it. Every node
# tells Ray its GPUs (--num-gpus). Like the bootstrap it prints "runcrate: changed WHAT" per
# change and ends with "runcrate: ok", or "runcrate: failed: WHY" (exit 4).
INSTALLER=Ray
# shellcheck source-path=SCRIPTDIR source=installer.sh
. "$(dirname "$0")/installer.sh"
VENV=/opt/runcrate/ray
VERSION=${RAY_REQUIREMENT##*==}
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
  set -- --disable-pip-version-check --no-input --no-cache-dir --quiet
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

# --- the head on node-0, every other node joined to it -----------------------------------------
if [ "$ROLE" = head ]; then
  set -- --head --node-ip-address="$PRIVATE_IP" --port=6379 --dashboard-host="$PRIVATE_IP" \
    --dashboard-port=8265 --ray-client-server-port=10001 --num-gpus="$GPUS_PER_NODE" \
    --disable-usage-stats
else
  set -- --address="$HEAD_IP:6379" --node-ip-address="$PRIVATE_IP" --num-gpus="$GPUS_PER_NODE" \
    --disable-usage-stats
fi
wanted="$VERSION $*"
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
