#!/usr/bin/env bash
# Runs fio (--ioengine=io_uring --direct=1 --norandommap) and `gpufeed bench io` alternately on the
# same file and workloads, and prints ours/fio ratios for GiB/s and CPU-seconds per GiB.
# The pread-pool and std engines run alongside (once per round) to show what io_uring buys.
#
# usage: scripts/compare-fio.sh [--file PATH] [--size 4G] [--seconds 10] [--rounds 2]
#                               [--cases 4k,128k,imagenet] [--cpu auto|none|N] [--json OUT.json]
#                               [--tokio-uring]
# --tokio-uring: also run the tokio-uring peer (`bench io --engine tokio-uring`, a binary built
# with `-p gpufeed-cli --features tokio-uring`) in the alternation: fio, ours, tokio-uring in odd rounds, the
# reverse in even rounds.
# --cpu: both tools run pinned to the same CPU (taskset). `auto` (default) picks a CPU that does
# not take the disk's interrupts: on kernels without IRQ-time accounting, interrupt time is
# charged to whichever task happens to run on the interrupted CPU, which otherwise makes the
# CPU-seconds of either tool depend on where the scheduler put it (measured here: +15% when on
# the interrupt CPU). `none` runs unpinned.
# needs: fio (installed with apt-get when missing and running as root), python3.
set -euo pipefail
cd "$(dirname "$0")/.."

file=gpufeed-bench.dat size=4G seconds=10 rounds=2 cases=4k,128k,imagenet json_out="" cpu=auto
tokio=0
while [ $# -gt 0 ]; do
  case "$1" in
    --file) file=$2; shift 2;; --size) size=$2; shift 2;; --seconds) seconds=$2; shift 2;;
    --rounds) rounds=$2; shift 2;; --cases) cases=$2; shift 2;; --json) json_out=$2; shift 2;;
    --cpu) cpu=$2; shift 2;;
    --tokio-uring) tokio=1; shift;;
    -h|--help) sed -n '2,18p' "$0"; exit 0;;
    *) echo "unknown argument: $1" >&2; exit 2;;
  esac
done

if ! command -v fio >/dev/null; then
  if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null; then
    apt-get update -qq && apt-get install -y -qq fio >/dev/null
  else
    echo "fio is not installed (apt-get install fio)" >&2; exit 1
  fi
fi
bin=${GPUFEED_BIN:-target/release/gpufeed}
[ -x "$bin" ] || cargo build --release --quiet
"$bin" bench io --file "$file" --size "$size" --seconds 0.01 --bs 4K --json >/dev/null  # create the file

# The CPU to pin both tools to: the one taking the fewest of the disk's interrupts.
if [ "$cpu" = auto ]; then
  cpu=$(python3 - "$file" <<'PY'
import os, sys
st = os.stat(sys.argv[1]); maj, mnr = os.major(st.st_dev), os.minor(st.st_dev)
dev = os.path.realpath(f"/sys/dev/block/{maj}:{mnr}")
if os.path.exists(os.path.join(dev, "partition")):
    dev = os.path.dirname(dev)
names = set()
p = os.path.realpath(os.path.join(dev, "device"))
for _ in range(4):                      # vda -> virtio1, nvme0n1 -> nvme0, ...
    names.add(os.path.basename(p)); p = os.path.dirname(p)
lines = open("/proc/interrupts").read().splitlines()
ncpu = len(lines[0].split())
counts = [0] * ncpu
for l in lines[1:]:
    f = l.split()
    if any(n and (f[-1].startswith(n + "-") or f[-1].startswith(n + "q")) for n in names):
        for i in range(ncpu):
            if f[1 + i].isdigit(): counts[i] += int(f[1 + i])
allowed = sorted(os.sched_getaffinity(0))
print(min(allowed, key=lambda c: (counts[c] if c < ncpu else 0, c)))
PY
)
fi
pin=()
if [ "$cpu" != none ]; then pin=(taskset -c "$cpu"); echo "pinning fio and gpufeed to CPU $cpu" >&2; fi

tmp=$(mktemp -d); trap 'rm -rf "$tmp"' EXIT
imagenet='2K/1:4K/2:8K/4:16K/8:32K/13:64K/38:128K/33:256K/1'
run_case() { # name ours_bs fio_bs_arg qd round
  local name=$1 bs=$2 fiobs=$3 qd=$4 r=$5
  local fio_cmd=("${pin[@]}" fio --name=gpufeed-compare --filename="$file" --ioengine=io_uring --direct=1
                 --norandommap --rw=randread "$fiobs" --iodepth="$qd" --runtime="$seconds"
                 --time_based --output-format=json)
  local ours_cmd=("${pin[@]}" "$bin" bench io --file "$file" --pattern rand --bs "$bs" --qd "$qd"
                  --seconds "$seconds" --engine uring --json)
  local tokio_cmd=("${pin[@]}" "$bin" bench io --file "$file" --pattern rand --bs "$bs" --qd "$qd"
                  --seconds "$seconds" --engine tokio-uring --json)
  sync; echo 3 > /proc/sys/vm/drop_caches 2>/dev/null || true
  if [ $((r % 2)) = 1 ]; then
    "${fio_cmd[@]}" > "$tmp/$name.fio.$r.json"; "${ours_cmd[@]}" > "$tmp/$name.ours.$r.json"
    [ "$tokio" = 1 ] && "${tokio_cmd[@]}" > "$tmp/$name.tokio.$r.json"
  else
    [ "$tokio" = 1 ] && "${tokio_cmd[@]}" > "$tmp/$name.tokio.$r.json"
    "${ours_cmd[@]}" > "$tmp/$name.ours.$r.json"; "${fio_cmd[@]}" > "$tmp/$name.fio.$r.json"
  fi
  "${pin[@]}" "$bin" bench io --file "$file" --pattern rand --bs "$bs" --qd "$qd" --seconds "$seconds" \
    --engine pread-pool,std --json > "$tmp/$name.others.$r.json"
  echo "  $name round $r done" >&2
}
IFS=, read -ra want <<< "$cases"
for r in $(seq 1 "$rounds"); do
  for c in "${want[@]}"; do
    case "$c" in
      4k) run_case 4k 4K --bs=4k 32 "$r";;
      128k) run_case 128k 128K --bs=128k 32 "$r";;
      imagenet) run_case imagenet "$imagenet" "--bssplit=${imagenet,,}" 128 "$r";;
      *) echo "unknown case $c" >&2; exit 2;;
    esac
  done
done

python3 - "$tmp" "$rounds" "$cases" "$json_out" "$cpu" "$tokio" <<'PY'
import json, os, sys, statistics as st
tmp, rounds, cases, out, cpu = sys.argv[1], int(sys.argv[2]), sys.argv[3].split(","), sys.argv[4], sys.argv[5]
tokio = sys.argv[6] == "1"
print(f"both tools pinned to CPU {cpu}" if cpu != "none" else "unpinned")
qd = {"4k": 32, "128k": 32, "imagenet": 128}
def fio(path):
    j = json.load(open(path))["jobs"][0]; r = j["read"]
    gib = r["io_bytes"] / 2**30; t = j["job_runtime"] / 1000
    return {"gib_per_s": gib / t, "iops": r["iops"], "cpu_s_per_gib": (j["usr_cpu"] + j["sys_cpu"]) / 100 * t / gib,
            "lat_us_p50": r["clat_ns"]["percentile"]["50.000000"] / 1000}
def lines(path): return [json.loads(l) for l in open(path) if l.strip()]
rows, summary = [], []
hdr = f'{"case":<9} {"qd":>4} {"round":>5} {"fio GiB/s":>10} {"ours GiB/s":>10} {"ratio":>6} {"fio CPU-s/GiB":>13} {"ours CPU-s/GiB":>14} {"ratio":>6}'
print(hdr); print("-" * len(hdr))
for c in cases:
    gr, cr = [], []
    for r in range(1, rounds + 1):
        f = fio(f"{tmp}/{c}.fio.{r}.json"); o = lines(f"{tmp}/{c}.ours.{r}.json")[0]
        g, cp = o["gib_per_s"] / f["gib_per_s"], o["cpu_s_per_gib"] / f["cpu_s_per_gib"]
        gr.append(g); cr.append(cp)
        print(f'{c:<9} {qd[c]:>4} {r:>5} {f["gib_per_s"]:>10.3f} {o["gib_per_s"]:>10.3f} {g:>5.2f}x {f["cpu_s_per_gib"]:>13.3f} {o["cpu_s_per_gib"]:>14.3f} {cp:>5.2f}x')
        row = {"case": c, "round": r, "fio": f, "ours": o, "others": lines(f"{tmp}/{c}.others.{r}.json")}
        if tokio:
            row["tokio"] = lines(f"{tmp}/{c}.tokio.{r}.json")[0]
        rows.append(row)
    summary.append({"case": c, "qd": qd[c], "gib_ratio_mean": st.mean(gr), "gib_ratio_min": min(gr),
                    "cpu_ratio_mean": st.mean(cr), "cpu_ratio_max": max(cr)})
print()
print(f'{"case":<9} {"ours/fio GiB/s (mean, min)":>28} {"ours/fio CPU-s/GiB (mean, max)":>32}')
for s in summary:
    print(f'{s["case"]:<9} {s["gib_ratio_mean"]:>20.2f}x {s["gib_ratio_min"]:>5.2f}x {s["cpu_ratio_mean"]:>24.2f}x {s["cpu_ratio_max"]:>5.2f}x')
print()
print("what io_uring buys (GiB/s, CPU-s/GiB; mean over rounds):")
for c in cases:
    by = {}
    for row in rows:
        if row["case"] != c: continue
        for o in [row["ours"]] + row["others"]:
            by.setdefault(o["engine"], []).append(o)
    parts = []
    for eng, os_ in by.items():
        parts.append(f'{eng} {st.mean(x["gib_per_s"] for x in os_):.3f} ({st.mean(x["cpu_s_per_gib"] for x in os_):.3f})')
    print(f"  {c:<9} " + ", ".join(parts))
if tokio:
    print()
    print("tokio-uring peer (per round: its GiB/s; ours/tokio GiB/s; ours/tokio CPU-s/GiB; tokio/fio GiB/s):")
    for c in cases:
        rs = [row for row in rows if row["case"] == c]
        g = [row["ours"]["gib_per_s"] / row["tokio"]["gib_per_s"] for row in rs]
        cp = [row["ours"]["cpu_s_per_gib"] / row["tokio"]["cpu_s_per_gib"] for row in rs]
        tf = [row["tokio"]["gib_per_s"] / row["fio"]["gib_per_s"] for row in rs]
        print(f"  {c:<9} " + "; ".join(f'{row["tokio"]["gib_per_s"]:.3f} GiB/s, {a:.2f}x, {b:.2f}x, {t:.2f}x' for row, a, b, t in zip(rs, g, cp, tf))
              + f"  | mean ours/tokio {st.mean(g):.2f}x GiB/s at {st.mean(cp):.2f}x CPU")
if out:
    json.dump({"cpu": cpu, "rows": rows, "summary": summary}, open(out, "w"), indent=1)
PY
