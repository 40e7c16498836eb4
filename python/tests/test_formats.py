"""The epoch contract and the dataset options from Python (CPU; numpy).

Run by ``tests/it/python.rs`` with ``GPUFEED_TEST_DATA`` (``d2000/``: 2,000 packed samples;
``imagenet-tfrecord/``: an ImageNet-style TFRecord set written by the ``tfrecord`` package, with
``expected/K.jpg`` and ``labels.txt``) and ``GPUFEED_BIN`` (the CLI, to compare with).
"""

import io
import json
import os
import struct
import subprocess
import tarfile
import tempfile
import unittest
import warnings

import numpy as np

import gpufeed

DATA = os.environ.get("GPUFEED_TEST_DATA", "")
BIN = os.environ.get("GPUFEED_BIN", "")


def cli_inspect(paths, **opts):
    """``gpufeed inspect --json`` with ``--NAME VALUE`` per option."""
    args = [BIN, "inspect", "--json"]
    for k, v in opts.items():
        flag = "--" + k.replace("_", "-")
        args += [flag] if v is True else [flag, str(v)]
    out = subprocess.run(
        args + [str(p) for p in paths],
        check=True,
        capture_output=True,
        env=dict(os.environ, GPUFEED_QUIET="1"),
    )
    return json.loads(out.stdout)


def epoch(ld):
    """(sample id, bytes, label, padding) of every sample of one epoch, and the batch sizes."""
    out, sizes = [], []
    for b in ld:
        data = np.from_dlpack(b.data)
        offsets, lengths = np.from_dlpack(b.offsets), np.from_dlpack(b.lengths)
        ids, labels = np.from_dlpack(b.sample_ids), np.from_dlpack(b.labels)
        pad = np.from_dlpack(b.padding)
        sizes.append(len(b))
        for i in range(len(b)):
            got = data[offsets[i] : offsets[i] + lengths[i]].tobytes()
            out.append((int(ids[i]), got, int(labels[i]), bool(pad[i])))
    return out, sizes


@unittest.skipUnless(DATA and BIN, "GPUFEED_TEST_DATA / GPUFEED_BIN not set (tests/it/python.rs sets them)")
class EpochContract(unittest.TestCase):
    def test_2000_samples_in_batches_of_64_are_2000_distinct(self):
        ld = gpufeed.Loader(os.path.join(DATA, "d2000"), batch_size=64)
        self.assertEqual(ld.last_batch, "short")
        self.assertEqual(len(ld), 32)
        got, sizes = epoch(ld)
        self.assertEqual(len(got), 2000)
        self.assertEqual(len({g[0] for g in got}), 2000)
        self.assertEqual(sizes, [64] * 31 + [16])
        self.assertFalse(any(g[3] for g in got))

    def test_drop_and_its_alias(self):
        for kw in (dict(last_batch="drop"), dict(drop_last=True)):
            ld = gpufeed.Loader(os.path.join(DATA, "d2000"), batch_size=64, **kw)
            got, sizes = epoch(ld)
            self.assertEqual(sizes, [64] * 31)
            self.assertEqual(len({g[0] for g in got}), 1984)
        with self.assertRaises(ValueError):
            gpufeed.Loader(os.path.join(DATA, "d2000"), batch_size=64, last_batch="drop", drop_last=True)
        with self.assertRaises(ValueError):
            gpufeed.Loader(os.path.join(DATA, "d2000"), batch_size=64, last_batch="fill")

    def test_pad_evens_out_ranks_and_flags_exactly_the_repeats(self):
        real, padded, per_rank = {}, [], []
        for rank in range(3):
            ld = gpufeed.Loader(
                os.path.join(DATA, "d2000"), batch_size=64, last_batch="pad", rank=rank, world_size=3
            )
            got, _ = epoch(ld)
            per_rank.append(len(got))
            self.assertEqual(len(got), ld.samples_per_epoch)
            for sid, _, _, pad in got:
                if pad:
                    padded.append(sid)
                else:
                    real[sid] = real.get(sid, 0) + 1
        self.assertEqual(per_rank, [667] * 3)
        self.assertEqual(real, {i: 1 for i in range(2000)})
        self.assertEqual(len(padded), 1)


@unittest.skipUnless(DATA and BIN, "GPUFEED_TEST_DATA / GPUFEED_BIN not set (tests/it/python.rs sets them)")
class DatasetOptions(unittest.TestCase):
    def test_the_table_is_the_clis_and_the_stubs(self):
        names = list(gpufeed.DATASET_OPTIONS)
        self.assertEqual(
            names,
            ["format", "payload", "label_ext", "label_offset", "tfrecord_index", "tfrecord_payload",
             "tfrecord_label", "tfrecord_recover", "token_dtype", "seq_len", "stride", "strict",
             "cache_dir", "cache_limit", "cache_extent"],
        )
        helptext = subprocess.run([BIN, "inspect", "--help"], check=True, capture_output=True).stdout.decode()
        for n in names:
            self.assertIn("--" + n.replace("_", "-"), helptext)
        with open(os.path.join(os.path.dirname(gpufeed.__file__), "_gpufeed.pyi")) as f:
            stub = f.read()
        for n in names:
            self.assertIn(f"        {n}: Optional[", stub, n)
        with self.assertRaises(TypeError) as e:
            gpufeed.Loader(os.path.join(DATA, "d2000"), batch_size=8, payload_ext="jpg")
        self.assertIn("token_dtype", str(e.exception))

    def test_every_cli_option_reaches_python(self):
        with tempfile.TemporaryDirectory(dir=DATA) as d:
            path = os.path.join(d, "train.bin")
            np.arange(5000, dtype=np.uint32).tofile(path)
            opts = dict(
                format="tokens", payload="png,jpg", label_ext="txt", label_offset=1,
                tfrecord_index="/no/such/index", tfrecord_payload="img", tfrecord_label="y",
                tfrecord_recover=True, token_dtype="u32", seq_len=64, stride=32, strict=True,
                cache_dir="/no/such/cache", cache_limit=1 << 20, cache_extent="64K",
            )
            self.assertEqual(sorted(opts), sorted(gpufeed.DATASET_OPTIONS))
            cli = cli_inspect([path], **opts)
            ld = gpufeed.Loader(path, batch_size=16, **opts)
            self.assertEqual(ld.dataset_options, cli["options"])
            self.assertEqual(ld.num_samples, cli["samples"])
            # A list of extensions is the CLI's comma-separated value.
            ld = gpufeed.Loader(path, batch_size=16, **dict(opts, payload=["png", "jpg"]))
            self.assertEqual(ld.dataset_options["payload"], "png,jpg")

    def test_nanogpt_tokens_as_the_cli_reads_them(self):
        with tempfile.TemporaryDirectory(dir=DATA) as d:
            # As nanoGPT's prepare.py writes train.bin: a uint16 memmap.
            path = os.path.join(d, "train.bin")
            toks = (np.arange(20_000) * 7919 % 50257).astype(np.uint16)
            arr = np.memmap(path, dtype=np.uint16, mode="w+", shape=(len(toks),))
            arr[:] = toks
            arr.flush()
            del arr
            ld = gpufeed.Loader(path, batch_size=8, format="tokens", seq_len=256, stride=128, order="block")
            cli = cli_inspect([path], format="tokens", seq_len=256, stride=128)
            self.assertEqual(ld.num_samples, cli["samples"])
            got, _ = epoch(ld)
            self.assertEqual(len(got), ld.num_samples)
            for sid, b, _, _ in got:
                window = np.frombuffer(b, dtype=np.uint16)
                np.testing.assert_array_equal(window, toks[sid * 128 : sid * 128 + 257])
            # Without format="tokens" a flat file is refused with the way out.
            with self.assertRaises(gpufeed.GpufeedError) as e:
                gpufeed.Loader(path, batch_size=8)
            self.assertIn("tokens", str(e.exception))

    def test_a_megatron_prefix_as_the_cli_reads_it(self):
        with tempfile.TemporaryDirectory(dir=DATA) as d:
            prefix = os.path.join(d, "corpus_text_document")
            lens = [5, 0, 17, 3, 40, 9]
            seqs = [(np.arange(n) + 100 * i).astype(np.uint16) for i, n in enumerate(lens)]
            with open(prefix + ".bin", "wb") as f:
                for s in seqs:
                    f.write(s.tobytes())
            ptrs = np.concatenate([[0], np.cumsum([2 * n for n in lens])[:-1]]).astype(np.int64)
            with open(prefix + ".idx", "wb") as f:  # Megatron's _IndexWriter layout
                f.write(b"MMIDIDX\x00\x00")
                f.write(struct.pack("<Q", 1))
                f.write(struct.pack("<B", 8))  # uint16
                f.write(struct.pack("<Q", len(lens)))
                f.write(struct.pack("<Q", len(lens) + 1))
                f.write(np.array(lens, dtype=np.int32).tobytes())
                f.write(ptrs.tobytes())
                f.write(np.arange(len(lens) + 1, dtype=np.int64).tobytes())
            ld = gpufeed.Loader(prefix, batch_size=2)
            cli = cli_inspect([prefix])
            self.assertEqual(ld.num_samples, cli["samples"])
            self.assertEqual(ld.dataset_options["format"], "megatron")
            got, _ = epoch(ld)
            by_id = {sid: b for sid, b, _, _ in got}
            # One sample per sequence (the empty one too), in index order.
            self.assertEqual(ld.num_samples, len(lens))
            self.assertEqual(len(by_id), len(lens))
            for i, seq in enumerate(seqs):
                np.testing.assert_array_equal(np.frombuffer(by_id[i], dtype=np.uint16), seq)
            # Windows over the .bin with seq_len, as the CLI's --seq-len.
            ld = gpufeed.Loader(prefix, batch_size=2, seq_len=8)
            self.assertEqual(ld.num_samples, cli_inspect([prefix], seq_len=8)["samples"])


def megatron(prefix, seqs, code, dtype):
    """A Megatron indexed dataset as megatron-core's ``_IndexWriter`` lays it out: ``seqs`` (arrays
    of ``dtype``, its code ``code``), one document per sequence."""
    lens = [len(q) for q in seqs]
    with open(prefix + ".bin", "wb") as f:
        for q in seqs:
            f.write(np.asarray(q, dtype=dtype).tobytes())
    width = np.dtype(dtype).itemsize
    ptrs = np.concatenate([[0], np.cumsum([width * n for n in lens])[:-1]]).astype(np.int64)
    with open(prefix + ".idx", "wb") as f:
        f.write(b"MMIDIDX\x00\x00")
        f.write(struct.pack("<Q", 1))
        f.write(struct.pack("<B", code))
        f.write(struct.pack("<Q", len(lens)))
        f.write(struct.pack("<Q", len(lens) + 1))
        f.write(np.array(lens, dtype=np.int32).tobytes())
        f.write(ptrs.tobytes())
        f.write(np.arange(len(lens) + 1, dtype=np.int64).tobytes())


def get_batch(data, ix, block_size):
    """nanoGPT's ``get_batch`` over a memmap, for the windows starting at ``ix``."""
    x = np.stack([data[i : i + block_size].astype(np.int64) for i in ix])
    y = np.stack([data[i + 1 : i + 1 + block_size].astype(np.int64) for i in ix])
    return x, y


@unittest.skipUnless(DATA, "GPUFEED_TEST_DATA is not set (tests/it/python.rs sets it)")
class TokenPairs(unittest.TestCase):
    """A token corpus's batch as a model's inputs and targets (issue 36): ``pairs()`` is what
    nanoGPT's ``get_batch`` gives for the same windows, for flat files and Megatron windows."""

    def check(self, ld, tokens, stride, seq_len):
        seen = 0
        for b in ld:
            self.assertEqual(b.seq_len, seq_len)
            ids = np.from_dlpack(b.sample_ids)
            x, y = (np.from_dlpack(t) for t in b.pairs())
            self.assertEqual((x.dtype, x.shape, y.shape), (np.int64, (len(b), seq_len), (len(b), seq_len)))
            want_x, want_y = get_batch(tokens, ids * stride, seq_len)
            np.testing.assert_array_equal(x, want_x)
            np.testing.assert_array_equal(y, want_y)
            x32, y32 = (np.from_dlpack(t) for t in b.pairs(dtype="int32"))
            self.assertEqual(x32.dtype, np.int32)
            np.testing.assert_array_equal(x32, want_x)
            rows = np.from_dlpack(b.tokens())
            np.testing.assert_array_equal(rows[:, :-1], want_x)
            np.testing.assert_array_equal(rows[:, -1], want_y[:, -1])
            seen += len(b)
        self.assertEqual(seen, ld.num_samples)

    def test_flat_files_give_nanogpts_pairs(self):
        with tempfile.TemporaryDirectory(dir=DATA) as d:
            for dtype, token_dtype in ((np.uint16, None), (np.uint32, "u32")):
                path = os.path.join(d, f"train-{token_dtype}.bin")
                toks = (np.arange(30_000, dtype=np.uint64) * 7919 % 100_277).astype(dtype)
                arr = np.memmap(path, dtype=dtype, mode="w+", shape=(len(toks),))
                arr[:] = toks
                arr.flush()
                del arr
                data = np.memmap(path, dtype=dtype, mode="r")
                for stride in (None, 50):
                    ld = gpufeed.Loader(path, batch_size=12, format="tokens", seq_len=100,
                                        stride=stride, token_dtype=token_dtype)
                    self.check(ld, data, stride or 100, 100)

    def test_megatron_windows_give_the_same_pairs_and_sequences_say_what_to_do(self):
        with tempfile.TemporaryDirectory(dir=DATA) as d:
            rng = np.random.default_rng(4)
            for code, dtype in ((8, np.uint16), (4, np.int32)):
                prefix = os.path.join(d, f"corpus-{code}_text_document")
                seqs = [rng.integers(0, 60_000 if code == 8 else 200_000, n).astype(dtype)
                        for n in rng.integers(1, 400, 40)]
                megatron(prefix, seqs, code, dtype)
                whole = np.concatenate(seqs)
                ld = gpufeed.Loader(prefix, batch_size=5, seq_len=32)
                self.check(ld, whole, 32, 32)
                # One sample per sequence: of different lengths, so no [N, seq_len] pairs.
                b = next(iter(gpufeed.Loader(prefix, batch_size=5)))
                self.assertIsNone(b.seq_len)
                with self.assertRaises(ValueError) as e:
                    b.pairs()
                self.assertIn("seq_len=", str(e.exception))

    def test_pairs_of_other_data_and_other_dtypes_are_refused_in_python_words(self):
        with tempfile.TemporaryDirectory(dir=DATA) as d:
            path = os.path.join(d, "train.bin")
            np.arange(5000, dtype=np.uint16).tofile(path)
            b = next(iter(gpufeed.Loader(path, batch_size=4, format="tokens", seq_len=16)))
            with self.assertRaises(ValueError) as e:
                b.pairs(dtype="float32")
            self.assertIn("int64", str(e.exception))
            big = os.path.join(d, "big.bin")
            np.full(100, 3_000_000_000, dtype=np.uint32).tofile(big)
            b = next(iter(gpufeed.Loader(big, batch_size=2, format="tokens", seq_len=8, token_dtype="u32")))
            with self.assertRaises(ValueError) as e:
                b.pairs(dtype="int32")
            self.assertIn("int32", str(e.exception))
            self.assertEqual(int(np.from_dlpack(b.pairs()[0])[0, 0]), 3_000_000_000)
            b = next(iter(gpufeed.Loader(os.path.join(DATA, "d2000"), batch_size=4)))
            self.assertIsNone(b.seq_len)
            with self.assertRaises(ValueError) as e:
                b.pairs()
            self.assertIn('format="tokens"', str(e.exception))
            # The library's messages name options as Python spells them.
            with self.assertRaises(gpufeed.GpufeedError) as e:
                gpufeed.Loader(path, batch_size=4)
            self.assertIn('format="tokens"', str(e.exception))
            self.assertNotIn("--format", str(e.exception))


@unittest.skipUnless(DATA and BIN, "GPUFEED_TEST_DATA / GPUFEED_BIN not set (tests/it/python.rs sets them)")
class Problems(unittest.TestCase):
    def make_tars(self, d):
        """Two WebDataset tars written by Python's tarfile; the second truncated mid-member."""
        paths = []
        for t in range(2):
            p = os.path.join(d, f"part-{t}.tar")
            with tarfile.open(p, "w", format=tarfile.PAX_FORMAT) as tar:
                for i in range(10):
                    for ext, data in (("jpg", bytes([i]) * 2000), ("cls", str(i).encode())):
                        info = tarfile.TarInfo(f"{t}{i:03d}.{ext}")
                        info.size = len(data)
                        tar.addfile(info, io.BytesIO(data))
            paths.append(p)
        with tarfile.open(paths[1]) as tar:  # cut inside member 1005.jpg's data
            cut = tar.getmember("1005.jpg").offset_data + 1000
        with open(paths[1], "r+b") as f:
            f.truncate(cut)
        return paths

    def test_a_damaged_dataset_is_told_without_asking(self):
        with tempfile.TemporaryDirectory(dir=DATA) as d:
            paths = self.make_tars(d)
            with warnings.catch_warnings(record=True) as w:
                warnings.simplefilter("always")
                ld = gpufeed.Loader(paths, batch_size=4)
            told = [x for x in w if issubclass(x.category, gpufeed.DatasetWarning)]
            self.assertEqual(len(told), 1, [str(x.message) for x in w])
            msg = str(told[0].message)
            self.assertIn(f"{ld.problems_total} problem", msg)
            self.assertIn("part-1.tar", msg)
            self.assertIn("truncated", msg)
            self.assertGreater(ld.problems_total, 0)
            self.assertLess(ld.num_samples, 20)
            first = ld.problems[0]
            self.assertTrue(first["path"].endswith("part-1.tar"), first)
            self.assertIsNotNone(first["offset"])
            # The samples that could be located all arrive.
            got, _ = epoch(ld)
            self.assertEqual(len(got), ld.num_samples)
            with self.assertRaises(gpufeed.GpufeedError) as e:
                gpufeed.Loader(paths, batch_size=4, strict=True)
            self.assertIn("strict", str(e.exception))
            # A clean dataset warns nothing.
            with warnings.catch_warnings(record=True) as w:
                warnings.simplefilter("always")
                gpufeed.Loader(paths[:1], batch_size=4)
            self.assertEqual([x for x in w if issubclass(x.category, gpufeed.DatasetWarning)], [])


    def test_a_budget_too_small_names_the_setting(self):
        ld = gpufeed.Loader(os.path.join(DATA, "d2000"), batch_size=1024)
        slot, slots = ld.slot_bytes
        # A whole batch of 1,024 small samples, each at least a 512-byte block (small samples
        # are planned at the files' direct-I/O alignment: 512 bytes on most disks, else 4 KiB).
        self.assertGreaterEqual(slot, 1024 * 512)
        with self.assertRaises(gpufeed.GpufeedError) as e:
            gpufeed.Loader(os.path.join(DATA, "d2000"), batch_size=1024, memory_budget=1 << 20)
        self.assertIn("memory_budget=", str(e.exception))
        self.assertIn("batch_size", str(e.exception))

    def test_verify_finds_images_that_are_not_what_they_claim(self):
        from PIL import Image

        with tempfile.TemporaryDirectory(dir=DATA) as d:
            os.makedirs(os.path.join(d, "cat"))
            os.makedirs(os.path.join(d, "dog"))
            for i, fmt in enumerate(("JPEG", "PNG", "WEBP")):
                img = Image.new("RGB", (40 + i, 30), (i * 50, 90, 200))
                img.save(os.path.join(d, "cat", f"good{i}.{fmt.lower().replace('jpeg', 'jpg')}"), fmt)
            progressive = os.path.join(d, "cat", "prog.jpg")
            Image.new("L", (64, 48), 128).save(progressive, "JPEG", progressive=True)
            buf = io.BytesIO()
            Image.new("RGB", (64, 64), (1, 2, 3)).save(buf, "JPEG", quality=90)
            whole = buf.getvalue()
            with open(os.path.join(d, "dog", "truncated.jpg"), "wb") as f:
                f.write(whole[: len(whole) * 2 // 3])
            with open(os.path.join(d, "dog", "page.jpg"), "wb") as f:
                f.write(b"<!DOCTYPE html><html><body>Not Found</body></html>")
            open(os.path.join(d, "dog", "empty.JPEG"), "wb").close()
            out = subprocess.run(
                [BIN, "verify", "--json", d], capture_output=True, env=dict(os.environ, GPUFEED_QUIET="1")
            )
            self.assertNotEqual(out.returncode, 0)
            lines = [json.loads(x) for x in out.stdout.decode().splitlines()]
            summary = lines.pop()
            self.assertEqual((summary["samples"], summary["bad"]), (7, 3), lines)
            bad = {os.path.basename(x["path"]): x["error"] for x in lines}
            self.assertIn("truncated", bad["truncated.jpg"])
            self.assertIn("<!DOCTYPE", bad["page.jpg"])
            self.assertIn("empty", bad["empty.JPEG"])


@unittest.skipUnless(DATA and BIN, "GPUFEED_TEST_DATA / GPUFEED_BIN not set (tests/it/python.rs sets them)")
@unittest.skipUnless(os.path.isdir(os.path.join(DATA, "imagenet-tfrecord")),
                     "no imagenet-tfrecord set (made where the `tfrecord` package is installed)")
class TfRecordExamples(unittest.TestCase):
    ROOT = os.path.join(DATA, "imagenet-tfrecord")

    def expected(self):
        with open(os.path.join(self.ROOT, "labels.txt")) as f:
            labels = [int(line.split()[1]) for line in f if line.strip()]
        jpegs = []
        for k in range(len(labels)):
            with open(os.path.join(self.ROOT, "expected", f"{k:06d}.jpg"), "rb") as f:
                jpegs.append(f.read())
        return jpegs, labels

    def test_imagenet_style_examples_read_as_jpegs_with_their_labels(self):
        jpegs, labels = self.expected()
        records = os.path.join(self.ROOT, "records")
        for kw in (dict(), dict(tfrecord_index=os.path.join(self.ROOT, "index"))):
            ld = gpufeed.Loader(records, batch_size=8, format="tfrecord", label_offset=1, **kw)
            got, _ = epoch(ld)
            self.assertEqual(len(got), len(jpegs))
            for sid, b, label, _ in got:
                self.assertEqual(b, jpegs[sid], sid)
                self.assertEqual(b[:2], b"\xff\xd8")
                self.assertEqual(label, labels[sid] - 1)
        # A payload feature the records lack: refused at once, naming the features they have.
        with self.assertRaises(gpufeed.GpufeedError) as e:
            gpufeed.Loader(records, batch_size=8, format="tfrecord", tfrecord_payload="image/raw")
        self.assertIn("image/encoded", str(e.exception))


if __name__ == "__main__":
    unittest.main()
