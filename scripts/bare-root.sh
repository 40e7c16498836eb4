#!/usr/bin/env bash
# Runs a command in a fresh Debian root with only a C toolchain (debootstrap --variant=minbase
# plus build-essential and ca-certificates: no cmake, no NASM, no Python, no pkg-config) and this
# machine's Rust toolchain, over a copy of the repository's files (what a fresh clone holds) — a new user's bare
# machine. .ci/run uses it to run the README's two commands there.
#
#   scripts/bare-root.sh ROOT 'cargo run --release -- bench && cargo test --release'
#   scripts/bare-root.sh ROOT --prepare    # only make the root and fetch the crates (network)
#   BARE_KEEP_TARGET=1 scripts/bare-root.sh ROOT --prebuild   # build what the README's commands will
#
# --prepare does the network-bound part ahead (debootstrap, `cargo fetch` into the root's own
# ~/.cargo); --prebuild then compiles, in the root, what the README's two commands build
# (`cargo build --release`, `cargo test --release --no-run`, the C library the tests build).
# With BARE_KEEP_TARGET=1 the /src the first run copied is kept, target/ included, so the next
# run finds that build: .ci/run overlaps both with its own work (the build at the lowest
# priority, in the CPU its tests leave idle) and the README's commands then find it built.
#
# ROOT is made if missing (about 2 minutes and 600 MB: debootstrap, from deb.debian.org) and
# reused if present; the checkout is /src inside it, made anew each run. Needs root (debootstrap,
# chroot, mounts in a private mount namespace) and network for crates.io. Environment: SUITE
# (default bookworm), MIRROR (default http://deb.debian.org/debian).
set -euo pipefail
[ $# -eq 2 ] || { sed -n '2,20p' "$0" >&2; exit 2; }
root=$(realpath -m "$1")
cmd=$2
repo=$(cd "$(dirname "$0")/.." && pwd)
suite=${SUITE:-bookworm}
mirror=${MIRROR:-http://deb.debian.org/debian}

if [ ! -x "$root/usr/bin/cc" ]; then
    command -v debootstrap >/dev/null || { apt-get update -qq && apt-get install -y -qq debootstrap; }
    rm -rf "$root"
    echo "bare-root: debootstrap $suite into $root" >&2
    debootstrap --variant=minbase --include=build-essential,ca-certificates "$suite" "$root" \
        "$mirror" >"$root.debootstrap.log" 2>&1 ||
        { tail -20 "$root.debootstrap.log" >&2; exit 1; }
fi
for tool in cmake nasm python3 pkg-config; do
    if chroot "$root" sh -c "command -v $tool" >/dev/null; then
        echo "bare-root: $tool is installed in $root; it is meant to be bare" >&2
        exit 1
    fi
done

# The Rust toolchain this machine builds with, mounted read-only at /opt/rust.
toolchain=$(dirname "$(dirname "$(rustup which cargo 2>/dev/null || command -v cargo)")")
[ -x "$toolchain/bin/cargo" ] && [ -x "$toolchain/bin/rustc" ] ||
    { echo "bare-root: no cargo/rustc under $toolchain" >&2; exit 1; }

# The working tree's files that git tracks or would (no target/, nothing ignored): on CI's
# fresh clone, HEAD. With BARE_KEEP_TARGET=1 (.ci/run) a /src made by an earlier run is kept
# whole, its target/ (what --prebuild built in this root, from nothing) with it: the tree does
# not change during a CI run, and copied again its folders would be newer than that build
# (jpeg-sys rebuilds when its libjpeg-turbo folder changes). Otherwise /src is made anew.
if [ "${BARE_KEEP_TARGET:-0}" = 1 ] && [ -f "$root/src/Cargo.toml" ]; then
    mkdir -p "$root/opt/rust"
else
    rm -rf "$root/src"
    mkdir -p "$root/src" "$root/opt/rust"
    (cd "$repo" && git ls-files -z --cached --others --exclude-standard |
        xargs -0 -r sh -c 'for f; do [ -e "$f" ] && printf "%s\0" "$f"; done' sh |
        tar --null -T - -cf -) | tar -x -C "$root/src"
fi
cp /etc/resolv.conf "$root/etc/resolv.conf"
# This machine's trusted certificates (a network that inspects TLS adds its own authority):
# crates.io is reached as from here.
[ -f /etc/ssl/certs/ca-certificates.crt ] &&
    cp /etc/ssl/certs/ca-certificates.crt "$root/etc/ssl/certs/ca-certificates.crt"

# A private mount namespace: the mounts go when the command ends.
case $cmd in
--prepare) cmd='cargo fetch --locked --target x86_64-unknown-linux-gnu' ;;
--prebuild) cmd='cargo build --release && cargo test --release --no-run &&
    cargo build --release -p gpufeed-capi' ;; # (the C tests build the C library)
esac
exec unshare --mount --propagation private -- bash -euo pipefail -c '
    root=$1 toolchain=$2 cmd=$3
    mount --bind "$toolchain" "$root/opt/rust"
    mount -o remount,bind,ro "$root/opt/rust"
    mount -t proc proc "$root/proc"
    mount --rbind /sys "$root/sys"
    mount --rbind /dev "$root/dev"
    exec chroot "$root" /usr/bin/env -i HOME=/root TERM=dumb CARGO_TERM_COLOR=never \
        PATH=/opt/rust/bin:/usr/local/bin:/usr/bin:/bin \
        bash -euo pipefail -c "cd /src && $cmd"
' bare-root "$root" "$toolchain" "$cmd"
