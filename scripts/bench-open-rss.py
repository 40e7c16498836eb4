#!/usr/bin/env python3
"""What opening a dataset costs a rank: anonymous (private) and file-backed (node-shared) RSS
that a ``gpufeed.Loader(ROOT, batch_size=32)`` adds, and its wall time, each open in a fresh
process — above the same for a small dataset (``--small``: what does not grow with the files).

    python scripts/bench-open-rss.py ROOT --small SMALL_ROOT [--rounds 3] [--cold] [--json]

Run it with the interpreter of each build to compare (a venv per wheel), alternating. The first
open of a large dataset builds the node's kept index (``$GPUFEED_INDEX_DIR``); later ones map
it: each round is printed, with whether the open read a kept index (``node_index``).
``--cold`` drops the page cache, dentries and inodes before each open (root only).
``--ranks N`` instead opens ROOT and SMALL in N processes at once (as the ranks of a node do),
each holding its loader, and prints the PSS they hold summed (``/proc/PID/smaps_rollup``): an
index the node shares counts once.
"""

import argparse
import json
import subprocess
import sys

SNIPPET = """
import gc, json, sys, time
def rss():
    d = {}
    for line in open('/proc/self/status'):
        k = line.split(':')[0]
        if k in ('RssAnon', 'RssFile'):
            d[k] = int(line.split()[1]) / 1024
    return d
import gpufeed
gpufeed.Loader(sys.argv[2], batch_size=32)  # the library's code paged in
gc.collect()
a = rss()
t = time.perf_counter()
ld = gpufeed.Loader(sys.argv[1], batch_size=32)
s = time.perf_counter() - t
gc.collect()
b = rss()
print(json.dumps({'samples': ld.num_samples, 'seconds': s,
                  'anon_mib': b['RssAnon'] - a['RssAnon'], 'file_mib': b['RssFile'] - a['RssFile']}))
"""


def one(root, small, cold):
    if cold:
        subprocess.run(["sync"], check=True)
        with open("/proc/sys/vm/drop_caches", "w") as f:
            f.write("3\n")
    out = subprocess.run([sys.executable, "-c", SNIPPET, root, small], check=True,
                         capture_output=True, text=True).stdout
    return json.loads(out.strip().splitlines()[-1])


RANK = """
import gpufeed, sys, time
ld = gpufeed.Loader(sys.argv[1], batch_size=32)
print(ld.num_samples, flush=True)
time.sleep(600)
"""


def ranks(root, n):
    """PSS (MiB) of `n` processes that each opened `root` and hold it: total, anon, file."""
    ps = [subprocess.Popen([sys.executable, "-c", RANK, root], stdout=subprocess.PIPE,
                           text=True) for _ in range(n)]
    try:
        for p in ps:
            if not p.stdout.readline():
                raise SystemExit(f"a rank failed to open {root}")
        tot = {"Pss": 0.0, "Pss_Anon": 0.0, "Pss_File": 0.0}
        for p in ps:
            for line in open(f"/proc/{p.pid}/smaps_rollup"):
                k = line.split(":")[0]
                if k in tot:
                    tot[k] += int(line.split()[1]) / 1024
        return tot
    finally:
        for p in ps:
            p.kill()
            p.wait()


def main():
    p = argparse.ArgumentParser()
    p.add_argument("root")
    p.add_argument("--small", required=True)
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--cold", action="store_true")
    p.add_argument("--json", action="store_true")
    p.add_argument("--ranks", type=int, default=0)
    a = p.parse_args()
    if a.ranks:
        big, small = ranks(a.root, a.ranks), ranks(a.small, a.ranks)
        row = {"ranks": a.ranks, "pss_mib": big, "pss_mib_small": small,
               "pss_mib_above_small": {k: big[k] - small[k] for k in big}}
        print(json.dumps(row) if a.json else
              f"{a.ranks} ranks: PSS {big['Pss']:.1f} MiB (anon {big['Pss_Anon']:.1f}, file "
              f"{big['Pss_File']:.1f}); the small set {small['Pss']:.1f}; above it "
              f"{big['Pss'] - small['Pss']:.1f} MiB")
        return
    rows = []
    for r in range(a.rounds):
        big, small = one(a.root, a.small, a.cold), one(a.small, a.small, a.cold)
        n = big["samples"] - small["samples"]
        rows.append(big | {"round": r, "anon_bytes_per_sample_above_small":
                           (big["anon_mib"] - small["anon_mib"]) * 2**20 / n,
                           "file_bytes_per_sample_above_small":
                           (big["file_mib"] - small["file_mib"]) * 2**20 / n})
    if a.json:
        print(json.dumps(rows))
        return
    for x in rows:
        print(f"round {x['round']}: {x['samples']} samples, open {x['seconds']:.3f} s, "
              f"anon +{x['anon_mib']:.2f} MiB ({x['anon_bytes_per_sample_above_small']:.1f} B/sample "
              f"above the small set), file +{x['file_mib']:.2f} MiB "
              f"({x['file_bytes_per_sample_above_small']:.1f} B/sample)")


if __name__ == "__main__":
    main()
