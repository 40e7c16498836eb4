"""Writes an ImageNet-style TFRecord set with the ``tfrecord`` package (PyPI), laid out as
TensorFlow's ``build_imagenet_data.py`` lays it out: shards named ``train-00000-of-00002`` (no
extension), one ``tf.train.Example`` per image with the converter's features (``image/encoded``
JPEG bytes, ``image/class/label`` 1..1000, height, width, colorspace, synset, filename…), and an
index per shard written by the package's own ``tfrecord2idx``.

    python make_imagenet_tfrecord.py OUT N

OUT/records/  the shards        OUT/index/NAME.idx  their indexes
OUT/expected/K.jpg  image K's JPEG bytes, in record order      OUT/labels.txt  "K label" lines
"""

import io
import os
import random
import sys

from PIL import Image
from tfrecord.tools.tfrecord2idx import create_index
from tfrecord.writer import TFRecordWriter


def jpeg(rng):
    w, h = rng.randint(8, 64), rng.randint(8, 64)
    img = Image.new("RGB", (w, h), tuple(rng.randrange(256) for _ in range(3)))
    for _ in range(20):
        img.putpixel((rng.randrange(w), rng.randrange(h)), tuple(rng.randrange(256) for _ in range(3)))
    buf = io.BytesIO()
    img.save(buf, "JPEG", quality=90)
    return buf.getvalue(), w, h


def main(out, n, shards=2):
    for d in ("records", "index", "expected"):
        os.makedirs(os.path.join(out, d), exist_ok=True)
    rng = random.Random(7)
    labels = []
    k = 0
    for s in range(shards):
        name = f"train-{s:05d}-of-{shards:05d}"
        path = os.path.join(out, "records", name)
        writer = TFRecordWriter(path)
        for _ in range(n // shards + (1 if s < n % shards else 0)):
            data, w, h = jpeg(rng)
            label = 1 + (k * 37) % 1000  # the converter's labels are 1-based
            writer.write(
                {
                    "image/height": (h, "int"),
                    "image/width": (w, "int"),
                    "image/colorspace": (b"RGB", "byte"),
                    "image/channels": (3, "int"),
                    "image/class/label": (label, "int"),
                    "image/class/synset": (b"n%08d" % label, "byte"),
                    "image/class/text": (b"class %d" % label, "byte"),
                    "image/format": (b"JPEG", "byte"),
                    "image/filename": (b"img_%06d.JPEG" % k, "byte"),
                    "image/encoded": (data, "byte"),
                }
            )
            with open(os.path.join(out, "expected", f"{k:06d}.jpg"), "wb") as f:
                f.write(data)
            labels.append(f"{k:06d} {label}")
            k += 1
        writer.close()
        create_index(path, os.path.join(out, "index", name + ".idx"))
    with open(os.path.join(out, "labels.txt"), "w") as f:
        f.write("\n".join(labels) + "\n")


if __name__ == "__main__":
    main(sys.argv[1], int(sys.argv[2]))
