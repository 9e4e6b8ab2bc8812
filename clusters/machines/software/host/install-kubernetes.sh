#!/bin/sh
# Runcrate: Kubernetes (k3s) on an ssh host (clusters/machines/ssh.py runs it as root after the
# bootstrap, on every node of a cluster with software `kubernetes`; docs/drivers.md,
# "Kubernetes on ssh hosts").
#
# It reads software.env (beside this script: SOFTWARE, CLUSTER_NAME, NODE_NAME, ROLE, HEAD_NAME,
# HEAD_IP, PRIVATE_IP, NODES, GPUS_PER_NODE, CLUSTER_SECRET_B64, K3S_URL and, on the head,
# KUBE_ADMIN_TOKEN, KUBE_API_ADDRESS, KUBE_CA_CERT_B64, KUBE_CA_KEY_B64) and, each step only
# where something differs: fetches the k3s binary (and the air-gap images where the mirror has
# them) from K3S_URL, checked against its sha256sum file; writes /etc/rancher/k3s/config.yaml;
# on the head gives k3s the cluster's CA before its first start, the admin's token, and the
# NVIDIA device plugin where the host has GPUs; runs `k3s server` on the head and `k3s agent`
# elsewhere, over the private network rc0, restarted only when their configuration changed.
# Like the bootstrap it prints "runcrate: changed WHAT" per change and ends with "runcrate: ok",
# or "runcrate: failed: WHY" (exit 4). Nothing outside this folder is touched before the k3s
# release is fetched and checked.
INSTALLER=Kubernetes
# shellcheck source-path=SCRIPTDIR source=installer.sh
. "$(dirname "$0")/installer.sh"
[ -n "${K3S_URL:-}" ] || fail "software.env gives no K3S_URL to fetch k3s from"
K3S_URL=${K3S_URL%/}
case "$ROLE" in
  head)
    for name in KUBE_ADMIN_TOKEN KUBE_CA_CERT_B64 KUBE_CA_KEY_B64; do
      eval "value=\${$name:-}"
      [ -n "$value" ] || fail "software.env gives the head no $name"
    done ;;
  worker) ;;
  *) fail "unknown ROLE $ROLE" ;;
esac
command -v python3 >/dev/null 2>&1 || fail "python3 is missing (the bootstrap installs it)"
SYSTEMD=0
if [ -d /run/systemd/system ] && command -v systemctl >/dev/null 2>&1; then SYSTEMD=1; fi
HEADER="# Written by runcrate (install-kubernetes.sh) for cluster $CLUSTER_NAME."
BIN=/usr/local/bin/k3s
DATA=/var/lib/rancher/k3s
CONF=/etc/rancher/k3s
RELEASE="$DATA/runcrate-release"  # the K3S_URL the installed binary came from
LOGS=/var/log/runcrate
LOG="$LOGS/k3s.log"
PIDFILE=/run/runcrate-k3s.pid
if [ "$ROLE" = head ]; then MODE=server; UNIT=k3s; else MODE=agent; UNIT=k3s-agent; fi

case "$(uname -m)" in
  x86_64|amd64) ARCH=amd64; BINARY=k3s ;;
  aarch64|arm64) ARCH=arm64; BINARY=k3s-arm64 ;;
  *) fail "k3s has no release for $(uname -m)" ;;
esac

# --- the release: fetched into this folder, checked, then installed -----------------------------
fetch() {  # fetch URL DEST: exit 0 fetched; 2 the mirror has no such file; 1 otherwise (why on stdout)
  python3 - "$1" "$2" <<'PY'
import shutil, sys, urllib.error, urllib.request

url, dest = sys.argv[1], sys.argv[2]
try:
    with urllib.request.urlopen(url, timeout=30) as response, open(dest, "wb") as out:
        shutil.copyfileobj(response, out, 1 << 20)
except urllib.error.HTTPError as error:
    print(f"HTTP {error.code} {error.reason}")
    sys.exit(2 if error.code == 404 else 1)
except (urllib.error.URLError, OSError, ValueError) as error:
    print(getattr(error, "reason", None) or error)
    sys.exit(1)
PY
}
sha256_of() { sha256sum "$1" | cut -d' ' -f1; }
listed_sha256() {  # listed_sha256 FILE: its hash in the release's sha256sum file, or nothing
  [ -s "$SOFTWARE_DIR/sha256sum.txt" ] || return 0
  awk -v f="$1" '$2 == f || $2 == "*" f {print $1; exit}' "$SOFTWARE_DIR/sha256sum.txt"
}

if [ ! -x "$BIN" ] || [ "$(cat "$RELEASE" 2>/dev/null)" != "$K3S_URL" ]; then
  download="$SOFTWARE_DIR/download"
  rm -rf "$download"; mkdir -p "$download"
  why=$(fetch "$K3S_URL/$BINARY" "$download/k3s") && got=0 || got=$?
  [ "$got" = 0 ] || { rm -rf "$download"; fail "could not fetch k3s from $K3S_URL/$BINARY: $why"; }
  rm -f "$SOFTWARE_DIR/sha256sum.txt"
  why=$(fetch "$K3S_URL/sha256sum-$ARCH.txt" "$SOFTWARE_DIR/sha256sum.txt") && got=0 || got=$?
  case "$got" in
    0) ;;
    2) rm -f "$SOFTWARE_DIR/sha256sum.txt" ;;  # a mirror without the checksums: nothing to check
    *) rm -rf "$download"; fail "could not fetch k3s's checksums from $K3S_URL/sha256sum-$ARCH.txt: $why" ;;
  esac
  want=$(listed_sha256 "$BINARY")
  if [ -s "$SOFTWARE_DIR/sha256sum.txt" ]; then
    [ -n "$want" ] || fail "$K3S_URL/sha256sum-$ARCH.txt lists no $BINARY"
    [ "$(sha256_of "$download/k3s")" = "$want" ] \
      || { rm -rf "$download"; fail "$K3S_URL/$BINARY does not match its sha256 in sha256sum-$ARCH.txt"; }
    say "k3s-sha256=$want"
  else
    say "k3s-sha256=unchecked (the mirror has no sha256sum-$ARCH.txt)"
  fi
  # The air-gap images where the mirror has them; without them k3s pulls from the registries.
  images=""
  for name in "k3s-airgap-images-$ARCH.tar.zst" "k3s-airgap-images-$ARCH.tar.gz"; do
    why=$(fetch "$K3S_URL/$name" "$download/$name") && got=0 || got=$?
    if [ "$got" = 0 ]; then images=$name; break; fi
    rm -f "$download/$name"
    [ "$got" = 2 ] || { rm -rf "$download"; fail "could not fetch $K3S_URL/$name: $why"; }
  done
  if [ -n "$images" ]; then
    want=$(listed_sha256 "$images")
    if [ -n "$want" ] && [ "$(sha256_of "$download/$images")" != "$want" ]; then
      rm -rf "$download"; fail "$K3S_URL/$images does not match its sha256 in sha256sum-$ARCH.txt"
    fi
  fi
  chmod 755 "$download/k3s"
  "$download/k3s" --version >/dev/null 2>&1 \
    || { rm -rf "$download"; fail "$K3S_URL/$BINARY is not a k3s this host can run"; }
  mkdir -p "$(dirname "$BIN")" "$DATA"
  mv -f "$download/k3s" "$BIN"
  say "changed k3s-binary"
  if [ -n "$images" ]; then
    mkdir -p "$DATA/agent/images"
    rm -f "$DATA/agent/images"/k3s-airgap-images-*
    mv -f "$download/$images" "$DATA/agent/images/$images"
    say "changed k3s-images"
  fi
  echo "$K3S_URL" > "$RELEASE"
  rm -rf "$download"
fi
for tool in kubectl crictl ctr; do
  # k3s answers to these names; a tool of the operator's own stays.
  if [ ! -e "/usr/local/bin/$tool" ] && [ ! -L "/usr/local/bin/$tool" ]; then
    ln -s k3s "/usr/local/bin/$tool"
    say "changed $tool-link"
  fi
done

# --- the private network: k3s runs over rc0 only -------------------------------------------------
if [ -z "${PRIVATE_IP:-}" ]; then
  PRIVATE_IP=$(ip -4 -o addr show dev rc0 2>/dev/null | awk '{split($4, a, "/"); print a[1]; exit}')
fi
[ -n "$PRIVATE_IP" ] || fail "the private network rc0 has no address (the bootstrap sets it up)"
ip -4 -o addr show dev rc0 2>/dev/null | grep -q " $PRIVATE_IP/" \
  || fail "the private network rc0 does not carry $PRIVATE_IP"

install_file() {  # install_file SRC DEST MODE WHAT: prints and returns 0 when it changed
  if cmp -s "$1" "$2" 2>/dev/null; then rm -f "$1"; return 1; fi
  mkdir -p "$(dirname "$2")"
  chmod "$3" "$1"; mv "$1" "$2"
  say "changed $4"
  return 0
}

# The join token: the same on every node, derived from the cluster's secret.
TOKEN=$(printf 'runcrate-k3s-token:%s' "$CLUSTER_SECRET_B64" | sha256sum | cut -d' ' -f1)
# Where the NVIDIA container runtime is installed, k3s finds it; making it the default lets the
# device plugin and users' pods see the GPUs without a runtimeClassName.
runtime=""
if command -v nvidia-container-runtime >/dev/null 2>&1; then runtime="default-runtime: nvidia"; fi
mkdir -p "$CONF"
chmod 700 "$CONF"
config_tmp="$CONF/config.yaml.runcrate.$$"
(
  umask 077
  {
    echo "$HEADER"
    echo "node-name: \"$NODE_NAME\""
    echo "node-ip: \"$PRIVATE_IP\""
    echo "flannel-iface: rc0"
    # The kubelet listens on the private address only (the firewall drops the rest anyway).
    echo "kubelet-arg:"
    echo "  - \"address=$PRIVATE_IP\""
    echo "token: \"$TOKEN\""
    [ -z "$runtime" ] || echo "$runtime"
    if [ "$MODE" = server ]; then
      echo "advertise-address: \"$PRIVATE_IP\""
      # The API on the private address only: users reach it through an SSH tunnel to node-0
      # (clusters.connect.kube_tunnel), whose local end, 127.0.0.1, is always in k3s's
      # certificate.
      echo "bind-address: \"$PRIVATE_IP\""
      echo "write-kubeconfig-mode: \"0600\""
      # The names nodes reach the API by.
      echo "tls-san:"
      echo "  - \"$HEAD_NAME\""
      echo "  - \"$HEAD_IP\""
      [ -z "${KUBE_API_ADDRESS:-}" ] || echo "  - \"$KUBE_API_ADDRESS\""
      echo "kube-apiserver-arg:"
      echo "  - \"token-auth-file=$CONF/runcrate-tokens.csv\""
    else
      echo "server: \"https://$HEAD_IP:6443\""
    fi
  } > "$config_tmp"
)
conf_changed=0
if install_file "$config_tmp" "$CONF/config.yaml" 600 k3s-config; then conf_changed=1; fi

if [ "$MODE" = server ]; then
  # The admin's bearer token (clusters.connect.kube_token), in group system:masters.
  tokens_tmp="$CONF/runcrate-tokens.csv.runcrate.$$"
  (umask 077; echo "$KUBE_ADMIN_TOKEN,runcrate-admin,runcrate-admin,system:masters" > "$tokens_tmp")
  if install_file "$tokens_tmp" "$CONF/runcrate-tokens.csv" 600 k3s-admin-token; then conf_changed=1; fi

  # The cluster's CA (clusters.connect.kube_ca): k3s signs its serving certificate with it, and
  # the users' kubeconfig trusts it. It must be there before k3s first starts; one of another
  # cluster is never replaced (its data would no longer match).
  tls="$DATA/server/tls"
  mkdir -p "$tls"
  chmod 700 "$tls"
  for part in crt:KUBE_CA_CERT_B64 key:KUBE_CA_KEY_B64; do
    ext=${part%%:*}
    eval "value=\$${part#*:}"
    ca_tmp="$tls/server-ca.$ext.runcrate.$$"
    (umask 077; printf '%s' "$value" | base64 -d > "$ca_tmp") \
      || { rm -f "$ca_tmp"; fail "${part#*:} is not base64"; }
    if [ -e "$tls/server-ca.$ext" ] && ! cmp -s "$ca_tmp" "$tls/server-ca.$ext"; then
      rm -f "$ca_tmp"
      fail "$tls/server-ca.$ext is another cluster's CA (wipe the host first)"
    fi
    install_file "$ca_tmp" "$tls/server-ca.$ext" 600 "k3s-server-ca-$ext" || true
  done

  # The NVIDIA device plugin, deployed by k3s itself, where the head has GPUs.
  manifest="$DATA/server/manifests/runcrate-nvidia-device-plugin.yaml"
  if [ -e /dev/nvidia0 ]; then
    manifest_tmp="$manifest.runcrate.$$"
    mkdir -p "$(dirname "$manifest")"
    cat > "$manifest_tmp" <<EOF
$HEADER
apiVersion: apps/v1
kind: DaemonSet
metadata:
  name: nvidia-device-plugin-daemonset
  namespace: kube-system
spec:
  selector:
    matchLabels:
      name: nvidia-device-plugin-ds
  updateStrategy:
    type: RollingUpdate
  template:
    metadata:
      labels:
        name: nvidia-device-plugin-ds
    spec:
      tolerations:
        - key: nvidia.com/gpu
          operator: Exists
          effect: NoSchedule
      priorityClassName: system-node-critical
      containers:
        - name: nvidia-device-plugin-ctr
          image: nvcr.io/nvidia/k8s-device-plugin:v0.17.0
          env:
            - name: FAIL_ON_INIT_ERROR
              value: "false"
          securityContext:
            allowPrivilegeEscalation: false
            capabilities:
              drop: ["ALL"]
          volumeMounts:
            - name: device-plugin
              mountPath: /var/lib/kubelet/device-plugins
      volumes:
        - name: device-plugin
          hostPath:
            path: /var/lib/kubelet/device-plugins
EOF
    install_file "$manifest_tmp" "$manifest" 644 nvidia-device-plugin || true
  elif [ -e "$manifest" ]; then
    rm -f "$manifest"
    say "changed nvidia-device-plugin"
  fi
fi

# --- k3s running: a systemd unit, or a daemon with a pidfile --------------------------------------
mkdir -p "$LOGS"
running() { [ -s "$PIDFILE" ] && kill -0 "$(cat "$PIDFILE")" 2>/dev/null; }
stop_k3s() {
  running || return 0
  pid=$(cat "$PIDFILE")
  kill "$pid" 2>/dev/null || true
  i=0; while kill -0 "$pid" 2>/dev/null && [ $i -lt 300 ]; do sleep 0.1; i=$((i+1)); done
  kill -9 "$pid" 2>/dev/null || true
  rm -f "$PIDFILE"
}
if [ "$SYSTEMD" = 1 ]; then
  unit="/etc/systemd/system/$UNIT.service"
  if [ -e "$unit" ] && ! grep -qx "$HEADER" "$unit" && ! grep -q '^# Written by runcrate' "$unit"; then
    fail "this host has a k3s service of its own ($unit)"
  fi
  if [ "$MODE" = server ]; then type="notify"; else type="exec"; fi
  unit_tmp="$unit.runcrate.$$"
  cat > "$unit_tmp" <<EOF
$HEADER
[Unit]
Description=k3s $MODE (runcrate)
Wants=network-online.target
After=network-online.target

[Service]
Type=$type
ExecStartPre=-/sbin/modprobe br_netfilter
ExecStartPre=-/sbin/modprobe overlay
ExecStart=$BIN $MODE
KillMode=process
Delegate=yes
LimitNOFILE=1048576
LimitNPROC=infinity
LimitCORE=infinity
TasksMax=infinity
TimeoutStartSec=0
Restart=always
RestartSec=5s

[Install]
WantedBy=multi-user.target
EOF
  if install_file "$unit_tmp" "$unit" 644 "$UNIT-unit"; then
    conf_changed=1
    systemctl daemon-reload
  fi
  if [ "$conf_changed" = 1 ] || ! systemctl is-active --quiet "$UNIT"; then
    systemctl enable "$UNIT" >/dev/null 2>&1 || true
    systemctl restart "$UNIT" \
      || { journalctl -u "$UNIT" -n 20 --no-pager 2>/dev/null; fail "k3s $MODE did not start"; }
    say "changed k3s-$MODE-running"
  fi
else
  if [ "$conf_changed" = 1 ]; then stop_k3s; fi
  if ! running; then
    # Its own session, its output in the log: it outlives this SSH session.
    setsid "$BIN" "$MODE" </dev/null >>"$LOG" 2>&1 &
    echo $! > "$PIDFILE"
    sleep 3
    running || { tail -n 20 "$LOG"; fail "k3s $MODE did not start (its log: $LOG)"; }
    say "changed k3s-$MODE-running"
  fi
fi

# The head answers for the cluster: wait until its API does, so the check reads nodes, not a
# refused connection. (No taint is asked for: k3s puts none on a server, so node-0 takes work.)
k3s_log() {
  if [ "$SYSTEMD" = 1 ]; then journalctl -u "$UNIT" -n 20 --no-pager 2>/dev/null || true
  else tail -n 20 "$LOG"; fi
}
if [ "$MODE" = server ]; then
  i=0
  until "$BIN" kubectl get nodes -o json >/dev/null 2>&1; do
    if [ "$SYSTEMD" = 0 ] && ! running; then k3s_log; fail "k3s server stopped (its log: $LOG)"; fi
    i=$((i+1))
    [ $i -lt 90 ] || { k3s_log; fail "the k3s API on $NODE_NAME did not answer within 180 s"; }
    sleep 2
  done
fi
say "k3s=$("$BIN" --version 2>/dev/null | head -n 1 || echo unknown)"
say "ok"
