#!/usr/bin/env python3
"""Pillow as the independent writer and oracle for gpufeed's decode tests.

  pillow_oracle.py make DIR          writes test JPEGs with Pillow's encoder (every subsampling
                                     Pillow writes, gray, CMYK, progressive, restart markers,
                                     odd sizes, a large image), PNGs (RGB, RGBA, gray, gray +
                                     alpha, palette, interlaced) and WebPs (lossy, lossy with
                                     alpha, lossless) and, for each, NAME.rgb: Pillow's decode
                                     converted to RGB.
  pillow_oracle.py transform CASES   CASES is a JSON list of {"file", "box": [l, t, r, b],
                                     "full": [w, h], "window": [x, y], "out": [w, h], "flip",
                                     "dst"}: Image.open → convert("RGB") → resize(full,
                                     BILINEAR, box) → crop the window (zero beyond the image) →
                                     mirror if flip; writes raw RGB (HWC uint8) to dst.
Pillow's resize is what torchvision's RandomResizedCrop and Resize run on a PIL image.
"""
import io
import json
import os
import sys

import numpy as np
from PIL import Image, JpegImagePlugin


def field(rng, w, h, ch):
    """A smooth random field with texture: decode and resampling errors show on it."""
    gw, gh = w // 12 + 2, h // 12 + 2
    small = rng.integers(0, 256, (gh, gw, ch), dtype=np.uint8)
    mode = "L" if ch == 1 else "RGB"
    img = Image.fromarray(small[:, :, 0] if ch == 1 else small, mode).resize((w, h), Image.BICUBIC)
    a = np.asarray(img).astype(np.int16)
    a = a + rng.integers(-20, 21, a.shape)
    # Some hard edges too.
    a[h // 3: h // 3 + 5] = 255
    a[:, w // 2: w // 2 + 3] = 0
    return np.clip(a, 0, 255).astype(np.uint8)


def make(d):
    os.makedirs(d, exist_ok=True)
    rng = np.random.default_rng(7)
    cases = [
        ("s444", (333, 251), "RGB", dict(subsampling="4:4:4")),
        ("s422", (500, 375), "RGB", dict(subsampling="4:2:2")),
        ("s420", (375, 500), "RGB", dict(subsampling="4:2:0")),
        ("s420_odd", (257, 129), "RGB", dict(subsampling="4:2:0")),
        ("gray", (480, 360), "L", {}),
        ("progressive", (500, 333), "RGB", dict(progressive=True)),
        ("progressive444", (301, 403), "RGB", dict(progressive=True, subsampling="4:4:4")),
        ("restart", (420, 300), "RGB", dict(restart_marker_rows=1)),
        ("restart_blocks", (300, 300), "RGB", dict(restart_marker_blocks=7, subsampling="4:4:4")),
        ("cmyk", (320, 240), "CMYK", {}),
        ("tiny", (7, 5), "RGB", {}),
        ("large", (2048, 1536), "RGB", dict(subsampling="4:2:0")),
        ("q75", (500, 375), "RGB", dict(quality=75)),
    ]
    for name, (w, h), mode, kw in cases:
        a = field(rng, w, h, 1 if mode == "L" else 3)
        img = Image.fromarray(a if mode != "L" else a[:, :, 0] if a.ndim == 3 else a)
        if mode == "CMYK":
            img = img.convert("CMYK")
        elif mode == "L":
            img = img.convert("L")
        kw.setdefault("quality", 90)
        img.save(os.path.join(d, name + ".jpg"), "JPEG", **kw)
    # PNG and WebP, each written by Pillow (zlib, libwebp).
    others = [
        ("png_rgb.png", "RGB", {}),
        ("png_rgba.png", "RGBA", {}),
        ("png_gray.png", "L", {}),
        ("png_gray_alpha.png", "LA", {}),
        ("png_palette.png", "P", {}),
        ("png_interlaced.png", "RGB", dict(interlace=1)),
        ("webp_lossy.webp", "RGB", dict(quality=90)),
        ("webp_lossy_alpha.webp", "RGBA", dict(quality=90)),
        ("webp_lossless.webp", "RGB", dict(lossless=True)),
    ]
    for name, mode, kw in others:
        a = field(rng, 203, 157, 3)
        img = Image.fromarray(a)
        if mode == "RGBA":
            img = img.convert("RGBA")
            img.putalpha(Image.fromarray(field(rng, 203, 157, 1)))
        elif mode == "P":
            img = img.convert("P", palette=Image.ADAPTIVE, colors=64)
        elif mode != "RGB":
            img = img.convert(mode)
        img.save(os.path.join(d, name), **kw)
    for f in sorted(os.listdir(d)):
        if f.endswith((".png", ".webp")):
            with Image.open(os.path.join(d, f)) as im:
                rgb = im.convert("RGB")
                stem = f.rsplit(".", 1)[0]
                with open(os.path.join(d, stem + ".rgb"), "wb") as o:
                    o.write(rgb.tobytes())
                with open(os.path.join(d, stem + ".size"), "w") as o:
                    o.write(f"{rgb.size[0]} {rgb.size[1]}\n")
    for f in sorted(os.listdir(d)):
        if f.endswith(".jpg"):
            with Image.open(os.path.join(d, f)) as im:
                rgb = im.convert("RGB")
                with open(os.path.join(d, f[:-4] + ".rgb"), "wb") as o:
                    o.write(rgb.tobytes())
                with open(os.path.join(d, f[:-4] + ".size"), "w") as o:
                    o.write(f"{rgb.size[0]} {rgb.size[1]}\n")
                # Pillow's view of the header: mode, progressive, subsampling (0 4:4:4,
                # 1 4:2:2, 2 4:2:0, -1 other or gray).
                prog = int(bool(im.info.get("progressive") or im.info.get("progression")))
                samp = JpegImagePlugin.get_sampling(im)
                with open(os.path.join(d, f[:-4] + ".info"), "w") as o:
                    o.write(f"{im.mode} {prog} {samp}\n")


def transform(cases_path):
    for c in json.load(open(cases_path)):
        with Image.open(c["file"]) as im:
            img = im.convert("RGB")
        fw, fh = c["full"]
        img = img.resize((fw, fh), Image.BILINEAR, box=tuple(c["box"]))
        ow, oh = c["out"]
        x, y = c["window"]
        out = np.zeros((oh, ow, 3), dtype=np.uint8)
        a = np.asarray(img)[y:y + oh, x:x + ow]
        out[: a.shape[0], : a.shape[1]] = a
        if c["flip"]:
            out = out[:, ::-1]
        with open(c["dst"], "wb") as o:
            o.write(np.ascontiguousarray(out).tobytes())


if __name__ == "__main__":
    {"make": make, "transform": transform}[sys.argv[1]](sys.argv[2])
