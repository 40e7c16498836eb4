#!/usr/bin/env bash
# Everything GPU in one run.
#
#   scripts/gpu-check.sh build   # on the x86-64 development machine (has Rust): builds the CLI and
#                                # the test binaries and gathers them in .device/ (git-ignored)
#   scripts/gpu-check.sh run     # on the GPU machine (no Rust needed), from the repository root
#                                # with .device/ present: GPU tests in GPU-required mode (a
#                                # skipped GPU test fails), the no-GPU path with
#                                # CUDA_VISIBLE_DEVICES=, the CPU tests, then `gpufeed bench gpu`;
#                                # prints a table. Results land in $OUT (or .gpufeed-work/out).
#
# Stages, for a GPU lent for minutes (about 15 in all, its start included; 10 per command):
#   run --quick     the GPU-required tests only (GPU, nvJPEG and, where the machine has NVRTC,
#                   the kernel tests fail rather than skip; the no-GPU path; the Python GPU
#                   tests); no CPU suite (CI runs it), no benchmark. Meant to end in < 7 min.
#   run --bench     the benchmarks only (`--skip-tests`).
#   run             everything (tests, the CPU suite again, benchmarks).
#   run --profile   the device decode path in <= 5 min: each device row's phase table, an A/B
#                   of decoder states (GPUFEED_JPEG_STATES 1, 2, 3) and batch (128, 256) beside
#                   the CPU stage and torchvision, nvidia-smi dmon, perf where present.
# Other options: --small (small datasets, 2 s rows), --skip-bench, --skip-tests, --rounds=N (N
# more rounds of the storage rows of both workloads, their order reversed every other round, to
# tell the disk's drift from a real gap), --budget=SECONDS (default 420 with --quick, else 540: each step runs under
# what is left of it, so a step that hangs is cut and named, and the summary so far — written to
# $OUT/summary.txt as it goes — comes back rather than a killed command's nothing).
# With the device tool:
#   run(command="scripts/gpu-check.sh run --quick", carry=[".device"], timeout_s=480)
#   run(command="scripts/gpu-check.sh run --bench --small", carry=[".device"], timeout_s=540)
set -euo pipefail
cd "$(dirname "$0")/.."
mode="${1:-}"
shift || true
SHIP=.device

if [[ "$mode" == build ]]; then
    # With the simulated device: the shipped tests run `gpufeed bench decode --device sim` too.
    cargo build --release -p gpufeed-cli --features gpufeed/sim
    # The integration test binary: the last executable cargo reports for the `it` target.
    it=$(cargo test --release --no-run --message-format=json 2>/dev/null \
        | python3 -c 'import json,sys
for l in sys.stdin:
    m = json.loads(l)
    if m.get("reason") == "compiler-artifact" and m["target"]["name"] == "it" and m.get("executable"):
        print(m["executable"])' | tail -1)
    lib=$(cargo test --release -p gpufeed --lib --no-run --message-format=json 2>/dev/null \
        | python3 -c 'import json,sys
for l in sys.stdin:
    m = json.loads(l)
    if m.get("reason") == "compiler-artifact" and m["target"]["kind"] == ["lib"] and m.get("executable"):
        print(m["executable"])' | tail -1)
    [[ -x "$it" && -x "$lib" ]] || { echo "could not find the test binaries" >&2; exit 1; }
    rm -rf "$SHIP"
    mkdir -p "$SHIP"
    cp target/release/gpufeed "$SHIP/gpufeed"
    cp "$it" "$SHIP/it"
    cp "$lib" "$SHIP/unit"
    # Debug info stripped, symbols kept (backtraces name functions): the device tool carries at
    # most 64 MiB, working tree included.
    for b in gpufeed it unit; do
        strip --strip-debug "$SHIP/$b"
    done
    # The Python package as a wheel (abi3: any CPython >= 3.9, stripped by maturin), its GPU
    # tests and bench script.
    scripts/build-wheel.sh "$SHIP" > /dev/null
    cp python/tests/test_gpu.py python/tests/test_images.py scripts/bench-python.py "$SHIP/"
    # (bench decode finds scripts/bench-decode-{pil,tv}.py in the carried tree: GPUFEED_ROOT.)
    # nvJPEG 13.0 (4 MB, from the nvidia-nvjpeg wheel) in case the GPU machine's image lacks it.
    venv=target/ci-cuda-venv
    [[ -x "$venv/bin/python" ]] || python3 -m venv "$venv"
    "$venv/bin/pip" install --quiet --disable-pip-version-check 'nvidia-nvjpeg==13.0.*' \
        'nvidia-cuda-nvrtc==13.0.*' || true
    mkdir -p "$SHIP/lib"
    cp "$venv"/lib/python3*/site-packages/nvidia/cu13/lib/libnvjpeg.so.13 "$SHIP/lib/" 2>/dev/null ||
        echo "warning: no libnvjpeg.so.13 to ship" >&2
    # The kernels compiled here for sm_80 and sm_90 (NVRTC needs no GPU; libnvrtc is too large
    # to carry): the GPU machine loads them from this cache when it has no NVRTC of its own.
    LD_LIBRARY_PATH="$(ls -d "$PWD/$venv"/lib/python3*/site-packages/nvidia/cu13/lib | head -1)" \
        cargo run --release -q --example kernel_cache -- "$SHIP/kernels" 80 90 ||
        echo "warning: no prebuilt kernels to ship" >&2
    git rev-parse HEAD > "$SHIP/commit" 2>/dev/null || true
    # Binaries, nvJPEG and kernels in one gzip'd tar (a third of their size; `run` unpacks it):
    # symbols kept for backtraces, with room left under the limit.
    tar -czf "$SHIP/bundle.tar.gz" -C "$SHIP" gpufeed it unit lib kernels 2>/dev/null ||
        tar -czf "$SHIP/bundle.tar.gz" -C "$SHIP" gpufeed it unit
    rm -rf "$SHIP/gpufeed" "$SHIP/it" "$SHIP/unit" "$SHIP/lib" "$SHIP/kernels"
    # What travels: $SHIP and the working tree's files that git does not ignore. 56 MiB at
    # most (the tool's 64, with room), checked here rather than refused there.
    tree=$(git ls-files -z --cached --others --exclude-standard | xargs -0 stat -c %s 2>/dev/null |
        awk '{s += $1} END {print s + 0}')
    ship=$(du -sb "$SHIP" | cut -f1)
    total=$((tree + ship))
    mib() { awk -v b="$1" 'BEGIN {printf "%.1f MiB", b / 1048576}'; }
    echo "shipped to $SHIP: bundle.tar.gz (gpufeed, it (integration tests), unit, nvJPEG, kernels), $(basename "$SHIP"/gpufeed-*.whl); commit $(cat "$SHIP/commit" 2>/dev/null)"
    echo "to carry: $SHIP $(mib "$ship") + working tree $(mib "$tree") = $(mib "$total") (limit 56 MiB)"
    (cd "$SHIP" && du -b -- * | sort -rn | head -6 | awk '{printf "  %-28s %6.1f MiB\n", $2, $1 / 1048576}')
    if ((total > 56 * 1048576)); then
        echo "too large to carry: at most 56 MiB" >&2
        exit 1
    fi
    exit 0
fi

if [[ "$mode" != run ]]; then
    echo "usage: $0 build | run [--quick | --bench | --profile] [--small] [--skip-bench] [--skip-tests] [--rounds=N] [--budget=S]" >&2
    exit 2
fi

quick=0; small=0; bench=1; tests=1; rounds=0; budget=; profile=0
for a in "$@"; do
    case "$a" in
        --quick) quick=1; bench=0 ;;
        --profile) profile=1; bench=0; tests=0 ;;
        --bench) tests=0 ;;
        --small) small=1 ;;
        --skip-bench) bench=0 ;;
        --skip-tests) tests=0 ;;
        --rounds=*) rounds=${a#--rounds=} ;;
        --budget=*) budget=${a#--budget=} ;;
        *) echo "unknown option $a" >&2; exit 2 ;;
    esac
done
[[ -n "$budget" ]] || budget=$((quick == 1 ? 420 : profile == 1 ? 300 : 540))
t_start=$SECONDS
# What is left of the budget for the next step (at least 10 s, so it can say it ran out).
left() { local l=$((budget - (SECONDS - t_start) - 15)); echo $((l > 10 ? l : 10)); }
# The binaries travel packed (build): unpacked here once.
if [[ -f "$SHIP/bundle.tar.gz" && ! -x "$SHIP/gpufeed" ]]; then
    tar -xzf "$SHIP/bundle.tar.gz" -C "$SHIP"
fi
[[ -x "$SHIP/gpufeed" && -x "$SHIP/it" ]] || {
    echo "$SHIP/ is missing: run '$0 build' on the development machine and carry $SHIP" >&2
    exit 1
}
# Data and scratch on the machine's disk (not tmpfs, not inside the carried folder).
work="${GPUFEED_WORK:-$PWD/.gpufeed-work}"
mkdir -p "$work"
out="${OUT:-$work/out}"
mkdir -p "$out"
export GPUFEED_BIN="$PWD/$SHIP/gpufeed" GPUFEED_TEST_TMPDIR="$work/tmp" GPUFEED_QUIET=1
# Kernels: compiled by this machine's NVRTC if it has one, else the CUBINs shipped in $SHIP.
export GPUFEED_KERNEL_CACHE="$PWD/$SHIP/kernels"
# nvJPEG: the machine's if it has one, else the one shipped in $SHIP/lib.
if ! ldconfig -p 2>/dev/null | grep -q 'libnvjpeg\.so\.13' && [[ -e "$SHIP/lib/libnvjpeg.so.13" ]]; then
    export GPUFEED_NVJPEG="$PWD/$SHIP/lib/libnvjpeg.so.13"
fi
# cuFile from PyPI (nvidia-cufile) ships libcufile.so.0 only; the loader asks for libcufile.so.
if ! ldconfig -p 2>/dev/null | grep -q 'libcufile\.so '; then
    cf=$(python3 - <<'EOF' 2>/dev/null || true
import glob, os, site, sys
for d in site.getsitepackages() + [site.getusersitepackages()]:
    for f in sorted(glob.glob(os.path.join(d, "nvidia", "**", "libcufile.so*"), recursive=True)):
        if "rdma" not in os.path.basename(f):
            print(f); sys.exit(0)
EOF
)
    if [[ -n "$cf" ]]; then
        mkdir -p "$work/lib"
        ln -sf "$cf" "$work/lib/libcufile.so"
        export LD_LIBRARY_PATH="$work/lib:$(dirname "$cf")${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
        echo "cuFile: $cf (PyPI nvidia-cufile, linked as $work/lib/libcufile.so)"
    fi
fi
summary="$out/summary.txt"
: > "$summary"
note() { echo "$*" | tee -a "$summary"; }

note "== machine"
(nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader 2>&1 || true) | tee -a "$summary"
note "commit: $(cat "$SHIP/commit" 2>/dev/null || echo unknown)"
if lsmod 2>/dev/null | grep -q nvidia_fs; then
    note "nvidia-fs: loaded"
else
    note "nvidia-fs: not loaded"
    # Without nvidia-fs cuFile runs only in compatibility mode, which cufile.json must allow
    # (CUDA 13's shipped default refuses it: cuFileHandleRegister fails with
    # CU_FILE_HANDLE_NOT_REGISTERED). A copy of the installed config with it allowed.
    if [[ -z "${CUFILE_ENV_PATH_JSON:-}" ]]; then
        src=$(ls /etc/cufile.json /usr/local/cuda/gds/cufile.json 2>/dev/null | head -1 || true)
        if [[ -n "$src" ]] && grep -q '"allow_compat_mode"' "$src"; then
            sed 's/"allow_compat_mode"[[:space:]]*:[[:space:]]*false/"allow_compat_mode": true/' \
                "$src" > "$work/cufile.json"
        else
            echo '{ "properties": { "allow_compat_mode": true } }' > "$work/cufile.json"
        fi
        export CUFILE_ENV_PATH_JSON="$work/cufile.json"
        note "cuFile config: $work/cufile.json (from ${src:-nothing}), allow_compat_mode: true"
    fi
fi
# cuFile looks the data disk up in udev's database and refuses a file whose volume has no
# record (cufile.log: "udev property not found: ID_FS_USAGE"), as on a VM without udevd. Write
# the record udev would have written for the work folder's file system, if none exists.
mm=$(findmnt -no MAJ:MIN -T "$work" 2>/dev/null | head -1 | tr -d ' ')
fst=$(findmnt -no FSTYPE -T "$work" 2>/dev/null | head -1)
if [[ -n "$mm" && ! -e "/run/udev/data/b$mm" ]] && mkdir -p /run/udev/data 2>/dev/null; then
    printf 'E:ID_FS_USAGE=filesystem\nE:ID_FS_TYPE=%s\n' "$fst" > "/run/udev/data/b$mm" &&
        note "udev: wrote /run/udev/data/b$mm (ID_FS_USAGE=filesystem, ID_FS_TYPE=$fst) for cuFile"
fi
ls /usr/local/cuda*/lib64/libcufile.so* /usr/lib/x86_64-linux-gnu/libcufile.so* 2>/dev/null | head -3 | tee -a "$summary" || true

install_wheel() {
    rm -rf "$work/pysite"
    python3 -m pip install --quiet --no-deps --no-index --target "$work/pysite" "$SHIP"/gpufeed-*.whl &&
        export PYTHONPATH="$work/pysite${PYTHONPATH:+:$PYTHONPATH}"
}
status=0
run_tests() { # name, env..., -- args
    local name=$1; shift
    local log="$out/test-$name.log" rc=0 t0=$SECONDS
    timeout -k 5 "$(left)" env "$@" > "$log" 2>&1 || rc=$?
    if [[ $rc == 0 ]]; then
        note "PASS  $name  ($(grep -Eo 'test result: ok\. [0-9]+ passed|^Ran [0-9]+ tests?' "$log" | tail -1), $((SECONDS - t0)) s)"
    elif [[ $rc == 124 || $rc == 137 ]]; then
        note "TIMEOUT  $name  after $((SECONDS - t0)) s: the budget (--budget=$budget) ran out (see $log)"
        tail -15 "$log"; status=1
    else
        note "FAIL  $name  (see $log)"; tail -30 "$log"; status=1
    fi
}
if [[ $tests == 1 ]]; then
    note "== tests"
    # GPU-required: a skipped GPU test fails here — the GPU, nvJPEG, and the kernel tests where
    # this machine has NVRTC (else the kernels come from the CUBINs shipped in $SHIP/kernels,
    # and their compile tests are CI's).
    req=(GPUFEED_REQUIRE_GPU=1 GPUFEED_REQUIRE_NVJPEG=1)
    if ldconfig -p 2>/dev/null | grep -q 'libnvrtc\.so\.13' ||
        python3 -c 'import glob, site, sys; sys.exit(not any(glob.glob(d + "/nvidia/cu13/lib/libnvrtc.so.13") for d in site.getsitepackages()))' 2>/dev/null; then
        req+=(GPUFEED_REQUIRE_NVRTC=1); groups=(gpu:: device:: kernels::)
    else
        note "NVRTC: none here; kernels from $SHIP/kernels, kernel compile tests left to CI"
        groups=(gpu:: device::)
    fi
    # (--nocapture: what the tests measure on the GPU, e.g. how far the JPEG engines' pixels
    # lie from the CPU stage's, is in the log and the summary.)
    run_tests gpu "${req[@]}" "$SHIP/it" "${groups[@]}" --test-threads=1 --nocapture
    grep -h "levels" "$out"/test-gpu.log | sed 's/^/  /' | tee -a "$summary" || true
    # The no-GPU path of every entry point, on the GPU machine.
    run_tests no-gpu CUDA_VISIBLE_DEVICES= "$SHIP/it" device::no_gpu
    if [[ $quick == 0 ]]; then
        # Everything else (CPU) on this machine too, but the tests that need the source tree,
        # cargo or PyPI (the C ABI build, the Python package build), which the GPU machine
        # lacks.
        run_tests cpu "$SHIP/it" --skip gpu:: --skip device::no_gpu --skip capi:: --skip bindings_python::
        [[ -x "$SHIP/unit" ]] && run_tests unit "$SHIP/unit"
    fi
    grep -h "skipped" "$out"/test-gpu.log | sed 's/^/  /' | tee -a "$summary" || true
    # Python: the wheel into a folder on PYTHONPATH of the machine's python3 (which is itself a
    # virtual environment holding torch; a venv made from it would not see torch or numpy).
    if install_wheel; then
        "$SHIP/gpufeed" bench load --dir "$work/pyload" --samples 3000 --modes io --json \
            > /dev/null 2>&1 || true
        run_tests python-gpu GPUFEED_REQUIRE_GPU=1 GPUFEED_GPU_DATA="$work/pyload/packed" \
            python3 "$SHIP/test_gpu.py" -v
        # Decoded image batches, with torch there: torch.from_dlpack shares the tensor.
        run_tests python-images python3 "$SHIP/test_images.py" -v
    else
        note "FAIL  python wheel install"; status=1
    fi
fi

if [[ $bench == 1 ]]; then
    note "== gpufeed bench gpu"
    if [[ $small == 1 ]]; then
        args=(--size 2G --samples 10000 --seconds 2)
    else
        args=(--size 8G --samples 50000 --seconds 5)
    fi
    if timeout -k 5 "$(left)" "$SHIP/gpufeed" bench gpu --file "$work/bench.dat" --dir "$work/load" "${args[@]}" --json \
        > "$out/bench-gpu.jsonl" 2> "$out/bench-gpu.err"; then
        :
    else
        note "FAIL  bench gpu (see $out/bench-gpu.err)"; tail -20 "$out/bench-gpu.err"; status=1
    fi
    # The loader rows again without crc32c verification (cuFile and naive never verify).
    timeout -k 5 "$(left)" "$SHIP/gpufeed" bench gpu --file "$work/bench.dat" --dir "$work/load" "${args[@]}" --json \
        --workloads imagenet --paths host,ours --no-verify 2>> "$out/bench-gpu.err" \
        | sed 's/"workload":"imagenet mix, packed, global"/"workload":"imagenet, no crc"/' \
        >> "$out/bench-gpu.jsonl" || { note "FAIL  bench gpu --no-verify"; status=1; }
    for ((k = 1; k <= rounds; k++)); do
        order=host,ours,cufile,naive
        (( k % 2 == 0 )) && order=naive,cufile,ours,host
        timeout -k 5 "$(left)" "$SHIP/gpufeed" bench gpu --file "$work/bench.dat" --dir "$work/load" "${args[@]}" --json \
            --workloads fixed,imagenet --paths "$order" 2>> "$out/bench-gpu.err" \
            | sed "s/\"workload\":\"\([^\"]*\)\"/\"workload\":\"\1, round $k\"/" \
            >> "$out/bench-gpu.jsonl" || { note "FAIL  bench gpu round $k"; status=1; }
    done
    python3 - "$out/bench-gpu.jsonl" <<'EOF' | tee -a "$summary"
import json, sys
rows = [json.loads(l) for l in open(sys.argv[1]) if l.strip()]
if not rows:
    sys.exit(0)
print(f"{'workload':<30} {'path':<7} {'GiB/s':>8} {'CPU-s/GiB':>10}  what ran")
for r in rows:
    print(f"{r['workload']:<30} {r['path']:<7} {r['gib_per_s']:>8.3f} {r['cpu_s_per_gib']:>10.3f}  {r['detail']}")
print(f"device: {rows[0]['device']}")
for w in dict.fromkeys(r['workload'] for r in rows):
    get = {r['path']: r for r in rows if r['workload'] == w and r['bytes'] > 0}
    if 'ours' not in get:
        continue
    o = get['ours']
    parts = []
    if 'host' in get and 'h2d' in get:
        parts.append(f"{o['gib_per_s'] / min(get['host']['gib_per_s'], get['h2d']['gib_per_s']):.2f}x min(host, h2d) [target >= 0.95]")
    elif 'host' in get:
        parts.append(f"{o['gib_per_s'] / get['host']['gib_per_s']:.2f}x host")
    for p, t in (('naive', '>= 2'), ('cufile', '>= 1.0')):
        if p in get:
            parts.append(f"{o['gib_per_s'] / get[p]['gib_per_s']:.2f}x {p} [target {t}] at {o['cpu_s_per_gib'] / max(get[p]['cpu_s_per_gib'], 1e-12):.2f}x its CPU/GiB")
    print(f"{w}: ours = " + "; ".join(parts))
EOF
fi
if [[ $bench == 1 ]]; then
    # Decoded images on the GPU: torchvision's own GPU path (decode_jpeg(device="cuda") on lists
    # + transforms.v2 on the device, scripts/bench-decode-tv.py) beside gpufeed's CPU stage, and
    # gpufeed's device pipeline (issue 23: targets >= 1.5x tv's images/s at 224x224 f16, <= 0.33
    # CPU-s per 1000 images; until nvJPEG's batched decode is joined every image takes the CPU
    # route, so the CPU figure is not expected to meet its target yet).
    note "== gpufeed bench decode --device cuda"
    dn=2000; [[ $small == 1 ]] && dn=500
    export GPUFEED_ROOT="$PWD"
    dargs=(--device cuda --dir "$work/decode" --images "$dn" --size 224 --dtype float16
        --batch 128 --python python3 --json)
    if timeout -k 5 "$(left)" "$SHIP/gpufeed" bench decode "${dargs[@]}" --rounds 3 \
        --rows tv-train,gpufeed-train,tv-eval,gpufeed-eval \
        > "$out/bench-decode.jsonl" 2> "$out/bench-decode.err"; then
        :
    else
        note "FAIL  bench decode (see $out/bench-decode.err)"; tail -20 "$out/bench-decode.err"; status=1
    fi
    if timeout -k 5 "$(left)" "$SHIP/gpufeed" bench decode "${dargs[@]}" --rounds 3 \
        --rows gpufeed-device-train,gpufeed-nohw-train,gpufeed-device-eval \
        >> "$out/bench-decode.jsonl" 2> "$out/bench-decode-device.err"; then
        :
    else
        note "FAIL  bench decode, device rows (see $out/bench-decode-device.err)"
        tail -20 "$out/bench-decode-device.err"; status=1
    fi
    python3 - "$out/bench-decode.jsonl" <<'EOF' | tee -a "$summary"
import json, statistics, sys
rows = [json.loads(l) for l in open(sys.argv[1]) if l.strip()]
rows = [r for r in rows if "row" in r]
by = {}
for r in rows:
    by.setdefault(r["row"], []).append(r)
med = {}
print(f"{'row':<22} {'images/s':>10} {'CPU-s/1000':>11}  (median of rounds)")
for name, rs in by.items():
    ips = statistics.median(r["images_per_s"] for r in rs)
    cpu = statistics.median(r["cpu_s_per_1000"] for r in rs)
    med[name] = (ips, cpu)
    print(f"{name:<22} {ips:>10.1f} {cpu:>11.3f}")
for m in ("train", "eval"):
    d, t = med.get(f"gpufeed-device-{m}"), med.get(f"tv-{m}")
    if d and t:
        print(f"{m}: gpufeed device / torchvision GPU = {d[0] / t[0]:.2f}x images/s [target >= 1.5]; "
              f"gpufeed {d[1]:.3f} CPU-s/1000 [target <= 0.33]")
EOF
fi
if [[ $profile == 1 ]]; then
    # The device decode path's profile (issue 53, item 8), in at most the budget: the phase
    # table of each device row (in its JSON), an A/B of the switches that exist (decoder
    # states, batch size) beside gpufeed's CPU stage and torchvision's GPU path, nvidia-smi
    # dmon during it, and perf where present. Each step appends to the summary as it ends, so
    # a time-out still returns what ran.
    note "== profile: gpufeed bench decode --device cuda"
    export GPUFEED_ROOT="$PWD"
    pn=2000; [[ $small == 1 ]] && pn=500
    pargs=(--device cuda --dir "$work/decode" --images "$pn" --size 224 --dtype float16 --python python3 --json)
    dmon=
    if command -v nvidia-smi > /dev/null; then
        nvidia-smi dmon -s ujm -d 1 > "$out/dmon.txt" 2>&1 & dmon=$!
    fi
    profile_row() { # name, env..., then the command
        local name=$1; shift
        local before
        before=$(wc -l < "$out/profile.jsonl" 2> /dev/null || echo 0)
        timeout -k 5 "$(left)" env "$@" >> "$out/profile.jsonl" 2>> "$out/profile.err" ||
            note "FAIL  profile $name (see $out/profile.err)"
        tail -n +"$((before + 1))" "$out/profile.jsonl" > "$out/profile.last"
        python3 - "$out/profile.last" "$name" <<'EOF' | tee -a "$summary"
import json, sys
name = sys.argv[2]
for l in open(sys.argv[1]):
    if not l.startswith('{"row"'):
        continue
    r = json.loads(l)
    print(f"{name}: {r['row']} round {r['round']}: {r['images_per_s']:.0f} images/s, "
          f"{r['cpu_s_per_1000']:.3f} CPU-s/1000")
    t = r.get("phases")
    if not t:
        continue
    print(f"  CPU-ms/image: engine route {t['hardware_cpu_ms_per_image']:.3f} "
          f"({t['hardware_images']}), cpu route {t['cpu_route_cpu_ms_per_image']:.3f} "
          f"({t['cpu_images']}), shared {t['shared_cpu_ms_per_image']:.3f}; I/O thread "
          f"{t['io_thread_cpu_s']:.2f} s, decode threads {t['decode_threads_cpu_s']:.2f} s")
    for p in t["phases"]:
        if p["count"]:
            print(f"    {p['phase']:<16} {p['thread']:<8} {p['wall_s']:8.3f} s wall "
                  f"{p['cpu_s']:8.3f} s CPU {p['count']:7d}")
EOF
    }
    g="$SHIP/gpufeed"
    profile_row "states=2 batch=128" GPUFEED_JPEG_STATES=2 "$g" bench decode "${pargs[@]}" \
        --batch 128 --rounds 2 --rows gpufeed-device-train,gpufeed-train,tv-train
    profile_row "states=1 batch=128" GPUFEED_JPEG_STATES=1 "$g" bench decode "${pargs[@]}" \
        --batch 128 --rounds 2 --rows gpufeed-device-train
    profile_row "states=3 batch=128" GPUFEED_JPEG_STATES=3 "$g" bench decode "${pargs[@]}" \
        --batch 128 --rounds 2 --rows gpufeed-device-train
    profile_row "states=2 batch=256" GPUFEED_JPEG_STATES=2 "$g" bench decode "${pargs[@]}" \
        --batch 256 --rounds 2 --rows gpufeed-device-train
    if command -v perf > /dev/null; then
        if timeout -k 5 "$(left)" perf record -g -o "$out/perf.data" -- "$g" bench decode "${pargs[@]}" \
            --batch 128 --rounds 1 --rows gpufeed-device-train > /dev/null 2>> "$out/profile.err"; then
            perf report -i "$out/perf.data" --stdio --no-children 2> /dev/null | head -150 > "$out/perf.txt"
            note "perf: $out/perf.txt"
        else
            note "perf: did not run (see $out/profile.err)"
        fi
        rm -f "$out/perf.data"
    else
        note "perf: not on this machine"
    fi
    [[ -n "$dmon" ]] && kill "$dmon" 2> /dev/null
    [[ -s "$out/dmon.txt" ]] && note "nvidia-smi dmon: $out/dmon.txt (jpg: the JPEG engines' use)"
fi
# (This run's wheel: a folder left by an earlier run on the machine is not on PYTHONPATH.)
if [[ $bench == 1 && ":${PYTHONPATH:-}:" != *":$work/pysite:"* ]]; then
    install_wheel || true
fi
if [[ $bench == 1 && -d "$work/pysite/gpufeed" ]]; then
    note "== scripts/bench-python.py --device cuda (gpufeed Python vs torch DataLoader)"
    timeout -k 5 "$(left)" python3 "$SHIP/bench-python.py" --gpufeed "$SHIP/gpufeed" --dir "$work/load" \
        --samples "${args[3]}" --device cuda:0 --rounds 3 2>&1 | tee -a "$summary" || {
        note "FAIL  bench-python"; status=1; }
fi
note "== done: $([[ $status == 0 ]] && echo all passed || echo FAILURES)"
exit $status
