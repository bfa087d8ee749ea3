#!/usr/bin/env bash
# provision_python.sh MINOR: print the path of a CPython MINOR interpreter (3.10, 3.14, ...)
# that can create virtual environments (venv + ensurepip), providing one if need be.
#
#   bash scripts/provision_python.sh 3.14     # -> e.g. /work/main/.pyroots/bin/python3.14
#   "$(bash scripts/provision_python.sh 3.14)" -m venv .venv-2.15-py3.14
#
# The interpreter is looked for, first hit wins:
#   1. $TORCH_AOT_RT_PYTHON_3_14 (for 3.14): an interpreter named by the caller; an
#      error if it is not a working CPython 3.14 (an explicit choice is not overridden);
#   2. python3.14 on PATH (a pyenv shim that has no such version is skipped);
#   3. pyenv: $(pyenv root)/versions/3.14*/bin/python3.14, newest patch release first;
#   4. otherwise it is provisioned: a Debian testing root made with debootstrap in
#      $TORCH_AOT_RT_PYROOTS (default: <checkout>/.pyroots, to be git-ignored), made once
#      and reused, with Debian's python3.X, python3.X-venv, python3.X-dev, gcc and g++
#      (Debian testing has 3.14 and 3.15; older minors come from pyenv on our machines).
#      The printed path is a wrapper, <pyroots>/bin/python3.X, see below.
# What is printed is the interpreter's own sys.executable (for a pyenv shim: the real
# binary), so that it keeps working whatever PATH and pyenv settings come later.
#
# The wrapper runs the root's /usr/bin/python3.X from the host shell: it enters a
# private mount namespace (unshare), binds the host's non-system top-level folders
# (/work, /tmp, /home, /opt, ...), the checkout and the cwd into the root at the same
# paths, plus /proc, /sys, /dev, resolv.conf and the host's CA bundle (pip must trust
# what the host trusts, a proxy's CA included), then chroots there and execs python in
# the same cwd, with argv[0] set to the wrapper's own path. So sys.executable is the
# wrapper, a venv made with it links bin/python to the wrapper, and `$VENV/bin/python`
# works both from the host (it enters the root) and inside the root (a marker file,
# /.torch-aot-rt-pyroot, tells it to exec python directly): subprocesses, pip builds,
# console scripts and `python -m pytest` all run inside the root, with its gcc 16 and
# Python headers. The mounts vanish with the process; nothing is left mounted.
#
# Requirements for step 4 and for running the wrapper: root (debootstrap, unshare,
# mount, chroot), Debian's package mirror (TORCH_AOT_RT_DEBIAN_MIRROR, default
# http://deb.debian.org/debian; suite TORCH_AOT_RT_DEBIAN_SUITE, default testing).
# From nothing (debootstrap not even installed), 3.14 and 3.15 together took 46 s on
# a 2-core machine and 700 MB of disk (620 MB for one minor); a later run takes about
# 0.3 s. Safe to run from several processes at once (flock on <pyroots>/provision.lock)
# and idempotent: a later run reuses the root, installs only missing packages and
# replaces a wrapper only when its text changed. Debian packages no free-threaded
# CPython (no python3.14t/nogil in testing, sid or experimental): not provided here.
#
# Exit status: 0 with the path on stdout; non-zero with the reason on stderr.

set -euo pipefail

# chroot, debootstrap and friends live in sbin, which a non-login PATH may lack.
PATH="$PATH:/usr/sbin:/sbin"

CHECKOUT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
PYROOTS="${TORCH_AOT_RT_PYROOTS:-$CHECKOUT/.pyroots}"
SUITE="${TORCH_AOT_RT_DEBIAN_SUITE:-testing}"
MIRROR="${TORCH_AOT_RT_DEBIAN_MIRROR:-http://deb.debian.org/debian}"
ROOTFS="$PYROOTS/debian-$SUITE"
# Inside the root, this file tells a wrapper it is already there.
MARKER=".torch-aot-rt-pyroot"
# Packages every minor needs besides its own python3.X{,-venv,-dev}: a C and C++
# compiler for the extension (C++ against torch's headers), CA certificates for pip.
COMMON_PACKAGES=(gcc g++ make ca-certificates)

log() { printf '[provision_python] %s\n' "$*" >&2; }
die() {
    log "error: $*"
    exit 1
}

# check_python CANDIDATE MINOR: print CANDIDATE's sys.executable if it runs, is CPython
# MINOR and has venv and ensurepip (Debian splits those out into python3.X-venv).
check_python() {
    local candidate="$1" minor="$2"
    [ -n "$candidate" ] && [ -x "$candidate" ] || return 1
    # A timeout: a wrapper whose root is broken, or a shim, must not hang the caller.
    timeout 120 "$candidate" - "$minor" 2>/dev/null <<'EOF'
import sys, platform
want = tuple(int(p) for p in sys.argv[1].split("."))
assert platform.python_implementation() == "CPython", "not CPython"
assert sys.version_info[:2] == want, "wrong version"
import venv, ensurepip  # noqa: F401  (both must be importable)
print(sys.executable)
EOF
}

# from_env MINOR: step 1, TORCH_AOT_RT_PYTHON_3_14 for 3.14.
from_env() {
    local minor="$1" var value
    var="TORCH_AOT_RT_PYTHON_${minor//./_}"
    value="${!var:-}"
    [ -n "$value" ] || return 1
    # A bare name is looked up on PATH.
    case "$value" in */*) ;; *) value="$(command -v "$value" 2>/dev/null)" || value="${!var}" ;; esac
    if ! check_python "$value" "$minor"; then
        die "$var=$value is not a working CPython $minor with venv and ensurepip"
    fi
}

# from_path MINOR: step 2, python3.X on PATH (a pyenv shim without that version fails
# the check and is skipped).
from_path() {
    local minor="$1" found
    found="$(command -v "python$minor" 2>/dev/null)" || return 1
    check_python "$found" "$minor"
}

# from_pyenv MINOR: step 3, the newest pyenv-installed MINOR.* (not a free-threaded
# "3.14.0t" build, not a -dev one: those are other interpreters).
from_pyenv() {
    local minor="$1" root dir
    if command -v pyenv >/dev/null 2>&1; then
        root="$(pyenv root 2>/dev/null)" || root=""
    fi
    root="${root:-${PYENV_ROOT:-$HOME/.pyenv}}"
    [ -d "$root/versions" ] || return 1
    while IFS= read -r dir; do
        case "$(basename "$dir")" in
            *t | *-dev | *-debug) continue ;;
        esac
        if check_python "$dir/bin/python$minor" "$minor"; then
            return 0
        fi
    done < <(compgen -G "$root/versions/$minor*" | sort -rV)
    return 1
}

# in_root CMD...: run CMD inside the root as root, with /proc, /sys, /dev and
# resolv.conf mounted in a private mount namespace (gone when CMD exits).
# shellcheck disable=SC2016  # the inner script expands its own "$@", in the new namespace
in_root() {
    unshare --mount --propagation private -- /bin/bash -c '
        set -e
        r="$1"; shift
        mount --rbind /proc "$r/proc"
        mount --rbind /sys "$r/sys"
        mount --rbind /dev "$r/dev"
        if [ -e /etc/resolv.conf ]; then
            touch "$r/etc/resolv.conf"
            mount --bind "$(readlink -f /etc/resolv.conf)" "$r/etc/resolv.conf"
        fi
        exec chroot "$r" /usr/bin/env -i PATH=/usr/sbin:/usr/bin:/sbin:/bin \
            HOME=/root LANG=C.UTF-8 DEBIAN_FRONTEND=noninteractive "$@"
    ' in_root "$ROOTFS" "$@"
}

# require_privileges: what provisioning and the wrapper need, checked up front so
# the failure says why instead of failing inside debootstrap or mount.
require_privileges() {
    [ "$(id -u)" -eq 0 ] ||
        die "provisioning CPython $1 needs root (debootstrap, mount, chroot); run as root, or install python$1 (pyenv) and set TORCH_AOT_RT_PYTHON_${1//./_}"
    local tool
    for tool in unshare chroot flock mount; do
        command -v "$tool" >/dev/null 2>&1 || die "'$tool' not found (util-linux/coreutils)"
    done
    unshare --mount --propagation private -- true 2>/dev/null ||
        die "unshare --mount is not permitted here (a container without CAP_SYS_ADMIN?)"
}

# ensure_debootstrap: the host's debootstrap, installed from the host's apt if missing.
ensure_debootstrap() {
    command -v debootstrap >/dev/null 2>&1 && return 0
    command -v apt-get >/dev/null 2>&1 || die "debootstrap is missing and there is no apt-get to install it"
    log "installing debootstrap on the host (apt-get)"
    if ! DEBIAN_FRONTEND=noninteractive apt-get install -y -qq debootstrap >/dev/null 2>&1; then
        DEBIAN_FRONTEND=noninteractive apt-get update -qq >/dev/null 2>&1 ||
            die "apt-get update failed (no network or no Debian mirror?)"
        DEBIAN_FRONTEND=noninteractive apt-get install -y -qq debootstrap >/dev/null ||
            die "apt-get install debootstrap failed"
    fi
}

# ensure_rootfs: create the Debian root once. debootstrap writes into a temporary
# folder that is renamed at the end, so an interrupted run leaves no half-made root.
ensure_rootfs() {
    [ -e "$ROOTFS/$MARKER" ] && return 0
    ensure_debootstrap
    local tmp="$PYROOTS/.debian-$SUITE.partial"
    if [ -e "$tmp" ]; then
        # Left by an interrupted run (we hold the lock, so nobody is using it). Only
        # removed when nothing is mounted under it: rm through a bind mount of the
        # host would delete host files.
        if findmnt -rn -o TARGET | grep -q "^$tmp/"; then
            die "$tmp has mounts under it; unmount them and remove it by hand"
        fi
        rm -rf --one-file-system "$tmp"
    fi
    log "creating a Debian $SUITE root in $ROOTFS (debootstrap, about 30 s)"
    if ! debootstrap --variant=minbase "$SUITE" "$tmp" "$MIRROR" >"$PYROOTS/debootstrap.log" 2>&1; then
        tail -n 20 "$PYROOTS/debootstrap.log" >&2
        die "debootstrap $SUITE from $MIRROR failed (log: $PYROOTS/debootstrap.log; no network?)"
    fi
    # The mirror may serve a frozen snapshot whose Release file is past Valid-Until;
    # signatures are still checked. No recommends: a small root.
    cat >"$tmp/etc/apt/apt.conf.d/99torch-aot-rt" <<'EOF'
Acquire::Check-Valid-Until "false";
APT::Install-Recommends "false";
APT::Install-Suggests "false";
EOF
    touch "$tmp/$MARKER"
    mv "$tmp" "$ROOTFS"
}

# ensure_packages MINOR: Debian's python3.X, -venv, -dev and the compilers in the root.
ensure_packages() {
    local minor="$1" pkg missing=()
    for pkg in "python$minor" "python$minor-venv" "python$minor-dev" "${COMMON_PACKAGES[@]}"; do
        # shellcheck disable=SC2016  # ${Status} is dpkg-query's format, not a shell variable
        if ! in_root dpkg-query -W -f='${Status}\n' "$pkg" 2>/dev/null | grep -q '^install ok installed$'; then
            missing+=("$pkg")
        fi
    done
    [ "${#missing[@]}" -eq 0 ] && return 0
    log "installing into the root: ${missing[*]}"
    in_root apt-get update -qq >"$PYROOTS/apt.log" 2>&1 || {
        tail -n 20 "$PYROOTS/apt.log" >&2
        die "apt-get update in the root failed (no network?)"
    }
    if ! in_root apt-cache show "python$minor-venv" >/dev/null 2>&1; then
        die "Debian $SUITE has no python$minor-venv: CPython $minor cannot be provisioned this way (install it with pyenv, or set TORCH_AOT_RT_PYTHON_${minor//./_})"
    fi
    in_root apt-get install -y -qq "${missing[@]}" >>"$PYROOTS/apt.log" 2>&1 || {
        tail -n 20 "$PYROOTS/apt.log" >&2
        die "apt-get install ${missing[*]} in the root failed (log: $PYROOTS/apt.log)"
    }
    # The downloaded .debs are not needed again (about 170 MB).
    in_root apt-get clean >/dev/null 2>&1 || true
}

# write_wrapper MINOR: <pyroots>/bin/python3.X, see the header. Rewritten on each run
# (atomically) so that a moved checkout or a new version of this script takes effect.
write_wrapper() {
    local minor="$1" wrapper="$PYROOTS/bin/python$1" tmp
    mkdir -p "$PYROOTS/bin"
    tmp="$(mktemp "$wrapper.XXXXXX")"
    cat >"$tmp" <<EOF
#!/bin/bash
# CPython $minor from the Debian $SUITE root $ROOTFS.
# Written by scripts/provision_python.sh; see its header. Runs as root only.
REAL=/usr/bin/python$minor
ROOTFS=$(printf '%q' "$ROOTFS")
# Always bound into the root at the same path: the checkout that provisioned it and
# the folder of this wrapper (venvs link to it).
ALWAYS_BIND=($(printf '%q' "$CHECKOUT") $(printf '%q' "$PYROOTS/bin"))
EOF
    cat >>"$tmp" <<'EOF'

# Inside the root (a venv's python run by a process already there): exec directly.
# argv[0] stays the path we were run as, so a venv's bin/python keeps its venv.
if [ -e /.torch-aot-rt-pyroot ]; then
    exec -a "$0" "$REAL" "$@"
fi

if [ "$(id -u)" -ne 0 ]; then
    echo "$0: needs root: it runs $REAL of the Debian root $ROOTFS with unshare and chroot" >&2
    exit 126
fi

# Host paths that must not be bound over the root's own: its system folders (a
# folder of its own below /root or /var, say /var/cache/x, may be bound).
_system_path() {
    case "$1" in
        / | /root | /var | /var/lib | /var/cache | /var/log | /var/tmp) return 0 ;;
        /usr | /usr/* | /etc | /etc/* | /bin | /bin/* | /sbin | /sbin/* | /lib | /lib/* | /lib32 | /lib32/* | /lib64 | /lib64/* | /libx32 | /libx32/* | /proc | /proc/* | /sys | /sys/* | /dev | /dev/* | /boot | /boot/* | /run | /run/*) return 0 ;;
        /var/lib/dpkg | /var/lib/dpkg/* | /var/lib/apt | /var/lib/apt/* | /var/cache/apt | /var/cache/apt/*) return 0 ;;
    esac
    return 1
}

# _path_add DIR...: append each DIR to PATH unless it is there already.
_path_add() {
    local d
    for d in "$@"; do
        case ":$PATH:" in *":$d:"*) ;; *) PATH="${PATH:+$PATH:}$d" ;; esac
    done
}
# chroot is in sbin, which a non-login PATH may lack.
_path_add /usr/sbin /sbin

if [ -z "${TORCH_AOT_RT_PYROOT_STAGE:-}" ]; then
    # Host, first pass: a private mount namespace, then this script again in it.
    export TORCH_AOT_RT_PYROOT_STAGE=ns
    exec unshare --mount --propagation private -- /bin/bash "$0" "$@"
fi
unset TORCH_AOT_RT_PYROOT_STAGE

# Host, second pass, in the private namespace: what to bind. The host's top-level
# folders that are not system ones (/work, /tmp, /home, /opt, ...), the checkout, the
# wrappers' folder, the cwd, and $TORCH_AOT_RT_PYROOT_BINDS (colon-separated).
binds=()
for d in /*; do
    if [ -d "$d" ] && [ ! -L "$d" ] && [ "$d" != /lost+found ] && ! _system_path "$d"; then
        binds+=("$d")
    fi
done
IFS=: read -r -a extra <<<"${TORCH_AOT_RT_PYROOT_BINDS:-}"
for p in "${ALWAYS_BIND[@]}" "$PWD" "${extra[@]}"; do
    if [ -z "$p" ] || [ ! -d "$p" ]; then continue; fi
    p="$(readlink -f -- "$p")"
    _system_path "$p" && continue
    covered=0
    for b in "${binds[@]}"; do
        case "$p/" in "$b"/*) covered=1 ;; esac
    done
    [ "$covered" -eq 1 ] || binds+=("$p")
done
for b in "${binds[@]}"; do
    mkdir -p "$ROOTFS$b"
    mount --rbind "$b" "$ROOTFS$b"
done
mount --rbind /proc "$ROOTFS/proc"
mount --rbind /sys "$ROOTFS/sys"
mount --rbind /dev "$ROOTFS/dev"
# The host's CA bundle too: it may trust a proxy's CA that Debian's bundle lacks
# (pip fails with CERTIFICATE_VERIFY_FAILED otherwise).
for f in /etc/resolv.conf /etc/hosts /etc/ssl/certs/ca-certificates.crt; do
    if [ -e "$f" ]; then
        [ -e "$ROOTFS$f" ] || touch "$ROOTFS$f"
        mount --bind "$(readlink -f "$f")" "$ROOTFS$f"
    fi
done

# The host's library settings would break the root's programs; its PATH is kept
# (the root's system folders appended) so a venv's bin/ stays first.
unset LD_LIBRARY_PATH LD_PRELOAD PYTHONHOME
_path_add /usr/local/bin /usr/bin /bin /usr/local/sbin
export PATH
# In the root: the same cwd (the host's, bound), or / if it is a system folder there.
# shellcheck disable=SC2016  # the inner script expands its own arguments
exec chroot "$ROOTFS" /bin/bash -c '
    cd -- "$1" 2>/dev/null || { echo "python: cwd $1 is not reachable in the root; using /" >&2; cd /; }
    real="$2" argv0="$3"
    shift 3
    exec -a "$argv0" "$real" "$@"
' pyroot "$PWD" "$REAL" "$0" "$@"
EOF
    chmod 755 "$tmp"
    # Replaced by a rename, never rewritten in place: a bash running the old one
    # reads it as it goes.
    if cmp -s "$tmp" "$wrapper"; then
        rm -f "$tmp"
    else
        mv -f "$tmp" "$wrapper"
    fi
    printf '%s\n' "$wrapper"
}

# provision MINOR: step 4, under the lock.
provision() {
    local minor="$1" wrapper
    require_privileges "$minor"
    mkdir -p "$PYROOTS"
    exec 9>"$PYROOTS/provision.lock"
    flock 9
    ensure_rootfs
    ensure_packages "$minor"
    wrapper="$(write_wrapper "$minor")"
    flock -u 9
    check_python "$wrapper" "$minor" ||
        die "the provisioned python$minor ($wrapper) does not run; try: $wrapper -c 'import venv, ensurepip'"
}

main() {
    if [ "$#" -ne 1 ] || ! [[ "$1" =~ ^3\.[0-9]+$ ]]; then
        echo "usage: $0 3.MINOR   (prints the path of a CPython 3.MINOR with venv support)" >&2
        exit 2
    fi
    local minor="$1"
    from_env "$minor" || from_path "$minor" || from_pyenv "$minor" || provision "$minor"
}

main "$@"
