#!/usr/bin/env python3
"""MosaicML `streaming` as the peer of `gpufeed bench remote`: the same samples, the same S3
server, shard size and cache limit; epochs read through ``StreamingDataset`` and a torch
``DataLoader``, samples/s and time to first batch per epoch, as JSON lines.

    python scripts/bench-remote-mosaic.py --src DIR_OF_GPF_SHARDS --remote s3://gpufeed/mds20k \
        --cache /tmp/mds-cache --cache-limit 750M --epochs 3 [--workers 2] [--convert]

The samples come from the packed shards in ``--src`` (read with gpufeed, sequentially) and are
written once as MDS shards (``--convert``: MDSWriter, columns ``data: bytes, label: int``,
``--shard-size`` like the gpf shards) and uploaded to ``--remote`` with boto3. Endpoint and keys
are the AWS variables (``scripts/seaweedfs.sh env``); streaming reads ``S3_ENDPOINT_URL``, set
here from ``AWS_ENDPOINT_URL``. The local cache is emptied before the first epoch (cold), as
``gpufeed bench remote`` does.
"""

import argparse
import json
import os
import shutil
import sys
import tempfile
import time


def parse_size(s):
    s = s.strip().upper().rstrip("B").rstrip("I")
    mult = {"K": 1 << 10, "M": 1 << 20, "G": 1 << 30, "T": 1 << 40}
    if s and s[-1] in mult:
        return int(float(s[:-1]) * mult[s[-1]])
    return int(s)


def convert(src, remote, shard_size):
    import boto3
    import numpy as np
    import gpufeed
    from streaming import MDSWriter

    tmp = tempfile.mkdtemp(prefix="mds-")
    ld = gpufeed.Loader(src, batch_size=256, order="sequential")
    n = 0
    with MDSWriter(out=tmp, columns={"data": "bytes", "label": "int"},
                   size_limit=shard_size, compression=None) as w:
        for b in ld:
            data = np.from_dlpack(b.data)
            offs = np.from_dlpack(b.offsets)
            lens = np.from_dlpack(b.lengths)
            labels = np.from_dlpack(b.labels)
            for i in range(len(b)):
                w.write({"data": data[offs[i]:offs[i] + lens[i]].tobytes(), "label": int(labels[i])})
                n += 1
    bucket, _, prefix = remote[len("s3://"):].partition("/")
    s3 = boto3.client("s3", endpoint_url=os.environ.get("AWS_ENDPOINT_URL"))
    for f in sorted(os.listdir(tmp)):
        s3.upload_file(os.path.join(tmp, f), bucket, f"{prefix.rstrip('/')}/{f}")
    shutil.rmtree(tmp)
    return n


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--src")
    ap.add_argument("--remote", required=True)
    ap.add_argument("--cache", required=True)
    ap.add_argument("--cache-limit", default=None)
    ap.add_argument("--epochs", type=int, default=3)
    ap.add_argument("--batch-size", type=int, default=256)
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--shard-size", default="256M")
    ap.add_argument("--convert", action="store_true")
    ap.add_argument("--shuffle-block-size", type=int, default=None,
                    help="streaming's shuffle_block_size (its default spans the whole of a "
                         "small dataset: every shard must be resident at once)")
    a = ap.parse_args()
    if os.environ.get("AWS_ENDPOINT_URL"):
        os.environ.setdefault("S3_ENDPOINT_URL", os.environ["AWS_ENDPOINT_URL"])
    if a.convert:
        n = convert(a.src, a.remote, parse_size(a.shard_size))
        print(json.dumps({"converted": n, "remote": a.remote}), flush=True)

    import torch
    from streaming import StreamingDataset
    from streaming.base.util import clean_stale_shared_memory

    clean_stale_shared_memory()
    shutil.rmtree(a.cache, ignore_errors=True)
    limit = parse_size(a.cache_limit) if a.cache_limit else None
    t_open = time.perf_counter()
    ds = StreamingDataset(remote=a.remote, local=a.cache, shuffle=True, shuffle_seed=1,
                          batch_size=a.batch_size, cache_limit=limit,
                          shuffle_block_size=a.shuffle_block_size)

    def collate(rows):
        return len(rows), sum(len(r["data"]) for r in rows)

    dl = torch.utils.data.DataLoader(ds, batch_size=a.batch_size, num_workers=a.workers,
                                     collate_fn=collate, persistent_workers=a.workers > 0)
    # The open: the dataset made (its index.json fetched), as `gpufeed bench remote` counts it.
    open_s = time.perf_counter() - t_open
    for epoch in range(a.epochs):
        t0 = time.perf_counter()
        first = None
        n = nbytes = 0
        for k, b in dl:
            if first is None:
                first = time.perf_counter() - t0
            n += k
            nbytes += b
        secs = time.perf_counter() - t0
        print(json.dumps({
            "peer": "mosaic-streaming", "epoch": epoch, "samples": n, "seconds": secs,
            "samples_per_s": n / secs, "gib_per_s": nbytes / secs / (1 << 30),
            "first_batch_s": first, "open_s": open_s if epoch == 0 else None,
            "first_batch_from_open_s": open_s + first if epoch == 0 else None,
            "workers": a.workers, "cache_limit": limit,
            "shuffle_block_size": a.shuffle_block_size,
        }), flush=True)


if __name__ == "__main__":
    sys.exit(main())
