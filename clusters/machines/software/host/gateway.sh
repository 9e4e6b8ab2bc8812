#!/bin/sh
# Runcrate gateway: keep a cluster's jump user on a location's SSH gateway
# (clusters/machines/ssh.py, gateway_sync). Usage, with this script on stdin:
#   sh -s add cID SELF [LIVE...]    then on stdin: sync <<'RUNCRATE_KEYS' BASE64 RUNCRATE_KEYS
#   sh -s leave cID SELF [LIVE...]  then on stdin: sync <<'RUNCRATE_KEYS' BASE64 RUNCRATE_KEYS
#   sh -s remove cID                the user and everything of it, now
# SELF is the host:port of the node whose start (add) or release (leave) this is; LIVE are the
# host:port of the cluster's nodes that the dashboard sees holding their hosts. The gateway
# remembers which hosts registered (/var/lib/runcrate-gateway/cID/), so concurrent starts and
# stops of one cluster's nodes each change only their own entry: the user may forward to a host
# that registered and is still live; when none is left the user goes, with its home.
# The user has no shell; each key line carries `restrict,port-forwarding,permitopen="host:port"`,
# and every jump user is in the group runcrate-jump, for which sshd allows local forwarding only
# (sshd_config.d/zz-runcrate-gateway.conf: no -R listener, no stream-local socket, no agent, no
# TTY): `port-forwarding` alone would let a user listen on the gateway with ssh -R.
# Every change runs under one lock on the gateway (flock, or a mkdir lock where there is none),
# so two nodes never create or remove a user at once.
set -eu
umask 077
ACTION="${1:-}"
JUMP_USER="${2:-}"
STATE=/var/lib/runcrate-gateway
LOCK="$STATE/lock"
case "$JUMP_USER" in
  c*[!0-9]*|c) echo "runcrate: refused: $JUMP_USER is not a cluster's jump user"; exit 3 ;;
  c[0-9]*) ;;
  *) echo "runcrate: refused: $JUMP_USER is not a cluster's jump user"; exit 3 ;;
esac
case "$ACTION" in
  add|leave) [ $# -ge 3 ] || { echo "runcrate: refused: $ACTION needs the node's host"; exit 3; } ;;
  remove) ;;
  *) echo "runcrate: refused: unknown action $ACTION"; exit 3 ;;
esac
shift 2
for target in "$@"; do
  # host:port, as permitopen takes it (an IPv6 address in brackets): nothing that could end the
  # option's quotes or make a path.
  case "$target" in
    *[!A-Za-z0-9.:_\[\]-]*|*:|:*|*..*) echo "runcrate: refused: bad host $target"; exit 3 ;;
  esac
  case "${target##*:}" in ''|*[!0-9]*) echo "runcrate: refused: bad port in $target"; exit 3 ;; esac
done
mkdir -p "$STATE"
chmod 700 "$STATE"

# --- the lock ------------------------------------------------------------------------------------
LOCKED=""
unlock() { if [ "$LOCKED" = dir ]; then rmdir "$LOCK.d" 2>/dev/null || true; fi; LOCKED=""; }
lock() {
  if command -v flock >/dev/null 2>&1; then
    exec 9>"$LOCK"
    flock -w 120 9 || { echo "runcrate: failed: the gateway's lock is held for 120 s"; exit 4; }
    LOCKED=flock
    return
  fi
  i=0
  until mkdir "$LOCK.d" 2>/dev/null; do
    i=$((i+1))
    # A lock left by a killed run (older than 10 minutes) is taken over.
    if [ -n "$(find "$LOCK.d" -maxdepth 0 -mmin +10 2>/dev/null)" ]; then
      rmdir "$LOCK.d" 2>/dev/null || true
    fi
    [ $i -lt 1200 ] || { echo "runcrate: failed: the gateway's lock is held for 120 s"; exit 4; }
    sleep 0.1
  done
  LOCKED=dir
  trap unlock EXIT
  trap 'unlock; exit 4' HUP INT TERM
}

# --- what sshd allows the jump users ------------------------------------------------------------
JUMP_GROUP=runcrate-jump
SSHD_DROP_IN=/etc/ssh/sshd_config.d/zz-runcrate-gateway.conf
ensure_sshd_rules() {  # the drop-in, exactly; sshd reloaded when it changed (checked first)
  want="# Runcrate gateway (clusters/machines/software/host/gateway.sh): the clusters' jump users forward
# only locally, to their own cluster's hosts (permitopen in each key line).
Match Group $JUMP_GROUP
    AllowTcpForwarding local
    AllowStreamLocalForwarding no
    PermitListen none
    AllowAgentForwarding no
    X11Forwarding no
    PermitTTY no
    PermitTunnel no
    GatewayPorts no"
  if [ -f "$SSHD_DROP_IN" ] && [ ! -L "$SSHD_DROP_IN" ] && [ "$(cat "$SSHD_DROP_IN")" = "$want" ]; then
    return
  fi
  mkdir -p "${SSHD_DROP_IN%/*}"
  rm -f -- "$SSHD_DROP_IN"
  printf '%s\n' "$want" > "$SSHD_DROP_IN.new"
  chmod 644 "$SSHD_DROP_IN.new"
  mv -f "$SSHD_DROP_IN.new" "$SSHD_DROP_IN"
  if ! sshd -t >/dev/null 2>&1; then
    rm -f -- "$SSHD_DROP_IN"
    echo "runcrate: failed: sshd refuses the jump users' rules ($SSHD_DROP_IN)"; exit 4
  fi
  pid=$(cat /run/sshd.pid 2>/dev/null || true)
  case "$pid" in ''|*[!0-9]*) echo "runcrate: failed: no sshd to reload (/run/sshd.pid)"; exit 4 ;; esac
  kill -HUP "$pid" || { echo "runcrate: failed: could not reload sshd"; exit 4; }
}

# --- the user --------------------------------------------------------------------------------
home_of() { getent passwd "$JUMP_USER" | cut -d: -f6; }

remove_user() {  # the user, its processes (jump sessions), its home and mail spool: all of it
  home=$(home_of)
  if id "$JUMP_USER" >/dev/null 2>&1; then
    pkill -KILL -u "$JUMP_USER" 2>/dev/null || true
    # What its sessions left where anyone may write (a socket a -R made before the rules, a
    # file): owned by a uid the next jump user may get.
    for shared in /tmp /var/tmp /dev/shm /run/user; do
      if [ -d "$shared" ]; then find "$shared" -xdev -user "$JUMP_USER" -delete 2>/dev/null || true; fi
    done
    userdel -r -f "$JUMP_USER" >/dev/null 2>&1 || userdel -f "$JUMP_USER" >/dev/null 2>&1 || true
    if id "$JUMP_USER" >/dev/null 2>&1; then
      echo "runcrate: failed: could not remove the user $JUMP_USER"; exit 4
    fi
  fi
  if getent group "$JUMP_USER" >/dev/null 2>&1; then groupdel "$JUMP_USER" >/dev/null 2>&1 || true; fi
  for left in "$home" "/home/$JUMP_USER" "/var/mail/$JUMP_USER" "/var/spool/mail/$JUMP_USER"; do
    case "$left" in /home/c[0-9]*|/var/mail/c[0-9]*|/var/spool/mail/c[0-9]*) ;; *) continue ;; esac
    if [ -e "$left" ] || [ -L "$left" ]; then rm -rf -- "$left"; fi
    if [ -e "$left" ]; then echo "runcrate: failed: could not remove $left"; exit 4; fi
  done
  rm -rf -- "${STATE:?}/$JUMP_USER"
}

ensure_user() {  # the user, with a home that is its own (a home left by anyone else goes first)
  ensure_sshd_rules
  groupadd -f "$JUMP_GROUP" || { echo "runcrate: failed: could not create the group $JUMP_GROUP"; exit 4; }
  if ! id "$JUMP_USER" >/dev/null 2>&1; then
    if [ -e "/home/$JUMP_USER" ] || [ -L "/home/$JUMP_USER" ]; then rm -rf -- "/home/${JUMP_USER:?}"; fi
    useradd --create-home --home-dir "/home/$JUMP_USER" --shell /usr/sbin/nologin "$JUMP_USER" \
      || { echo "runcrate: failed: could not create the user $JUMP_USER"; exit 4; }
  fi
  usermod -a -G "$JUMP_GROUP" "$JUMP_USER" \
    || { echo "runcrate: failed: could not put $JUMP_USER in $JUMP_GROUP"; exit 4; }
  home=$(home_of)
  case "$home" in /home/c[0-9]*) ;; *) echo "runcrate: failed: $JUMP_USER's home is $home"; exit 4 ;; esac
  group=$(id -gn "$JUMP_USER")
  if [ -L "$home" ] || [ -L "$home/.ssh" ]; then rm -rf -- "$home"; fi
  mkdir -p "$home/.ssh"
  chown "$JUMP_USER:$group" "$home" "$home/.ssh"
  chmod 750 "$home"
  chmod 700 "$home/.ssh"
}

write_keys() {  # write_keys KEYS_FILE PERMITOPEN_OPTIONS: replaced whole, never half-written
  ensure_user
  new="$home/.ssh/authorized_keys.runcrate.$$"
  while IFS= read -r key || [ -n "$key" ]; do
    case "$key" in ''|'#'*) continue ;; esac
    printf 'restrict,port-forwarding,%s %s\n' "$2" "$key"
  done < "$1" > "$new"
  chown "$JUMP_USER:$group" "$new"
  chmod 600 "$new"
  mv -f "$new" "$home/.ssh/authorized_keys"
}

# --- sync: what registered, what is live, the user to match --------------------------------------
sync() {  # stdin: the users' public keys, base64
  self="$1"; shift
  lock
  registered="$STATE/$JUMP_USER"
  mkdir -p "$registered"
  if [ "$ACTION" = add ]; then : > "$registered/$self"; else rm -f -- "$registered/$self"; fi
  options=""
  for entry in "$registered"/*; do
    [ -e "$entry" ] || continue
    target=$(basename "$entry")
    live=0
    for t in "$@"; do if [ "$t" = "$target" ]; then live=1; fi; done
    if [ $live = 0 ]; then rm -f -- "$entry"; continue; fi
    options="$options${options:+,}permitopen=\"$target\""
  done
  if [ -z "$options" ]; then
    remove_user
  else
    keys="$registered.keys.$$"
    base64 -d > "$keys" || { rm -f "$keys"; echo "runcrate: failed: the keys are not base64"; exit 4; }
    write_keys "$keys" "$options"
    rm -f "$keys"
  fi
  unlock
  echo "runcrate: ok"
}

if [ "$ACTION" = remove ]; then
  lock
  remove_user
  unlock
  echo "runcrate: ok"
fi
# add and leave: sync follows on stdin.
