#!/usr/bin/env python3
"""Seed corpora for the fuzz targets, written by other tools or by the published layouts
(Python's tarfile; TFRecord framing and tf.train.Example by hand; docs/FORMAT.md shards; the
Megatron .idx layout; real image headers), each behind the mode bytes its target reads.

Usage: seeds.py OUT_DIR   (writes OUT_DIR/<target>/<name>)
"""
import io
import os
import struct
import sys
import tarfile
import zlib


def crc32c(b):
    crc = 0xFFFFFFFF
    for x in b:
        crc ^= x
        for _ in range(8):
            crc = (crc >> 1) ^ (0x82F63B78 if crc & 1 else 0)
    return crc ^ 0xFFFFFFFF


def masked(b):
    c = crc32c(b)
    return (((c >> 15) | (c << 17)) + 0xA282EAD8) & 0xFFFFFFFF


# Images: the first bytes of a JPEG (SOI, APP0, SOF0 4:2:0, SOS, data, EOI), a PNG, WebPs.
JPEG = bytes([0xFF, 0xD8, 0xFF, 0xE0, 0, 16]) + b"JFIF\0\1\1\0\0\1\0\1\0\0" + bytes(
    [0xFF, 0xC0, 0, 17, 8, 0, 32, 0, 48, 3, 1, 0x22, 0, 2, 0x11, 1, 3, 0x11, 1,
     0xFF, 0xDA, 0, 12, 3, 1, 0, 2, 0x11, 3, 0x11, 0, 63, 0, 0x12, 0x34, 0xFF, 0xD9])
PROGRESSIVE = JPEG.replace(bytes([0xFF, 0xC0]), bytes([0xFF, 0xC2]))
ADOBE = JPEG[:2] + bytes([0xFF, 0xEE, 0, 14]) + b"Adobe" + bytes([0, 100, 0, 0, 0, 0, 2]) + JPEG[2:]


def png_bytes(w, h, color):
    def chunk(t, d):
        return struct.pack(">I", len(d)) + t + d + struct.pack(">I", zlib.crc32(t + d))
    raw = b"".join(b"\0" + bytes(w * 3) for _ in range(h))
    return (b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", struct.pack(">IIBBBBB", w, h, 8, color, 0, 0, 0))
            + chunk(b"IDAT", zlib.compress(raw)) + chunk(b"IEND", b""))


PNG = png_bytes(4, 3, 2)
WEBP_LOSSY = b"RIFF" + struct.pack("<I", 22) + b"WEBPVP8 " + struct.pack("<I", 10) + bytes(
    [0x10, 0x02, 0x00, 0x9D, 0x01, 0x2A]) + struct.pack("<HH", 32, 24)
WEBP_LOSSLESS = b"RIFF" + struct.pack("<I", 17) + b"WEBPVP8L" + struct.pack("<I", 5) + bytes(
    [0x2F]) + struct.pack("<I", (31) | (23 << 14))
WEBP_X = b"RIFF" + struct.pack("<I", 22) + b"WEBPVP8X" + struct.pack("<I", 10) + bytes(
    [0x10, 0, 0, 0]) + (31).to_bytes(3, "little") + (23).to_bytes(3, "little")
IMAGES = {"jpeg": JPEG, "progressive": PROGRESSIVE, "adobe": ADOBE, "png": PNG,
          "webp-lossy": WEBP_LOSSY, "webp-lossless": WEBP_LOSSLESS, "webp-x": WEBP_X}


def tars():
    out = {}
    for fmt, name in ((tarfile.PAX_FORMAT, "pax"), (tarfile.GNU_FORMAT, "gnu"),
                      (tarfile.USTAR_FORMAT, "ustar")):
        buf = io.BytesIO()
        with tarfile.open(fileobj=buf, mode="w", format=fmt) as t:
            for i, (kind, img) in enumerate(list(IMAGES.items())[:3]):
                key = f"shard/sample{i:04d}" + ("/" + "x" * 120 if name != "ustar" and i == 1 else "")
                for ext, data in ((".jpg", img), (".cls", str(i).encode())):
                    info = tarfile.TarInfo(key + ext)
                    info.size = len(data)
                    if name == "pax" and i == 2:
                        info.pax_headers = {"comment": "seed"}
                    t.addfile(info, io.BytesIO(data))
        out[name] = buf.getvalue()
    return out


def example(features):
    """A tf.train.Example: Features{map<string, Feature>} by the protobuf wire format."""
    def varint(n):
        b = b""
        while True:
            c = n & 0x7F
            n >>= 7
            if n:
                b += bytes([c | 0x80])
            else:
                return b + bytes([c])

    def ld(field, payload):
        return varint(field << 3 | 2) + varint(len(payload)) + payload

    entries = b""
    for name, value in features.items():
        if isinstance(value, bytes):
            feature = ld(1, ld(1, value))  # bytes_list { value }
        elif isinstance(value, float):
            feature = ld(2, ld(1, struct.pack("<f", value)))  # float_list (packed)
        else:
            feature = ld(3, ld(1, varint(value & (2**64 - 1))))  # int64_list (packed)
        entries += ld(1, ld(1, name.encode()) + ld(2, feature))
    return ld(1, entries)


def record(data):
    head = struct.pack("<Q", len(data))
    return head + struct.pack("<I", masked(head)) + data + struct.pack("<I", masked(data))


def shard(version, flags, samples, align=1):
    data_offset = 64
    data = b""
    entries = b""
    blob = b""
    for key, label, meta, payload, rec in samples:
        data += b"\0" * (-(data_offset + len(data)) % align)
        off = data_offset + len(data)
        data += payload
        entries += struct.pack("<QIIqIHH", off, len(payload), crc32c(payload), label,
                               len(blob), len(key), len(meta))
        blob += key + meta + (rec if flags & 1 else b"")
    index = entries + blob
    index_offset = data_offset + len(data)
    head = struct.pack("<8sHHIQQQQIII", b"GPFSHARD", version, 64, align, len(samples),
                       data_offset, index_offset, len(index), crc32c(index), flags, 0)
    head += struct.pack("<I", crc32c(head))
    return head + data + index


def megatron(sizes, docs, dtype=8, modes=False):
    pointers, at = [], 0
    for s in sizes:
        pointers.append(at)
        at += s * 2 if dtype == 8 else s * 4
    b = b"MMIDIDX\0\0" + struct.pack("<QBQQ", 1, dtype, len(sizes), len(docs))
    b += b"".join(struct.pack("<i", s) for s in sizes)
    b += b"".join(struct.pack("<q", p) for p in pointers)
    b += b"".join(struct.pack("<q", d) for d in docs)
    if modes:
        b += bytes(len(sizes))
    return b, at


def main():
    out = sys.argv[1]
    seeds = {}
    rec = struct.pack("<IIBBBB4x", 32, 48, 1, 1, 3, 0)
    samples = [(b"a/jpeg", 3, b"", JPEG, rec), (b"b/text", -1, b"m", b"not an image", bytes(16))]
    for mode in (0, 7):
        seeds[("shard", f"v1-{mode}")] = bytes([mode]) + shard(1, 0, samples)
        seeds[("shard", f"v2-{mode}")] = bytes([mode]) + shard(2, 1, samples, align=16)
    for name, t in tars().items():
        for mode in (0, 1, 2, 4):
            seeds[("tar", f"{name}-{mode}")] = bytes([mode]) + t
    ex = example({"image/encoded": JPEG, "image/class/label": 7, "image/height": 32,
                  "image/format": b"JPEG", "x": 0.5})
    short = example({"p": b"payload", "l": 1})
    records = record(ex) + record(short) + record(b"raw bytes")
    lines, at = [], 0
    for r in (record(ex), record(short), record(b"raw bytes")):
        lines.append(f"{at} {len(r)}")
        at += len(r)
    idx = ("\n".join(lines) + "\n").encode()
    for mode in (0, 1, 2, 4, 6):
        seeds[("tfrecord", f"records-{mode}")] = bytes([mode]) + records
    seeds[("tfrecord", "indexed")] = bytes([8]) + struct.pack("<H", len(idx)) + idx + records
    for mode in (0, 1, 2, 3):
        seeds[("example", f"imagenet-{mode}")] = bytes([mode & 2]) + ex
        seeds[("example", f"short-{mode}")] = bytes([1 | (mode & 2)]) + short
    for name, (sizes, docs, dtype, modes) in {
        "two": ([5, 3], [0, 1, 2], 8, False),
        "modes": ([4, 4, 4], [0, 3], 4, True),
        "empty": ([], [], 8, False),
    }.items():
        b, bin_size = megatron(sizes, docs, dtype, modes)
        for mode, seq, stride in ((0, 0, 0), (2, 3, 2), (6, 4, 0), (14, 1, 1)):
            seeds[("megatron", f"{name}-{mode}")] = bytes([mode, seq, stride]) + struct.pack(
                "<H", bin_size) + b
    for name, img in IMAGES.items():
        for cut in (0, 128, 255):
            seeds[("image_header", f"{name}-{cut}")] = bytes([cut]) + img
    for i, text in enumerate(["4K", "1.5G", "128KiB", "0", "3t", "imagenet",
                              "2K/1:4K/2:8K/4:16K/8:32K/13:64K/38:128K/33:256K/1", "4K/50:128K",
                              "jpeg,png", "none", "u16", "1024", "yes", "image/encoded", "-1"]):
        for pick in (0, 1, 2 + 3 * (i % 13)):
            seeds[("args", f"{i}-{pick}")] = bytes([pick]) + text.encode()
    for (target, name), b in seeds.items():
        d = os.path.join(out, target)
        os.makedirs(d, exist_ok=True)
        with open(os.path.join(d, name), "wb") as f:
            f.write(b)
    print(f"{len(seeds)} seeds in {out}")


if __name__ == "__main__":
    main()
