#!/usr/bin/env python3
"""One epoch of the same dataset through gpufeed's Python loader, gpufeed's Rust loader
(`gpufeed bench load`) and, where torch is installed, torch.utils.data.DataLoader over the
ImageFolder copy: samples/s and CPU-seconds per GiB, side by side, alternated over rounds.

    scripts/bench-python.py --dir /nvme/gpufeed-load --samples 50000 --rounds 3
    scripts/bench-python.py --device cuda          # batches to GPU memory (raw bytes)

The dataset is `gpufeed bench load`'s (DIR/small: ImageFolder; DIR/packed: shards), generated
by it when missing. Page caches are dropped before each epoch when running as root (otherwise
the output says the cache was warm). Each row consumes every batch the way a training loop
would start to: a view of the batch's bytes plus one byte read per sample (no decode).
"""

import argparse
import json
import os
import resource
import subprocess
import sys
import time


def cpu_seconds():
    r = resource.getrusage(resource.RUSAGE_SELF)
    return r.ru_utime + r.ru_stime


def children_cpu_seconds():
    r = resource.getrusage(resource.RUSAGE_CHILDREN)
    return r.ru_utime + r.ru_stime


def drop_caches():
    try:
        os.sync()
        with open("/proc/sys/vm/drop_caches", "w") as f:
            f.write("3")
        return True
    except OSError:
        return False


def row(mode, samples, nbytes, seconds, cpu, cold, extra=""):
    gib = nbytes / (1 << 30)
    return {
        "mode": mode,
        "samples": samples,
        "seconds": seconds,
        "samples_per_s": samples / seconds,
        "gib_per_s": gib / seconds,
        "cpu_s_per_gib": cpu / gib if gib else float("nan"),
        "cold_cache": cold,
        "detail": extra,
    }


def run_python(packed, args):
    import numpy as np

    import gpufeed

    loader = gpufeed.Loader(
        packed,
        batch_size=args.batch,
        order="global",
        seed=args.seed,
        device=args.device,
        queue_depth=args.qd,
    )
    torch = None
    if args.device != "cpu":
        import torch  # noqa: F811
    cold = drop_caches()
    c0, t0 = cpu_seconds(), time.perf_counter()
    samples = nbytes = 0
    touched = 0
    for b in loader:
        lengths = np.from_dlpack(b.lengths)
        if torch is None:
            data = np.from_dlpack(b.data)
            offsets = np.from_dlpack(b.offsets)
            touched += int(data[offsets + lengths // 2].sum())
        else:
            data = torch.from_dlpack(b.data)  # the current stream waits for the copy
            touched += data.numel()
        samples += len(lengths)
        nbytes += int(lengths.sum())
    if torch is not None:
        torch.cuda.synchronize()
    seconds, cpu = time.perf_counter() - t0, cpu_seconds() - c0
    return row("gpufeed-python", samples, nbytes, seconds, cpu, cold, f"device={args.device}")


def run_rust(args):
    out = subprocess.run(
        [args.gpufeed, "bench", "load", "--dir", args.dir, "--samples", str(args.samples),
         "--modes", "global", "--batch", str(args.batch), "--qd", str(args.qd),
         "--seed", str(args.seed), "--json"],
        check=True, capture_output=True, text=True,
    )
    r = json.loads(out.stdout.strip().splitlines()[-1])
    return {
        "mode": "gpufeed-rust",
        "samples": r["samples"],
        "seconds": r["seconds"],
        "samples_per_s": r["samples_per_s"],
        "gib_per_s": r["gib_per_s"],
        "cpu_s_per_gib": r["cpu_s_per_gib"],
        "cold_cache": r["cold_cache"],
        "detail": "gpufeed bench load --modes global (host)",
    }


def run_torch(small, args):
    import torch
    from torch.utils.data import DataLoader, Dataset

    files = []
    for c in sorted(os.listdir(small)):
        d = os.path.join(small, c)
        if os.path.isdir(d):
            files.extend(os.path.join(d, f) for f in sorted(os.listdir(d)))

    class Raw(Dataset):
        def __len__(self):
            return len(files)

        def __getitem__(self, i):
            with open(files[i], "rb") as f:
                return torch.frombuffer(bytearray(f.read()), dtype=torch.uint8)

    def collate(items):
        lengths = torch.tensor([len(t) for t in items], dtype=torch.int64)
        return torch.cat(items), lengths

    gpu = args.device != "cpu"
    g = torch.Generator()
    g.manual_seed(args.seed)
    dl = DataLoader(
        Raw(), batch_size=args.batch, shuffle=True, generator=g,
        num_workers=os.cpu_count(), pin_memory=gpu, collate_fn=collate,
        persistent_workers=False, prefetch_factor=4,
    )
    cold = drop_caches()
    c0, cc0, t0 = cpu_seconds(), children_cpu_seconds(), time.perf_counter()
    samples = nbytes = touched = 0
    for data, lengths in dl:
        if gpu:
            data = data.to(args.device, non_blocking=True)
        touched += int(lengths.sum())
        samples += len(lengths)
        nbytes += int(lengths.sum())
    if gpu:
        torch.cuda.synchronize()
    seconds = time.perf_counter() - t0
    # Worker processes are children: count their CPU too (they have exited by now).
    cpu = (cpu_seconds() - c0) + (children_cpu_seconds() - cc0)
    return row("torch-dataloader", samples, nbytes, seconds, cpu, cold,
               f"ImageFolder raw bytes, {os.cpu_count()} workers, pin_memory={gpu}")


def main():
    here = os.path.dirname(os.path.abspath(__file__))
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--dir", default="gpufeed-load")
    p.add_argument("--samples", type=int, default=50000)
    p.add_argument("--batch", type=int, default=256)
    p.add_argument("--qd", type=int, default=128)
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--device", default="cpu")
    p.add_argument("--gpufeed", default=os.path.join(here, "..", "target", "release", "gpufeed"))
    p.add_argument("--modes", default="python,rust,torch")
    p.add_argument("--json", action="store_true")
    args = p.parse_args()
    modes = args.modes.split(",")
    if "torch" in modes:
        try:
            import torch  # noqa: F401
        except ImportError:
            print("torch is not installed: no DataLoader row", file=sys.stderr)
            modes.remove("torch")
    # Make the dataset (and its packed copy) if missing.
    subprocess.run(
        [args.gpufeed, "bench", "load", "--dir", args.dir, "--samples", str(args.samples),
         "--modes", "io", "--json"],
        check=True, capture_output=True,
    )
    small, packed = os.path.join(args.dir, "small"), os.path.join(args.dir, "packed")
    rows = []
    for r in range(args.rounds):
        # Alternate the order of the rows between rounds, so neither always runs first.
        for m in (modes if r % 2 == 0 else modes[::-1]):
            if m == "python":
                x = run_python(packed, args)
            elif m == "rust":
                x = run_rust(args)
            else:
                x = run_torch(small, args)
            x["round"] = r + 1
            rows.append(x)
            if args.json:
                print(json.dumps(x), flush=True)
            else:
                print(f"round {r + 1} {x['mode']:<17} {x['samples_per_s']:>9.0f} samples/s "
                      f"{x['gib_per_s']:>6.3f} GiB/s {x['cpu_s_per_gib']:>7.3f} CPU-s/GiB "
                      f"cold={x['cold_cache']}  {x['detail']}", flush=True)
    if not args.json:
        for r in range(args.rounds):
            got = {x["mode"]: x for x in rows if x["round"] == r + 1}
            py = got.get("gpufeed-python")
            parts = []
            if py and "gpufeed-rust" in got:
                parts.append(f"python/rust = {py['samples_per_s'] / got['gpufeed-rust']['samples_per_s']:.3f}x samples/s")
            if py and "torch-dataloader" in got:
                t = got["torch-dataloader"]
                parts.append(f"python/torch = {py['samples_per_s'] / t['samples_per_s']:.2f}x samples/s "
                             f"at {py['cpu_s_per_gib'] / t['cpu_s_per_gib']:.2f}x CPU-s/GiB")
            print(f"round {r + 1}: " + "; ".join(parts))


if __name__ == "__main__":
    main()
