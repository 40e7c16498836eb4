#!/usr/bin/env python3
"""The GPU peer of `gpufeed bench decode --device cuda`: torchvision's own GPU path.

Per batch: the files are read (torchvision.io.read_file), decoded by
torchvision.io.decode_jpeg(list, device=DEVICE) — nvJPEG's batched decode on a GPU — (other
kinds, and CMYK/YCCK JPEGs, which that refuses, by decode_image on the CPU, then moved), then
per image torchvision.transforms.v2 on the device: train = RandomResizedCrop(size, antialias=True) + RandomHorizontalFlip; eval =
Resize(size*8/7, antialias=True) + CenterCrop(size); then to float, /255, Normalize (ImageNet) and
the dtype, stacked into one [N, 3, H, W] tensor; the device is synchronised at the end of each
batch (so the clock sees the work). Files are visited in a seeded shuffle.

Prints one JSON object: images, seconds, cpu_s (user + system of this process), errors,
device. `--device cpu` runs the same code on the CPU (to check the script without a GPU).
"""
import argparse
import json
import os
import random
import resource
import sys
import time

import torch
import torchvision
from torchvision.io import ImageReadMode, decode_image, decode_jpeg, read_file
from torchvision.transforms import v2

EXTS = (".jpg", ".jpeg", ".png", ".webp")


def files_of(root):
    out = []
    for d, _, names in os.walk(root):
        out.extend(os.path.join(d, n) for n in names if n.lower().endswith(EXTS))
    out.sort()
    return out


SOF = {0xC0, 0xC1, 0xC2, 0xC3, 0xC5, 0xC6, 0xC7, 0xC9, 0xCA, 0xCB, 0xCD, 0xCE, 0xCF}


def jpeg_components(data):
    """The component count in a JPEG's frame header (SOF), or None where it is not found in
    the first 64 KiB."""
    b = data[:65536].numpy().tobytes()
    i = 2
    while i + 10 <= len(b):
        if b[i] != 0xFF:
            return None
        m = b[i + 1]
        if m == 0xFF:  # fill byte
            i += 1
            continue
        if m in SOF:
            return b[i + 9]
        i += 2 + ((b[i + 2] << 8) | b[i + 3])
    return None


def cpu_s():
    r = resource.getrusage(resource.RUSAGE_SELF)
    return r.ru_utime + r.ru_stime


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--dir", required=True)
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--mode", choices=["train", "eval"], default="train")
    ap.add_argument("--size", type=int, default=224)
    ap.add_argument("--dtype", default="float16")
    ap.add_argument("--batch", type=int, default=256)
    ap.add_argument("--seed", type=int, default=0)
    a = ap.parse_args()
    dev = torch.device(a.device)
    dtype = {
        "uint8": torch.uint8,
        "float16": torch.float16,
        "bfloat16": torch.bfloat16,
        "float32": torch.float32,
    }[a.dtype]
    if a.mode == "train":
        geo = v2.Compose(
            [v2.RandomResizedCrop(a.size, antialias=True), v2.RandomHorizontalFlip()]
        )
    else:
        geo = v2.Compose(
            [v2.Resize(a.size * 8 // 7, antialias=True), v2.CenterCrop(a.size)]
        )
    norm = v2.Normalize([0.485, 0.456, 0.406], [0.229, 0.224, 0.225])
    files = files_of(a.dir)
    random.Random(a.seed).shuffle(files)
    torch.manual_seed(a.seed)
    # Warm the decoder and the transforms once (CUDA context, nvJPEG handle) outside the clock.
    if files:
        decode_jpeg([read_file(files[0])], device=dev)
    if dev.type == "cuda":
        torch.cuda.synchronize(dev)
    images = errors = 0
    t0, c0 = time.perf_counter(), cpu_s()
    for k in range(0, len(files), a.batch):
        datas = [read_file(f) for f in files[k : k + a.batch]]
        jpegs = [i for i, d in enumerate(datas) if d[:3].tolist() == [0xFF, 0xD8, 0xFF]]
        # CMYK/YCCK JPEGs (4 components), which the GPU decode refuses (one in a batch fails
        # the whole batched call), are decoded on the CPU below, as a careful user would.
        jpegs = [i for i in jpegs if jpeg_components(datas[i]) != 4]
        decoded = [None] * len(datas)
        try:
            for i, img in zip(jpegs, decode_jpeg([datas[i] for i in jpegs], device=dev, mode=ImageReadMode.RGB)):
                decoded[i] = img
        except RuntimeError:
            for i in jpegs:  # a bad file fails the batched call: one at a time
                try:
                    decoded[i] = decode_jpeg(datas[i], device=dev, mode=ImageReadMode.RGB)
                except RuntimeError:
                    errors += 1
        for i, d in enumerate(datas):
            if decoded[i] is None and i not in jpegs:
                try:
                    decoded[i] = decode_image(d, mode=ImageReadMode.RGB).to(dev)
                except RuntimeError:
                    errors += 1
        out = []
        for img in decoded:
            if img is None:
                out.append(torch.zeros(3, a.size, a.size, dtype=dtype, device=dev))
                continue
            x = geo(img)
            if dtype != torch.uint8:
                x = norm(x.to(torch.float32) / 255.0).to(dtype)
            out.append(x)
        batch = torch.stack(out)
        if dev.type == "cuda":
            torch.cuda.synchronize(dev)
        images += batch.shape[0]
    seconds = time.perf_counter() - t0
    print(
        json.dumps(
            {
                "images": images,
                "seconds": seconds,
                "cpu_s": cpu_s() - c0,
                "errors": errors,
                "device": str(dev),
                "torchvision": torchvision.__version__,
            }
        )
    )


if __name__ == "__main__":
    sys.exit(main())
