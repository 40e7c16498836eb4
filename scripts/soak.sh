#!/usr/bin/env bash
# The soak: epochs back to back for MINUTES (default 30) over a generated dataset on this
# disk, every order, several ranks, resumes, loaders dropped mid-epoch, and fresh seeds of the
# faulty simulated disk between real-disk epochs; fails on any lost or duplicated sample, any
# error that was not injected, and any growth of memory, descriptors or threads after the
# first minute (examples/soak.rs says exactly what is checked).
#
#   scripts/soak.sh [MINUTES] [--json]
#
# The dataset (about 70 MiB) goes to target/soak, on the project's disk (O_DIRECT needs a real
# file system, not tmpfs); GPUFEED_SOAK_DIR moves it.
set -euo pipefail
cd "$(dirname "$0")/.."
minutes=${1:-30}
shift || true
cargo build --release --example soak -q
exec target/release/examples/soak --minutes "$minutes" --dir "${GPUFEED_SOAK_DIR:-target/soak}" "$@"
