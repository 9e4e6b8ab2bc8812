# Runcrate's cluster processes, prepended to wipe.sh and verify.sh by clusters/machines/ssh.py
# (one rule for both): what a cluster started, found by what it runs and by its credentials,
# never by a pidfile, so nothing it started is missed by a name we did not think of:
# - sshfs mounting /shared;
# - any process whose command line names a cluster key (`…/.ssh/runcrate_cluster`: sshfs's
#   `ssh … -oIdentityFile=…` child, mpirun's ssh, a user's `ssh -i`);
# - any process holding such a key file open (deleted or not);
# - any process with a TCP socket to or from the private network 10.77.0.0/24, in any state
#   (an ssh whose peer is gone still holds its connection).
# Never this shell's own session (it and every process above it) nor PID 1.
RUNCRATE_KEY=".ssh/runcrate_cluster"

runcrate_ancestors() {  # this shell and every process above it
  pid=$$
  while [ -n "$pid" ] && [ "$pid" -gt 1 ]; do
    echo "$pid"
    pid=$(awk '/^PPid:/ {print $2}' "/proc/$pid/status" 2>/dev/null)
  done
}

runcrate_private_pids() {  # processes with a TCP socket on 10.77.0.0/24
  command -v ss >/dev/null 2>&1 || return 0
  ss -Htanp 2>/dev/null \
    | awk '$4 ~ /^10[.]77[.]0[.][0-9]+:/ || $5 ~ /^10[.]77[.]0[.][0-9]+:/' \
    | grep -o 'pid=[0-9]*' | cut -d= -f2 | sort -u
}

cluster_processes() {  # one line per process: "PID WHY: COMMAND LINE"
  mine=" $(runcrate_ancestors | tr '\n' ' ') "
  private=" $(runcrate_private_pids | tr '\n' ' ') "
  for dir in /proc/[0-9]*; do
    pid=${dir#/proc/}
    [ "$pid" -gt 1 ] || continue
    case "$mine" in *" $pid "*) continue ;; esac
    cmd=$( { tr '\0' ' ' < "$dir/cmdline"; } 2>/dev/null | cut -c1-300)
    [ -n "$cmd" ] || continue  # a kernel thread, or gone meanwhile
    why=""
    case "$cmd" in
      *"/$RUNCRATE_KEY"*) why="uses the cluster's key" ;;
      sshfs\ *:/shared\ * | */sshfs\ *:/shared\ *) why="mounts /shared" ;;
    esac
    if [ -z "$why" ] \
      && [ -n "$(find "$dir/fd" -maxdepth 1 -lname "*/$RUNCRATE_KEY*" 2>/dev/null | head -n 1)" ]; then
      why="holds the cluster's key open"
    fi
    if [ -z "$why" ]; then
      case "$private" in *" $pid "*) why="is connected over the private network" ;; esac
    fi
    [ -z "$why" ] || echo "$pid $why: $cmd"
  done
}

runcrate_alive() {  # whether any of the pids still runs (a zombie does not)
  for pid in "$@"; do
    grep -qs '^State:[[:space:]]*[^Z]' "/proc/$pid/status" && return 0
  done
  return 1
}

end_cluster_processes() {  # TERM, a bounded wait, then KILL: an ssh whose peer is unreachable
  # may sit out its ServerAlive timeout after TERM. Their children go with them (an sshd
  # session's sftp-server). Prints what it ended.
  found=$(cluster_processes)
  [ -n "$found" ] || return 0
  pids=$(echo "$found" | cut -d' ' -f1)
  for pid in $pids; do pids="$pids $(pgrep -P "$pid" 2>/dev/null | tr '\n' ' ')"; done
  # shellcheck disable=SC2086  # a list of pids
  kill $pids 2>/dev/null || true
  i=0
  # shellcheck disable=SC2086
  while [ $i -lt 20 ] && runcrate_alive $pids; do sleep 0.1; i=$((i+1)); done
  # shellcheck disable=SC2086
  kill -9 $pids 2>/dev/null || true
  i=0
  # shellcheck disable=SC2086
  while [ $i -lt 50 ] && runcrate_alive $pids; do sleep 0.1; i=$((i+1)); done
  echo "$found" | sed 's/^\([0-9]*\) \([^:]*\): /runcrate: ended process \1 (\2): /'
}
