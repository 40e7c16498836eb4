#!/usr/bin/env bash
# Coverage-guided fuzzing (libFuzzer) of every gpufeed parser that reads untrusted bytes.
#
#   scripts/fuzz.sh [MINUTES] [TARGET...]
#
# Each target runs until it has executed $FUZZ_RUNS inputs (default 10 million) or for MINUTES
# (default 30), whichever comes first, then the script prints one line per target: executions,
# seconds, executions/s, coverage (libFuzzer's `cov` edges and `ft` features), corpus size, and
# the result. A crash, a hang (> 10 s on one input), a leak of the harness's bounds or an
# out-of-memory (> 2 GiB) fails the run and leaves the input in target/fuzz-artifacts/ with the
# command that replays it.
#
#   FUZZ_RUNS=N        executions per target (default 10000000)
#   FUZZ_JOBS=N        targets fuzzed at once (default 1)
#   FUZZ_SMOKE=1       CI's smoke test: 5 seconds a target
#
# Built with stable Rust: libFuzzer's coverage instrumentation is a set of stable -C flags
# (what cargo-fuzz passes, less AddressSanitizer, which needs nightly; the code fuzzed is safe
# Rust, so memory errors would be panics). Overflow checks and debug assertions are on.
# Corpora persist in target/fuzz-corpus/ (seeded by fuzz/seeds.py), logs in target/fuzz-logs/.
set -euo pipefail
cd "$(dirname "$0")/.."
root=$PWD

minutes=${1:-30}
shift || true
targets=("$@")
[ ${#targets[@]} -gt 0 ] || targets=(shard tar tfrecord example megatron image_header args decode)
runs=${FUZZ_RUNS:-10000000}
jobs=${FUZZ_JOBS:-1}
seconds=$((minutes * 60))
if [ "${FUZZ_SMOKE:-0}" = 1 ]; then
    seconds=5
    runs=100000000
fi

triple=$(rustc -vV | sed -n 's/^host: //p')
export CARGO_TARGET_DIR=$root/target/fuzz
flags="-Cpasses=sancov-module -Cllvm-args=-sanitizer-coverage-level=4"
flags+=" -Cllvm-args=-sanitizer-coverage-inline-8bit-counters"
flags+=" -Cllvm-args=-sanitizer-coverage-pc-table -Cllvm-args=-sanitizer-coverage-trace-compares"
flags+=" --cfg fuzzing -Cdebug-assertions -Coverflow-checks"
echo "building the fuzz targets (instrumented, release)..." >&2
# --target keeps the instrumentation off build scripts and proc macros.
(cd fuzz && RUSTFLAGS="$flags" cargo build --release --target "$triple" --bins --features decode -q)
bin=$CARGO_TARGET_DIR/$triple/release
export GPUFEED_QUIET=1 # no progress lines from the library in the logs

python3 fuzz/seeds.py target/fuzz-seeds >&2
# Whole JPEGs of every kind, from the library's own encoder (an ordinary release build).
CARGO_TARGET_DIR=$root/target cargo run --release -q --example fuzz_decode_seeds -- \
    target/fuzz-seeds/decode
mkdir -p target/fuzz-corpus target/fuzz-artifacts target/fuzz-logs

one() {
    local t=$1 log=target/fuzz-logs/$1.log
    mkdir -p "target/fuzz-corpus/$t"
    local start=$SECONDS rc=0 max_len=65536
    # Whole JPEGs of the generated set are 20-80 KiB.
    [ "$t" = decode ] && max_len=262144
    "$bin/$t" -runs="$runs" -max_total_time="$seconds" -timeout=10 -rss_limit_mb=2048 \
        -max_len=$max_len -print_final_stats=1 -artifact_prefix="target/fuzz-artifacts/$t-" \
        "target/fuzz-corpus/$t" "target/fuzz-seeds/$t" >"$log" 2>&1 || rc=$?
    local took=$((SECONDS - start))
    local execs cov ft corp
    # A target that fails before its first report has none of these: `|| true`, or the row
    # would not be written and the previous run's "ok" shown.
    execs=$(sed -n 's/^stat::number_of_executed_units: *//p' "$log" | tail -1 || true)
    cov=$(grep -oE 'cov: [0-9]+' "$log" | tail -1 | cut -d' ' -f2 || true)
    ft=$(grep -oE 'ft: [0-9]+' "$log" | tail -1 | cut -d' ' -f2 || true)
    corp=$(grep -oE 'corp: [0-9]+' "$log" | tail -1 | cut -d' ' -f2 || true)
    local result=ok
    if [ "$rc" != 0 ]; then
        local art
        art=$(grep -oE 'target/fuzz-artifacts/[^ ]+' "$log" | tail -1 || true)
        result="FAILED (exit $rc): ${art:-see $log}; replay: $bin/$t ${art:-}"
    fi
    printf '%-13s %12s %7s %9s %6s %7s %6s  %s\n' "$t" "${execs:-?}" "$took" \
        "$(( ${execs:-0} / (took > 0 ? took : 1) ))" "${cov:-?}" "${ft:-?}" "${corp:-?}" "$result" \
        >"target/fuzz-logs/$t.row"
    [ "$rc" = 0 ]
}

printf '%-13s %12s %7s %9s %6s %7s %6s  %s\n' target executions seconds 'exec/s' cov ft corpus result
failed=0
running=0
for t in "${targets[@]}"; do
    [ -x "$bin/$t" ] || { echo "no fuzz target $t" >&2; exit 2; }
    one "$t" &
    running=$((running + 1))
    if [ "$running" -ge "$jobs" ]; then
        wait -n || failed=1
        running=$((running - 1))
    fi
done
while [ "$running" -gt 0 ]; do
    wait -n || failed=1
    running=$((running - 1))
done
for t in "${targets[@]}"; do cat "target/fuzz-logs/$t.row"; done
rm -rf /dev/shm/gpufeed-fuzz-* 2>/dev/null || true
if [ "$failed" != 0 ]; then
    echo "fuzzing found a failure: turn its input into a test in tests/it/fuzzed.rs" >&2
    exit 1
fi
