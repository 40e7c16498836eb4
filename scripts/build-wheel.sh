#!/usr/bin/env bash
# Builds the Python package as a binary wheel into dist/ (maturin, from PyPI, in a virtualenv
# of its own under target/), so that users install it with pip and need neither Rust nor a C
# compiler: `pip install dist/gpufeed-*.whl`.
#
#   scripts/build-wheel.sh [OUT]      # OUT/gpufeed-VERSION-cp39-abi3-manylinux_2_NN_x86_64.whl
#                                     # (OUT: dist by default)
#
# One wheel serves every CPython >= 3.9 (the stable ABI). maturin checks the extension against
# the manylinux policies and tags it with the oldest glibc it allows: built on Debian 12 that is
# manylinux_2_34 (glibc >= 2.34: Ubuntu 22.04, Debian 12, RHEL 9 and later). libjpeg-turbo is
# linked in statically; the CUDA libraries are loaded at run time, so the wheel runs without them.
set -euo pipefail
cd "$(dirname "$0")/.."
venv=target/wheel-venv
if [ ! -x "$venv/bin/maturin" ]; then
    python3 -m venv "$venv"
    "$venv/bin/pip" install --quiet --disable-pip-version-check 'maturin>=1.5,<2'
fi
out=${1:-dist}
mkdir -p "$out"
rm -f "$out"/gpufeed-*.whl
"$venv/bin/maturin" build --release --strip -m python/Cargo.toml --out "$out" >&2
ls "$out"/gpufeed-*.whl
