#!/usr/bin/env python3
"""Lightning `litdata` as the peer of `gpufeed bench remote`: the same samples, the same S3
server, chunk size and cache limit; epochs read through ``litdata.StreamingDataset`` and its
``StreamingDataLoader``, samples/s and time to first batch per epoch, as JSON lines.

    python scripts/bench-remote-litdata.py --src DIR_OF_GPF_SHARDS --remote s3://gpufeed/ld20k \
        --cache /tmp/ld-cache --cache-limit 750M --epochs 3 [--workers 2] [--convert]

``--convert`` reads the packed shards in ``--src`` with gpufeed (sequentially), writes them once
as litdata chunks (``BinaryWriter``, items ``{"data": bytes, "label": int}``, ``--chunk-size``
bytes per chunk like the gpf shards) and uploads them to ``--remote`` with boto3. Endpoint and
keys are the AWS variables (``scripts/seaweedfs.sh env``); litdata is handed the endpoint as
``storage_options={"endpoint_url": ...}``, which its downloaders pass to boto3/obstore (for an
``http://`` endpoint its obstore client options get ``allow_http``, which it offers no setting
for). The local
cache is emptied before the first epoch (cold), as ``gpufeed bench remote`` does.
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


def convert(src, remote, chunk_bytes):
    import boto3
    import numpy as np
    import gpufeed
    from litdata.streaming.writer import BinaryWriter

    tmp = tempfile.mkdtemp(prefix="litdata-")
    w = BinaryWriter(tmp, chunk_bytes=chunk_bytes)
    ld = gpufeed.Loader(src, batch_size=256, order="sequential")
    n = 0
    for b in ld:
        data = np.from_dlpack(b.data)
        offs = np.from_dlpack(b.offsets)
        lens = np.from_dlpack(b.lengths)
        labels = np.from_dlpack(b.labels)
        for i in range(len(b)):
            w.add_item(n, {"data": data[offs[i]:offs[i] + lens[i]].tobytes(),
                           "label": int(labels[i])})
            n += 1
    w.done()
    w.merge()
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
    ap.add_argument("--chunk-size", default="64M")
    ap.add_argument("--convert", action="store_true")
    a = ap.parse_args()
    if a.convert:
        n = convert(a.src, a.remote, parse_size(a.chunk_size))
        print(json.dumps({"converted": n, "remote": a.remote}), flush=True)

    from litdata import StreamingDataLoader, StreamingDataset

    shutil.rmtree(a.cache, ignore_errors=True)
    os.makedirs(a.cache)
    limit = parse_size(a.cache_limit) if a.cache_limit else None
    opts = {}
    if os.environ.get("AWS_ENDPOINT_URL"):
        opts["endpoint_url"] = os.environ["AWS_ENDPOINT_URL"]
    if opts.get("endpoint_url", "").startswith("http://"):
        # litdata's fast path (obstore) builds its S3 client with fixed client options that
        # refuse plain http and exposes no setting for it; a loopback server speaks http.
        import litdata.streaming.downloader as dl_mod
        dl_mod._OBSTORE_CLIENT_OPTIONS = {**dl_mod._OBSTORE_CLIENT_OPTIONS, "allow_http": "true"}
    kw = {"max_cache_size": limit} if limit else {}
    ds = StreamingDataset(input_dir=a.remote, cache_dir=a.cache, shuffle=True, seed=1,
                          storage_options=opts, **kw)

    def collate(rows):
        return len(rows), sum(len(r["data"]) for r in rows)

    dl = StreamingDataLoader(ds, batch_size=a.batch_size, num_workers=a.workers,
                             collate_fn=collate, persistent_workers=a.workers > 0)
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
            "peer": "litdata", "epoch": epoch, "samples": n, "seconds": secs,
            "samples_per_s": n / secs, "gib_per_s": nbytes / secs / (1 << 30),
            "first_batch_s": first, "workers": a.workers, "cache_limit": limit,
        }), flush=True)


if __name__ == "__main__":
    sys.exit(main())
