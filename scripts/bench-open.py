#!/usr/bin/env python3
"""Time to open an ImageFolder: ``gpufeed.Loader(root, ...)`` against torchvision's
``datasets.ImageFolder(root)``, cold (page cache, dentries and inodes dropped: root only) and warm,
alternated round by round in one run.

    python scripts/bench-open.py --dir /nvme/open-bench --files 10000,100000 --rounds 3 [--json]

Makes ``DIR/N/`` with N small files in 1000 class folders (JPEG magic, 2-6 KB) unless present.
torchvision lists each class folder and filters names by extension (no stat, no read);
gpufeed also needs each file's size for its index (a statx per file) and builds its arena.
Rows: median seconds over the rounds and the ratio to torchvision's in the same condition.
"""

import argparse
import json
import os
import statistics
import subprocess
import sys
import time


def make(root, n, classes=1000):
    mark = os.path.join(root, f".complete-{n}")
    if os.path.exists(mark):
        return
    rnd = os.urandom(6000)
    for i in range(n):
        d = os.path.join(root, f"n{i % classes:05d}")
        if i < classes:
            os.makedirs(d, exist_ok=True)
        size = 2000 + (i * 7919) % 4000
        with open(os.path.join(d, f"{i:08d}.JPEG"), "wb") as f:
            f.write(b"\xff\xd8\xff\xe0" + rnd[: size - 6] + b"\xff\xd9")
    open(mark, "w").close()


def drop_caches():
    subprocess.run(["sync"], check=True)
    with open("/proc/sys/vm/drop_caches", "w") as f:
        f.write("3\n")


# Each measurement runs in a fresh process (imports done, and the library's code paged in by
# opening a two-file folder, before the clock starts), so "cold" is the dataset's metadata, not
# the library's code, and one library's caches or threads do not help the other.
SNIPPET = {
    "torchvision": (
        "import time, sys, torchvision\n"
        "torchvision.datasets.ImageFolder(sys.argv[2])\n"
        "t = time.perf_counter(); ds = torchvision.datasets.ImageFolder(sys.argv[1])\n"
        "print(time.perf_counter() - t, len(ds))\n"
    ),
    "gpufeed": (
        "import time, sys, gpufeed\n"
        "gpufeed.Loader(sys.argv[2], batch_size=256)\n"
        "t = time.perf_counter(); ld = gpufeed.Loader(sys.argv[1], batch_size=256)\n"
        "print(time.perf_counter() - t, ld.num_samples)\n"
    ),
    "gpufeed+images": (
        "import time, sys, gpufeed\n"
        "gpufeed.Loader(sys.argv[2], batch_size=256, images=gpufeed.Images('train'))\n"
        "t = time.perf_counter()\n"
        "ld = gpufeed.Loader(sys.argv[1], batch_size=256, images=gpufeed.Images('train'))\n"
        "print(time.perf_counter() - t, ld.num_samples)\n"
    ),
}


def measure(tool, root, warmup):
    env = dict(os.environ, GPUFEED_QUIET="1")
    out = subprocess.run([sys.executable, "-c", SNIPPET[tool], root, warmup], check=True,
                         capture_output=True, text=True, env=env).stdout.split()
    return float(out[0]), int(out[1])


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--dir", required=True)
    p.add_argument("--files", default="10000,100000")
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--json", action="store_true")
    args = p.parse_args()
    cold_ok = os.geteuid() == 0
    if not cold_ok:
        print("not root: warm runs only (cold needs /proc/sys/vm/drop_caches)", file=sys.stderr)
    warmup = os.path.join(args.dir, "warmup")
    make(warmup, 2, classes=2)
    rows = []
    for n in (int(x) for x in args.files.split(",")):
        root = os.path.join(args.dir, str(n))
        make(root, n)
        for state in (["cold"] if cold_ok else []) + ["warm"]:
            times = {t: [] for t in SNIPPET}
            for _ in range(args.rounds):
                for tool in SNIPPET:
                    if state == "cold":
                        drop_caches()
                    else:
                        measure(tool, root, warmup)  # warm the caches first
                    s, count = measure(tool, root, warmup)
                    assert count == n, (tool, count, n)
                    times[tool].append(s)
            base = statistics.median(times["torchvision"])
            for tool, ts in times.items():
                m = statistics.median(ts)
                rows.append({"files": n, "cache": state, "tool": tool, "seconds": m,
                             "runs": ts, "vs_torchvision": m / base})
    if args.json:
        print(json.dumps(rows))
        return
    print(f"{'files':>8} {'cache':>5} {'tool':<16} {'median s':>9} {'x torchvision':>14}")
    for r in rows:
        print(f"{r['files']:>8} {r['cache']:>5} {r['tool']:<16} {r['seconds']:>9.3f} "
              f"{r['vs_torchvision']:>14.2f}")


if __name__ == "__main__":
    main()
