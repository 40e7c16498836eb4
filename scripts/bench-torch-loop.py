#!/usr/bin/env python3
"""A PyTorch user's training input loop three ways, side by side: gpufeed's direct loop
(``gpufeed.torch.batches``), gpufeed through a ``DataLoader`` with spawn-started workers
(``gpufeed.torch.IterableDataset``) and torchvision's ``ImageFolder`` + ``DataLoader`` — images/s
and CPU-seconds per 1000 images (the process and every worker it started), alternated over
rounds, each run in a fresh process.

    python scripts/bench-torch-loop.py --dir /nvme/torch-loop --images 2000 --rounds 3 [--json]

Each row decodes an epoch of the ImageFolder at DIR (made there if missing: JPEGs of 500x375,
ImageNet's typical size, q90, in 10 class folders) with the training transform to 224x224
(RandomResizedCrop + RandomHorizontalFlip + Normalize; gpufeed float16, torchvision float32 as
its ToTensor gives) in batches of 64, and touches each batch as a training step would begin to.
"CPU" is user + system time of the process and its reaped children, from the start of the
first epoch to the end of the last (``--epochs``, one process): a DataLoader's workers are
started, and joined, inside each epoch — their start-up (spawn, importing torch) is part of
every epoch — unless ``persistent_workers`` (the ``-persistent`` rows) keeps them for the run. Page caches are left warm (decode, not I/O,
is what is compared).
"""

import argparse
import json
import os
import resource
import statistics
import subprocess
import sys
import time

SIZE, BATCH = 224, 64


def cpu_s():
    s = resource.getrusage(resource.RUSAGE_SELF)
    c = resource.getrusage(resource.RUSAGE_CHILDREN)
    return s.ru_utime + s.ru_stime + c.ru_utime + c.ru_stime


def make(root, n):
    mark = os.path.join(root, f".complete-{n}")
    if os.path.exists(mark):
        return
    import numpy as np
    from PIL import Image

    rng = np.random.default_rng(0)
    yy, xx = np.mgrid[0:375, 0:500]
    for i in range(n):
        d = os.path.join(root, f"class{i % 10:02d}")
        os.makedirs(d, exist_ok=True)
        f = rng.uniform(0.005, 0.03, 3)
        base = np.stack([127 + 100 * np.sin(xx * f[c] + yy * f[(c + 1) % 3] + i) for c in range(3)], -1)
        px = np.clip(base + rng.normal(0, 12, base.shape), 0, 255).astype(np.uint8)
        Image.fromarray(px).save(os.path.join(d, f"{i:06d}.jpg"), quality=90)
    open(mark, "w").close()


def run(mode, root, workers, epochs):
    import gc

    import torch

    t0, c0 = time.perf_counter(), cpu_s()
    images = 0
    touched = 0.0
    persistent = mode.endswith("-persistent")
    if mode.startswith(("direct", "dataloader")):
        import gpufeed
        import gpufeed.torch as gt

        loader = gpufeed.Loader(root, batch_size=BATCH, order="global", seed=1,
                                images=gpufeed.Images("train", SIZE, dtype=torch.float16))
        ds = gt.IterableDataset(loader)
        dl = torch.utils.data.DataLoader(ds, batch_size=None, num_workers=workers,
                                         multiprocessing_context="spawn",
                                         persistent_workers=persistent)
        for e in range(epochs):
            if mode == "direct":
                loader.set_epoch(e)
                it = gt.batches(loader)
            else:
                ds.set_epoch(e)
                it = iter(dl)
            for b in it:
                x = b.images
                touched += float(x[0, 0, 0, 0])
                images += x.shape[0]
            del it  # a DataLoader's (non-persistent) workers are joined and reaped here
    else:
        import torchvision
        from torchvision import transforms as T

        tf = T.Compose([T.RandomResizedCrop(SIZE), T.RandomHorizontalFlip(), T.ToTensor(),
                        T.Normalize([0.485, 0.456, 0.406], [0.229, 0.224, 0.225])])
        folder = torchvision.datasets.ImageFolder(root, transform=tf)
        dl = torch.utils.data.DataLoader(folder, batch_size=BATCH, shuffle=True,
                                         num_workers=workers, persistent_workers=persistent)
        for _ in range(epochs):
            for x, _ in dl:
                touched += float(x[0, 0, 0, 0])
                images += x.shape[0]
    del dl  # persistent workers are joined and reaped here
    gc.collect()
    seconds, cpu = time.perf_counter() - t0, cpu_s() - c0
    print(json.dumps({"mode": mode, "images": images, "seconds": seconds, "cpu_s": cpu}))


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--dir", default="/tmp/gpufeed-torch-loop")
    ap.add_argument("--images", type=int, default=2000)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--workers", type=int, default=2, help="DataLoader workers")
    ap.add_argument("--epochs", type=int, default=1, help="epochs in each run (one process)")
    ap.add_argument("--modes", default="direct,dataloader,dataloader-persistent,torchvision",
                    help="direct, dataloader, dataloader-persistent, torchvision, "
                         "torchvision-persistent")
    ap.add_argument("--json", action="store_true")
    ap.add_argument("--run", help=argparse.SUPPRESS)
    a = ap.parse_args()
    if a.run:
        return run(a.run, a.dir, a.workers, a.epochs)
    make(a.dir, a.images)
    modes = a.modes.split(",")
    rows = {m: [] for m in modes}
    for r in range(a.rounds):
        for m in modes:
            out = subprocess.run([sys.executable, __file__, "--dir", a.dir, "--workers",
                                  str(a.workers), "--epochs", str(a.epochs), "--run", m],
                                 check=True, capture_output=True, text=True)
            row = json.loads(out.stdout.strip().splitlines()[-1])
            row["round"] = r
            rows[m].append(row)
            if a.json:
                print(json.dumps(row), flush=True)
    if a.json:
        return 0
    base = statistics.median(x["cpu_s"] / x["images"] for x in rows[modes[0]])
    print(f"{'mode':12} {'images/s (each round)':32} {'CPU-s/1000 img':16} {'CPU vs ' + modes[0]}")
    for m in modes:
        rates = [x["images"] / x["seconds"] for x in rows[m]]
        cpu = statistics.median(x["cpu_s"] / x["images"] for x in rows[m])
        print(f"{m:12} {' '.join(f'{v:7.0f}' for v in rates):32} {1000 * cpu:16.2f} "
              f"{cpu / base:.2f}x")
    return 0


if __name__ == "__main__":
    sys.exit(main())
