# Runcrate: what every installer (install-<software>.sh) shares. Sourced first thing, with
# INSTALLER set to the software's name: strict mode; `say` and `fail` (the "runcrate: …" lines
# the driver reads, exit 4 on failure); the checks that it runs as root beside its software.env,
# which it reads; and `apt_install PACKAGE…`, from the location's APT_MIRROR only, through our
# own list, apt's last words shown when it fails.
set -eu
umask 022
SOFTWARE_DIR="${SOFTWARE_DIR:-$(dirname "$0")}"
say() { echo "runcrate: $*"; }
fail() { say "failed: $*"; exit 4; }

[ -f "$SOFTWARE_DIR/software.env" ] || fail "no software.env in $SOFTWARE_DIR"
# shellcheck disable=SC1091
. "$SOFTWARE_DIR/software.env"
[ "$(id -u)" = 0 ] || fail "the ${INSTALLER:-software} installer must run as root"

apt_install() {  # apt_install PACKAGE...: prints "runcrate: changed packages …"
  [ -n "${APT_MIRROR:-}" ] \
    || fail "this host lacks $* and its location has no apt_mirror to install from"
  codename=$(. /etc/os-release; echo "${VERSION_CODENAME:-}")
  list=/etc/apt/sources.list.d/runcrate.list
  line="deb $APT_MIRROR $codename main"
  if [ "$(cat "$list" 2>/dev/null)" != "$line" ]; then
    echo "$line" > "$list"
    say "changed apt-source"
  fi
  # dpkg without an fsync per file (--force-unsafe-io): a host that loses power half-way fails
  # its cluster's step and is reimaged before anyone else gets it, so the syncs protect nothing.
  apt_opts="-o Dir::Etc::sourcelist=$list -o Dir::Etc::sourceparts=- -o APT::Get::List-Cleanup=0 -o Dpkg::Options::=--force-unsafe-io"
  apt_log="$SOFTWARE_DIR/apt.log"
  # shellcheck disable=SC2086
  DEBIAN_FRONTEND=noninteractive apt-get $apt_opts -qq update >"$apt_log" 2>&1 \
    || { tail -n 20 "$apt_log"; fail "apt-get update from $APT_MIRROR failed"; }
  # shellcheck disable=SC2086
  DEBIAN_FRONTEND=noninteractive apt-get $apt_opts -qq install -y --no-install-recommends "$@" \
    >"$apt_log" 2>&1 || { tail -n 20 "$apt_log"; fail "could not install $* from $APT_MIRROR"; }
  say "changed packages $*"
}
