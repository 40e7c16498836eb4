#!/usr/bin/env python3
"""One pass of decoded images through the Python loader with one decode thread (the old
default on 2 cores) and with the default (the cores / LOCAL_WORLD_SIZE), alternated.

    python scripts/bench-decode-threads.py DIR [--rounds 4] [--batch 128]

DIR is an ImageFolder of JPEGs (``gpufeed bench decode --dir DIR`` generates one).
"""

import argparse
import statistics
import time

import numpy as np

import gpufeed


def main():
    p = argparse.ArgumentParser()
    p.add_argument("dir")
    p.add_argument("--rounds", type=int, default=4)
    p.add_argument("--batch", type=int, default=128)
    args = p.parse_args()
    rows = {"threads=1": 1, "default": 0}
    res = {k: [] for k in rows}
    for r in range(args.rounds):
        for name, threads in rows.items():
            images = gpufeed.Images("train", size=224, dtype="float16", threads=threads)
            ld = gpufeed.Loader(args.dir, batch_size=args.batch, images=images)
            ld.set_epoch(r)
            t, n = time.perf_counter(), 0
            for b in ld:
                n += np.from_dlpack(b.images).shape[0]
            res[name].append(n / (time.perf_counter() - t))
            print(f"round {r} {name} ({ld.decode_threads} threads): {res[name][-1]:.0f} images/s",
                  flush=True)
    for k, v in res.items():
        print(f"{k}: median {statistics.median(v):.0f} images/s ({min(v):.0f}-{max(v):.0f})")
    print(f"default / threads=1: {statistics.median(res['default']) / statistics.median(res['threads=1']):.2f}")


if __name__ == "__main__":
    main()
