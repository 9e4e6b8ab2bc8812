#!/bin/sh
# Runcrate: Slurm on an ssh host (clusters/machines/ssh.py runs it as root after the bootstrap,
# on every node of a cluster with software `slurm`; docs/drivers.md, "Slurm on ssh hosts").
#
# It reads software.env (beside this script: SOFTWARE, CLUSTER_NAME, NODE_NAME, ROLE, HEAD_NAME,
# HEAD_IP, NODES, GPUS_PER_NODE, APT_MIRROR, CLUSTER_SECRET_B64) and, each step only where
# something differs: installs what is missing (slurmd, slurmctld, slurm-client, munge) from the
# location's APT_MIRROR only; installs the cluster's munge key and runs munged; writes
# /etc/slurm/slurm.conf (the same on every node: made from software.env and every node's CPUs and
# memory, read over the cluster's own SSH key) and gres.conf; runs slurmctld on the head and
# slurmd everywhere, restarted only when their configuration changed. Like the bootstrap it
# prints "runcrate: changed WHAT" per change and ends with "runcrate: ok", or
# "runcrate: failed: WHY" (exit 4).
#
# A worker added to a running cluster renders a slurm.conf with one node more than the others
# hold: it gives every node whose runcrate slurm.conf differs its own (this script and the file,
# over the cluster's SSH key) and runs the script there with RUNCRATE_SLURM_CONF naming the file,
# which installs it as it is and restarts that node's daemons (slurmctld on the head, slurmd);
# then `scontrol reconfigure` on the head. The daemons listen on the private network only: each
# node at its rc0 address (NodeAddr), the controller at the head's (SlurmctldHost).
INSTALLER=Slurm
# shellcheck source-path=SCRIPTDIR source=installer.sh
. "$(dirname "$0")/installer.sh"
# One run at a time changes a node: its own install, and one a new worker asks for. The lock is
# let go while this run waits on the other nodes (two nodes that give each other their file
# never wait on each other); the daemons get no copy of its descriptor (`8>&-`).
LOCKING=0
if command -v flock >/dev/null 2>&1; then LOCKING=1; exec 8>"$SOFTWARE_DIR/.install-slurm.lock"; fi
lock() {
  [ "$LOCKING" = 0 ] || flock -w 300 8 || fail "another Slurm install on $NODE_NAME held its lock for 300 s"
}
unlock() { [ "$LOCKING" = 0 ] || flock -u 8; }
lock
PEER_CONF="${RUNCRATE_SLURM_CONF:-}"
SYSTEMD=0
if [ -d /run/systemd/system ] && command -v systemctl >/dev/null 2>&1; then SYSTEMD=1; fi
HEADER="# Written by runcrate (install-slurm.sh) for cluster $CLUSTER_NAME: the same on every node."
LOGS=/var/log/slurm
STAND_IN=/etc/slurm/runcrate-stand-in-gpus

# --- packages: only what is missing, from the location's mirror only ----------------------------
missing=""
command -v slurmd >/dev/null 2>&1 || missing="$missing slurmd"
command -v slurmctld >/dev/null 2>&1 || missing="$missing slurmctld"
command -v sinfo >/dev/null 2>&1 || missing="$missing slurm-client"
command -v munged >/dev/null 2>&1 || missing="$missing munge"
# shellcheck disable=SC2086 # one word per package
if [ -n "$missing" ]; then apt_install $missing; fi
id slurm >/dev/null 2>&1 || fail "the Slurm packages made no user slurm"
id munge >/dev/null 2>&1 || fail "the munge package made no user munge"

install_file() {  # install_file SRC DEST MODE OWNER WHAT: prints and returns 0 when it changed
  if cmp -s "$1" "$2" 2>/dev/null; then rm -f "$1"; return 1; fi
  mkdir -p "$(dirname "$2")"
  chmod "$3" "$1"; chown "$4" "$1"; mv "$1" "$2"
  say "changed $5"
  return 0
}

# --- a daemon with a pidfile, where there is no systemd -----------------------------------------
running() { [ -s "$1" ] && kill -0 "$(cat "$1")" 2>/dev/null; }
stop_pid() {  # stop_pid PIDFILE
  running "$1" || return 0
  pid=$(cat "$1")
  kill "$pid" 2>/dev/null || true
  i=0; while kill -0 "$pid" 2>/dev/null && [ $i -lt 100 ]; do sleep 0.1; i=$((i+1)); done
  kill -9 "$pid" 2>/dev/null || true
  rm -f "$1"
}
started() {  # started PIDFILE NAME LOG: it must still run a moment later
  i=0; while ! running "$1" && [ $i -lt 50 ]; do sleep 0.1; i=$((i+1)); done
  sleep 0.5
  if ! running "$1"; then
    [ ! -f "$3" ] || tail -n 20 "$3"
    fail "$2 did not start (its log: $3)"
  fi
}

# --- munge: the cluster's key, munged running ----------------------------------------------------
mkdir -p /etc/munge /var/lib/munge /var/log/munge /run/munge
chown munge:munge /etc/munge /var/lib/munge /var/log/munge /run/munge
chmod 700 /etc/munge /var/log/munge
chmod 711 /var/lib/munge
chmod 755 /run/munge
key_tmp=/etc/munge/munge.key.runcrate.$$
(umask 077; printf '%s' "$CLUSTER_SECRET_B64" | base64 -d > "$key_tmp") \
  || { rm -f "$key_tmp"; fail "CLUSTER_SECRET_B64 is not base64"; }
[ "$(wc -c < "$key_tmp")" -ge 32 ] || { rm -f "$key_tmp"; fail "the cluster's munge key is too short"; }
munge_changed=0
if install_file "$key_tmp" /etc/munge/munge.key 400 munge:munge munge-key; then munge_changed=1; fi
if [ "$SYSTEMD" = 1 ]; then
  if [ "$munge_changed" = 1 ] || ! systemctl is-active --quiet munge; then
    systemctl enable munge >/dev/null 2>&1 || true
    systemctl restart munge
    say "changed munged-running"
  fi
else
  MUNGE_PID=/run/munge/munged.pid
  if [ "$munge_changed" = 1 ]; then stop_pid "$MUNGE_PID"; fi
  if ! running "$MUNGE_PID"; then
    runuser -u munge -- /usr/sbin/munged --force </dev/null >/dev/null 2>&1 8>&- \
      || { tail -n 20 /var/log/munge/munged.log 2>/dev/null; fail "munged did not start"; }
    started "$MUNGE_PID" munged /var/log/munge/munged.log
    say "changed munged-running"
  fi
fi

# --- every node's CPUs, memory and private address: here, and over the cluster's own SSH key ------
FACTS='echo "$(nproc) $(awk "/^MemTotal:/ {print \$2}" /proc/meminfo) $(ip -4 -o addr show dev rc0 2>/dev/null | awk "NR == 1 {print \$4}" | cut -d/ -f1)"'
node_facts() {  # node_facts NODE: "CPUS MEMTOTAL_KIB RC0_ADDRESS"
  if [ "$1" = "$NODE_NAME" ]; then sh -c "$FACTS"; return; fi
  tries=0
  while :; do
    if out=$(ssh -o BatchMode=yes -o ConnectTimeout=10 "$1" "$FACTS" 2>&1); then
      echo "$out"; return 0
    fi
    tries=$((tries+1))
    [ $tries -lt 5 ] || { echo "$out" >&2; return 1; }
    sleep 2
  done
}
GPUS="${GPUS_PER_NODE:-0}"
gres=""
[ "$GPUS" -gt 0 ] && gres=" Gres=gpu:$GPUS"
facts_file="$SOFTWARE_DIR/node-facts"
: > "$facts_file"
count=0
# A new worker's slurm.conf (RUNCRATE_SLURM_CONF) is installed as it is: nothing to read. The
# nodes are read side by side (one SSH connection each, all at once: an 8-node cluster's node
# waited for seven in turn), then taken in NODES' order.
[ -n "$PEER_CONF" ] || for node in $NODES; do
  { node_facts "$node" > "$facts_file.$node" 2>&1 || echo "runcrate-unread" >> "$facts_file.$node"; } &
done
wait
[ -n "$PEER_CONF" ] || for node in $NODES; do
  facts=$(cat "$facts_file.$node"); rm -f "$facts_file.$node"
  case "$facts" in *runcrate-unread*) fail "could not read the CPUs and memory of $node over SSH" ;; esac
  # shellcheck disable=SC2086 # split on purpose: "CPUS MEMORY ADDRESS" into $1 $2 $3
  set -- $facts
  case "${1:-}${2:-}" in ''|*[!0-9]*) fail "unreadable CPUs and memory from $node: $facts" ;; esac
  case "${3:-}" in
    [0-9]*.*[0-9]) ;;
    *) fail "$node has no address on the private network (rc0): $facts" ;;
  esac
  # RealMemory a bit under MemTotal (MiB): the kernel's own share varies between boots.
  echo "$node $1 $(( $2 / 1024 * 95 / 100 )) $3" >> "$facts_file"
  count=$((count+1))
done
[ -n "$PEER_CONF" ] || [ "$count" -gt 0 ] || fail "NODES is empty"

# A line per node, each at its private address (NodeAddr), where its slurmd listens.
node_lines=$(awk -v g="$gres" '{printf "NodeName=%s NodeAddr=%s CPUs=%s RealMemory=%s%s State=UNKNOWN\n", $1, $4, $2, $3, g}' "$facts_file")
cluster=$(echo "$CLUSTER_NAME" | tr 'A-Z' 'a-z' | tr -c 'a-z0-9_\n-' '-' | cut -c1-40)
[ -n "$cluster" ] || cluster=runcrate

# --- slurm.conf and gres.conf ----------------------------------------------------------------
mkdir -p /etc/slurm
conf_tmp=/etc/slurm/slurm.conf.runcrate.$$
cat > "$conf_tmp" <<EOF
$HEADER
ClusterName=$cluster
SlurmctldHost=$HEAD_NAME($HEAD_IP)
SlurmUser=slurm
AuthType=auth/munge
SlurmctldPort=6817
SlurmdPort=6818
# Every daemon, and srun, on the private network only: at the address this node's name resolves
# to (/etc/hosts: its rc0 address); the controller at SlurmctldHost's.
CommunicationParameters=NoInAddrAny,NoCtldInAddrAny
StateSaveLocation=/var/lib/slurm/slurmctld
SlurmdSpoolDir=/var/lib/slurm/slurmd
SlurmctldPidFile=/run/slurmctld.pid
SlurmdPidFile=/run/slurmd.pid
SlurmctldLogFile=$LOGS/slurmctld.log
SlurmdLogFile=$LOGS/slurmd.log
# No cgroups: hosts without systemd or cgroup delegation (containers, the lab) run jobs too.
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
JobAcctGatherType=jobacct_gather/none
AccountingStorageType=accounting_storage/none
JobCompType=jobcomp/none
SelectType=select/cons_tres
SelectTypeParameters=CR_Core
SchedulerType=sched/backfill
MpiDefault=none
SwitchType=switch/none
ReturnToService=2
SlurmctldTimeout=60
SlurmdTimeout=60
InactiveLimit=0
KillWait=10
MinJobAge=300
MailProg=/bin/true
GresTypes=gpu
$node_lines
PartitionName=gpu Nodes=ALL Default=YES MaxTime=INFINITE State=UP
EOF
if [ -n "$PEER_CONF" ]; then
  # The cluster's slurm.conf from the worker that was added: this cluster's, or refused.
  [ "$(head -n 1 "$PEER_CONF" 2>/dev/null)" = "$HEADER" ] \
    || { rm -f "$conf_tmp"; fail "$PEER_CONF is not a slurm.conf of cluster $CLUSTER_NAME"; }
  mv -f "$PEER_CONF" "$conf_tmp"
fi
conf_changed=0
if install_file "$conf_tmp" /etc/slurm/slurm.conf 644 root:root slurm-conf; then conf_changed=1; fi
gres_tmp=/etc/slurm/gres.conf.runcrate.$$
{
  echo "$HEADER"
  if [ "$GPUS" -gt 0 ]; then
    last=$((GPUS-1)); if [ "$GPUS" = 1 ]; then range=0; else range="[0-$last]"; fi
    if [ -e /dev/nvidia0 ] && [ -e "/dev/nvidia$last" ]; then
      echo "Name=gpu File=/dev/nvidia$range Count=$GPUS"
    else
      # No /dev/nvidia* (a stand-in nvidia-smi, as in the lab): Slurm 22.05 drops a GPU without
      # a device file from what slurmd reports and drains the node, so each GPU the agent
      # counted gets a placeholder, a link to /dev/null.
      mkdir -p "$STAND_IN"
      i=0; while [ $i -lt "$GPUS" ]; do ln -sfn /dev/null "$STAND_IN/gpu$i"; i=$((i+1)); done
      echo "Name=gpu File=$STAND_IN/gpu$range Count=$GPUS"
    fi
  fi
} > "$gres_tmp"
if install_file "$gres_tmp" /etc/slurm/gres.conf 644 root:root gres-conf; then conf_changed=1; fi

# Slurm 22.05's slurmd loads a cgroup plugin even when no plugin above uses cgroups, and its
# autodetection fails where no cgroup filesystem is mounted (the lab's hosts, containers).
# Without systemd the v1 plugin is named: it touches cgroups only when a cgroup plugin is used.
cgroup_tmp=/etc/slurm/cgroup.conf.runcrate.$$
{
  echo "$HEADER"
  if [ "$SYSTEMD" = 1 ]; then echo "CgroupPlugin=autodetect"; else echo "CgroupPlugin=cgroup/v1"; fi
} > "$cgroup_tmp"
if install_file "$cgroup_tmp" /etc/slurm/cgroup.conf 644 root:root cgroup-conf; then conf_changed=1; fi

mkdir -p /var/lib/slurm/slurmctld /var/lib/slurm/slurmd "$LOGS"
chown slurm:slurm /var/lib/slurm/slurmctld "$LOGS"

unlock
# --- the other nodes: each whose slurm.conf differs gets this one (a worker was added) -----------
# Only a node that has this cluster's slurm.conf already: one still installing writes its own.
peer() { ssh -o BatchMode=yes -o ConnectTimeout=10 "$@"; }
REMOTE_DIR=/var/lib/runcrate/software
peers_changed=0
for node in $NODES; do
  if [ -n "$PEER_CONF" ] || [ "$node" = "$NODE_NAME" ]; then continue; fi
  theirs="$SOFTWARE_DIR/slurm.conf.$node"
  if ! peer "$node" cat /etc/slurm/slurm.conf > "$theirs" 2>/dev/null \
    || [ "$(head -n 1 "$theirs")" != "$HEADER" ] || cmp -s "$theirs" /etc/slurm/slurm.conf; then
    rm -f "$theirs"; continue
  fi
  rm -f "$theirs"
  peer "$node" "cat > $REMOTE_DIR/install-slurm.sh.new && chmod 700 $REMOTE_DIR/install-slurm.sh.new \
    && mv -f $REMOTE_DIR/install-slurm.sh.new $REMOTE_DIR/install-slurm.sh" < "$0" \
    || fail "could not copy the Slurm installer to $node"
  peer "$node" "umask 077; cat > $REMOTE_DIR/slurm.conf.peer" < /etc/slurm/slurm.conf \
    || fail "could not copy the new slurm.conf to $node"
  out=$(peer "$node" "RUNCRATE_SLURM_CONF=$REMOTE_DIR/slurm.conf.peer sh $REMOTE_DIR/install-slurm.sh" 2>&1) \
    || true
  if [ "$(echo "$out" | tail -n 1)" != "runcrate: ok" ]; then
    echo "$out" | tail -n 20; fail "$node could not take the new slurm.conf"
  fi
  say "changed slurm-conf-on-$node"
  peers_changed=1
done

lock
# --- the daemons: slurmctld on the head, slurmd everywhere --------------------------------------
daemon() {  # daemon NAME PIDFILE: (re)started where its configuration changed or it is down
  if [ "$SYSTEMD" = 1 ]; then
    if [ "$conf_changed" = 1 ] || [ "$munge_changed" = 1 ] || ! systemctl is-active --quiet "$1"; then
      systemctl enable "$1" >/dev/null 2>&1 || true
      systemctl restart "$1" || { tail -n 20 "$LOGS/$1.log" 2>/dev/null; fail "$1 did not start"; }
      say "changed $1-running"
    fi
    return
  fi
  if [ "$conf_changed" = 1 ] || [ "$munge_changed" = 1 ]; then stop_pid "$2"; fi
  if ! running "$2"; then
    "/usr/sbin/$1" </dev/null >/dev/null 2>&1 8>&- \
      || { tail -n 20 "$LOGS/$1.log" 2>/dev/null; fail "$1 did not start"; }
    started "$2" "$1" "$LOGS/$1.log"
    say "changed $1-running"
  fi
}
if [ "$ROLE" = head ]; then daemon slurmctld /run/slurmctld.pid; fi
daemon slurmd /run/slurmd.pid
if [ "$peers_changed" = 1 ]; then
  # The head's slurmctld restarted with the new node: every daemon reads the file again.
  i=0
  reconfigure="peer $HEAD_NAME scontrol reconfigure"
  [ "$ROLE" != head ] || reconfigure="scontrol reconfigure"
  until out=$($reconfigure 2>&1); do
    i=$((i+1))
    [ $i -lt 30 ] || { echo "$out"; fail "scontrol reconfigure on $HEAD_NAME failed"; }
    sleep 1
  done
  say "changed slurm-reconfigured"
fi
say "slurm=$(sinfo --version 2>/dev/null || echo unknown)"
say "ok"
