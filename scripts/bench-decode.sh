#!/usr/bin/env bash
# `gpufeed bench decode` with its Pillow rows: makes a virtualenv with Pillow and numpy (the
# peer pipeline's only needs; the crate needs neither) in .bench-venv, then runs the bench with
# it. Arguments go to `gpufeed bench decode` (e.g. --threads 1 --rounds 5 --json).
set -euo pipefail
root="$(cd "$(dirname "$0")/.." && pwd)"
venv="${GPUFEED_BENCH_VENV:-$root/.bench-venv}"
if [ ! -x "$venv/bin/python" ] || ! "$venv/bin/python" -c "import PIL, numpy" 2>/dev/null; then
    python3 -m venv "$venv"
    "$venv/bin/pip" install --quiet --disable-pip-version-check pillow numpy
fi
bin="${GPUFEED_BIN:-$root/target/release/gpufeed}"
[ -x "$bin" ] || (cd "$root" && cargo build --release --bin gpufeed)
exec "$bin" bench decode --python "$venv/bin/python" "$@"
