#!/usr/bin/env python3
"""The peer of `gpufeed bench decode`: the same work as torchvision's CPU transforms do it.

train: Image.open → convert("RGB") → RandomResizedCrop's parameters (scale (0.08, 1), ratio
(3/4, 4/3), ten tries then the centre crop) → crop → resize(BILINEAR: Pillow antialiases on
downscale) → horizontal flip with p = 0.5 → /255, (x − mean) / std in numpy → layout → dtype,
stacked into one array per batch, in `--workers` processes (a DataLoader's workers collate whole
batches the same way). eval: resize of the shorter side (to size·8/7) → centre crop → the same.
decode: Image.open → convert("RGB") → load.

Batches stay in the worker (a DataLoader would ship them to the trainer through shared
memory): the peer is spared that cost. Prints one JSON object: images, seconds, cpu_s (user +
system of this process and its workers), errors.
"""
import argparse
import json
import math
import multiprocessing as mp
import os
import random
import resource
import sys
import time

import numpy as np
from PIL import Image

MEAN = np.array([0.485, 0.456, 0.406], dtype=np.float32)
STD = np.array([0.229, 0.224, 0.225], dtype=np.float32)
ARGS = None


def rrc_params(rng, width, height, scale=(0.08, 1.0), ratio=(3 / 4, 4 / 3)):
    area = width * height
    log_ratio = (math.log(ratio[0]), math.log(ratio[1]))
    for _ in range(10):
        target_area = area * rng.uniform(scale[0], scale[1])
        aspect = math.exp(rng.uniform(*log_ratio))
        w = int(round(math.sqrt(target_area * aspect)))
        h = int(round(math.sqrt(target_area / aspect)))
        if 0 < w <= width and 0 < h <= height:
            i = rng.randint(0, height - h)
            j = rng.randint(0, width - w)
            return i, j, h, w
    in_ratio = width / height
    if in_ratio < min(ratio):
        w = width
        h = int(round(w / min(ratio)))
    elif in_ratio > max(ratio):
        h = height
        w = int(round(h * max(ratio)))
    else:
        w, h = width, height
    return (height - h) // 2, (width - w) // 2, h, w


def to_array(img):
    if ARGS.dtype == "uint8":
        x = np.asarray(img, dtype=np.uint8)
    else:
        x = ((np.asarray(img, dtype=np.float32) / 255.0 - MEAN) / STD).astype(ARGS.dtype)
    return np.ascontiguousarray(x.transpose(2, 0, 1)) if ARGS.layout == "nchw" else x


def one(path, rng):
    img = Image.open(path).convert("RGB")
    s = ARGS.size
    if ARGS.mode == "decode":
        img.load()
        return None
    if ARGS.mode == "train":
        i, j, h, w = rrc_params(rng, *img.size)
        img = img.crop((j, i, j + w, i + h)).resize((s, s), Image.BILINEAR)
        if rng.random() < 0.5:
            img = img.transpose(Image.FLIP_LEFT_RIGHT)
    else:
        resize = s * 8 // 7
        w, h = img.size
        if w <= h:
            nw, nh = resize, int(resize * h / w)
        else:
            nw, nh = int(resize * w / h), resize
        img = img.resize((nw, nh), Image.BILINEAR)
        top = int(round((nh - s) / 2.0))
        left = int(round((nw - s) / 2.0))
        img = img.crop((left, top, left + s, top + s))
    return to_array(img)


def work(chunk):
    k, paths = chunk
    rng = random.Random(ARGS.seed * 1_000_003 + k)
    arrays, errors = [], 0
    for p in paths:
        try:
            a = one(p, rng)
        except Exception:
            errors += 1
            continue
        if a is not None:
            arrays.append(a)
    if arrays:
        np.stack(arrays)  # the collate a DataLoader worker does
    return len(paths), errors


def init(args):
    global ARGS
    ARGS = args


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--dir", required=True)
    ap.add_argument("--mode", choices=["train", "eval", "decode"], default="train")
    ap.add_argument("--workers", type=int, default=1)
    ap.add_argument("--size", type=int, default=224)
    ap.add_argument("--dtype", default="float16", choices=["uint8", "float16", "float32", "bfloat16"])
    ap.add_argument("--layout", default="nchw", choices=["nchw", "nhwc"])
    ap.add_argument("--batch", type=int, default=128)
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args()
    if args.dtype == "bfloat16":
        args.dtype = "float32"  # numpy has no bfloat16: the nearest work
    paths = []
    for root, _, files in os.walk(args.dir):
        paths += [os.path.join(root, f) for f in files if not f.startswith(".")]
    paths.sort()
    random.Random(args.seed).shuffle(paths)
    chunks = [(k, paths[i:i + args.batch]) for k, i in enumerate(range(0, len(paths), args.batch))]
    t0, c0 = time.perf_counter(), time.process_time()
    images = errors = 0
    with mp.get_context("fork").Pool(args.workers, initializer=init, initargs=(args,)) as pool:
        for n, e in pool.imap_unordered(work, chunks):
            images += n
            errors += e
        pool.close()
        pool.join()
    seconds = time.perf_counter() - t0
    ch = resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu = time.process_time() - c0 + ch.ru_utime + ch.ru_stime
    print(json.dumps({"images": images, "seconds": seconds, "cpu_s": cpu, "errors": errors}))


if __name__ == "__main__":
    sys.exit(main())
