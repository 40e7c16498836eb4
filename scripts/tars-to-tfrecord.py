#!/usr/bin/env python3
"""The samples of a WebDataset's tars as TFRecord files of ``tf.train.Example``s, written by the
``tfrecord`` package (PyPI; not gpufeed's writer), one file per tar, with the index its
``tfrecord2idx`` makes beside each (``NAME.tfrecord.idx``: "offset length" per record, DALI's
format). Each member becomes one record: ``image/encoded`` (its bytes) and ``image/class/label``
(the number in its directory's name, ``c0042/…`` → 42, else 0).

    python scripts/tars-to-tfrecord.py SRC_DIR OUT_DIR [--no-index]

Used for the remote TFRecord benchmark in BENCHMARKS.md (``pip install tfrecord``).
"""

import argparse
import os
import re
import sys
import tarfile


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("src")
    ap.add_argument("out")
    ap.add_argument("--no-index", action="store_true")
    a = ap.parse_args()
    import tfrecord
    from tfrecord.tools.tfrecord2idx import create_index

    os.makedirs(a.out, exist_ok=True)
    n = 0
    for name in sorted(os.listdir(a.src)):
        if not name.endswith(".tar"):
            continue
        dst = os.path.join(a.out, name[: -len(".tar")] + ".tfrecord")
        w = tfrecord.TFRecordWriter(dst)
        with tarfile.open(os.path.join(a.src, name)) as t:
            for m in t:
                if not m.isfile():
                    continue
                data = t.extractfile(m).read()
                d = re.search(r"(\d+)/[^/]*$", m.name)
                label = int(d.group(1)) if d else 0
                w.write({"image/encoded": (data, "byte"), "image/class/label": (label, "int")})
                n += 1
        w.close()
        if not a.no_index:
            create_index(dst, dst + ".idx")
    print(f"{n} records in {a.out}")


if __name__ == "__main__":
    sys.exit(main())
