#!/bin/sh
# Runcrate gateway: keep a cluster's jump user on a location's SSH gateway
# (clusters/drivers/ssh.py). Usage, with this script on stdin:
#   sh -s add cID     followed on stdin by: write_keys <<'RUNCRATE_KEYS' … RUNCRATE_KEYS
#   sh -s remove cID
# The user has no shell; each key line carries `restrict,port-forwarding,permitopen="host:port"`
# so the cluster's users can only jump to that cluster's hosts.
set -eu
ACTION="${1:-}"
JUMP_USER="${2:-}"
case "$JUMP_USER" in
  c[0-9]*) ;;
  *) echo "runcrate: refused: $JUMP_USER is not a cluster's jump user"; exit 3 ;;
esac

write_keys() {
  if ! id "$JUMP_USER" >/dev/null 2>&1; then
    useradd --create-home --shell /usr/sbin/nologin "$JUMP_USER"
  fi
  home=$(getent passwd "$JUMP_USER" | cut -d: -f6)
  mkdir -p "$home/.ssh"
  cat > "$home/.ssh/authorized_keys.new"
  chmod 600 "$home/.ssh/authorized_keys.new"
  mv "$home/.ssh/authorized_keys.new" "$home/.ssh/authorized_keys"
  chmod 700 "$home/.ssh"
  chown -R "$JUMP_USER" "$home/.ssh"
  echo "runcrate: ok"
}

case "$ACTION" in
  add) ;;  # write_keys follows on stdin
  remove)
    if id "$JUMP_USER" >/dev/null 2>&1; then userdel -r "$JUMP_USER" >/dev/null 2>&1 || true; fi
    echo "runcrate: ok" ;;
  *) echo "runcrate: refused: unknown action $ACTION"; exit 3 ;;
esac
