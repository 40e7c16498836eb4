#!/usr/bin/env bash
# The soak: epochs back to back for MINUTES (default 30) over a generated dataset on this
# disk, every order, several ranks, resumes, loaders dropped mid-epoch, and fresh seeds of the
# faulty simulated disk between real-disk epochs; a third of the time, rounds over a real S3
# server (SeaweedFS: GPUFEED_WEED or `weed` on the PATH; required where GPUFEED_REQUIRE_S3=1)
# read by two processes through one node cache, with the server killed, cached extents damaged,
# objects replaced and the cache's disk (a small tmpfs, where root may mount one) filled; fails
# on any lost or duplicated sample, any error that was not injected, and any growth of memory,
# descriptors or threads after the first minute (examples/soak/ says exactly what is checked).
#
#   scripts/soak.sh [MINUTES] [--no-remote] [--json]
#
# The dataset (about 70 MiB) goes to target/soak, on the project's disk (O_DIRECT needs a real
# file system, not tmpfs); GPUFEED_SOAK_DIR moves it.
set -euo pipefail
cd "$(dirname "$0")/.."
minutes=${1:-30}
shift || true
cargo build --release --example soak -q
exec target/release/examples/soak --minutes "$minutes" --dir "${GPUFEED_SOAK_DIR:-target/soak}" "$@"
