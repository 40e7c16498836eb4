"""Decoded image batches from Python (numpy and Pillow; torch when installed).

Run by ``tests/it/python.rs``; the JPEGs (and a few PNGs and WebPs) are written here by Pillow, an encoder independent of
gpufeed's, and Pillow's resize is the reference the tensors are held to.
"""

import os
import tempfile
import unittest

import numpy as np
from PIL import Image

import gpufeed

MEAN = np.array([0.485, 0.456, 0.406], dtype=np.float32)
STD = np.array([0.229, 0.224, 0.225], dtype=np.float32)


def make_folder(root, n=24, classes=3):
    rng = np.random.default_rng(5)
    for i in range(n):
        d = os.path.join(root, f"class{i % classes}")
        os.makedirs(d, exist_ok=True)
        w, h = int(rng.integers(120, 260)), int(rng.integers(100, 240))
        small = rng.integers(0, 256, (h // 10 + 2, w // 10 + 2, 3), dtype=np.uint8)
        img = Image.fromarray(small).resize((w, h), Image.BICUBIC)
        if i % 5 == 1:
            img = img.convert("L")
        if i % 11 == 3:
            img.save(os.path.join(d, f"{i:03d}.png"))
        elif i % 11 == 7:
            img.save(os.path.join(d, f"{i:03d}.webp"), quality=90)
        else:
            img.save(os.path.join(d, f"{i:03d}.jpg"), quality=90, progressive=(i % 4 == 2))


def pillow_eval(path, size):
    """torchvision's Resize(size * 8 // 7) + CenterCrop(size) on a PIL image."""
    img = Image.open(path).convert("RGB")
    resize = size * 8 // 7
    w, h = img.size
    nw, nh = (resize, int(resize * h / w)) if w <= h else (int(resize * w / h), resize)
    img = img.resize((nw, nh), Image.BILINEAR)
    top, left = int(round((nh - size) / 2.0)), int(round((nw - size) / 2.0))
    return np.asarray(img.crop((left, top, left + size, top + size)))


class ImageTests(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.tmp = tempfile.TemporaryDirectory()
        cls.root = cls.tmp.name
        make_folder(cls.root)

    @classmethod
    def tearDownClass(cls):
        cls.tmp.cleanup()

    def test_images_are_a_zero_copy_tensor_of_the_asked_shape(self):
        loader = gpufeed.Loader(
            self.root, batch_size=8, images=gpufeed.Images("train", size=32, dtype="float16")
        )
        seen = []
        for batch in loader:
            buf = batch.images
            self.assertEqual(buf.dtype, "float16")
            x = np.from_dlpack(buf)
            self.assertEqual(x.shape, (len(batch), 3, 32, 32))
            self.assertEqual(x.dtype, np.float16)
            # The same memory, not a copy.
            self.assertEqual(x.__array_interface__["data"][0], buf.ptr)
            self.assertTrue(np.isfinite(x).all())
            labels = np.from_dlpack(batch.labels)
            self.assertEqual(len(labels), len(batch))
            self.assertTrue(((labels >= 0) & (labels < 3)).all())
            seen += np.from_dlpack(batch.sample_ids).tolist()
        self.assertEqual(sorted(seen), list(range(24)))

    def test_eval_tensors_match_pillow(self):
        loader = gpufeed.Loader(
            self.root,
            batch_size=8,
            images=gpufeed.Images("eval", size=48, dtype="uint8", layout="nhwc"),
        )
        for batch in loader:
            x = np.from_dlpack(batch.images)
            for i, key in enumerate(batch.keys):
                want = pillow_eval(os.path.join(self.root, key), 48).astype(np.int16)
                d = np.abs(x[i].astype(np.int16) - want)
                self.assertLessEqual(d.mean(), 0.5, key)
                self.assertLessEqual(d.max(), 2, key)

    def test_float_tensor_is_normalised_and_the_same_every_time(self):
        spec = dict(transform="train", size=40, dtype="float32")
        a = gpufeed.Loader(self.root, batch_size=6, seed=4, images=gpufeed.Images(**spec))
        b = gpufeed.Loader(
            self.root, batch_size=6, seed=4, images=gpufeed.Images(threads=3, **spec)
        )
        for x, y in zip(a, b):
            xa, ya = np.from_dlpack(x.images), np.from_dlpack(y.images)
            np.testing.assert_array_equal(xa, ya)
            # Inside the normalised range of 0..255 pixels.
            lo, hi = (0 - MEAN) / STD, (1 - MEAN) / STD
            self.assertTrue((xa >= lo[None, :, None, None] - 1e-4).all())
            self.assertTrue((xa <= hi[None, :, None, None] + 1e-4).all())

    def test_torch_sees_the_same_memory(self):
        try:
            import torch
        except ImportError:
            self.skipTest("torch is not installed")
        loader = gpufeed.Loader(self.root, batch_size=8, images=gpufeed.Images("train", 32))
        batch = next(iter(loader))
        t = torch.from_dlpack(batch.images)
        self.assertEqual(tuple(t.shape), (8, 3, 32, 32))
        self.assertEqual(t.data_ptr(), batch.images.ptr)

    def test_cuda_images_are_device_tensors_close_to_the_host_ones(self):
        try:
            import torch
        except ImportError:
            self.skipTest("torch is not installed")
        if not torch.cuda.is_available():
            self.skipTest("no CUDA GPU")
        spec = dict(transform="eval", size=48, dtype="uint8", dct_scaling=False)
        host = gpufeed.Loader(self.root, batch_size=8, images=gpufeed.Images(**spec))
        dev = gpufeed.Loader(self.root, batch_size=8, device="cuda", images=gpufeed.Images(**spec))
        n = 0
        for h, d in zip(host, dev):
            self.assertEqual(d.device, "cuda:0")
            self.assertEqual(d.images.__dlpack_device__(), (2, 0))
            t = torch.from_dlpack(d.images)
            self.assertEqual(t.device.type, "cuda")
            self.assertEqual(list(t.shape), h.shape)
            want = torch.from_dlpack(h.images).to(torch.float32)
            diff = (t.cpu().to(torch.float32) - want).abs()
            # The JPEG engines' IDCT and upsampling are not libjpeg-turbo's: a few levels.
            self.assertLessEqual(float(diff.mean()), 1.5)
            n += len(d)
        self.assertEqual(n, 24)
        # Where the device path's time went: every image on one route, each phase counted.
        ph = dev.stats()["device_phases"]
        self.assertIsNotNone(ph)
        self.assertEqual(ph["hardware_images"] + ph["cpu_images"] + ph["failed_images"], 24)
        names = {p["phase"]: p for p in ph["phases"]}
        self.assertEqual(names["kernels"]["count"], 3)
        self.assertIsNone(host.stats()["device_phases"])

    def test_a_broken_image_is_marked_and_named(self):
        with tempfile.TemporaryDirectory() as d:
            make_folder(d, n=6, classes=1)
            bad = os.path.join(d, "class0", "zzz-truncated.jpg")
            with open(os.path.join(d, "class0", "000.jpg"), "rb") as f:
                data = f.read()
            with open(bad, "wb") as f:
                f.write(data[: len(data) // 2])
            marked = gpufeed.Loader(d, batch_size=7, on_error="mark", images=gpufeed.Images("eval", 16))
            batch = next(iter(marked))
            failed = np.from_dlpack(batch.failed)
            self.assertEqual(int(failed.sum()), 1)
            (i, msg), = batch.errors
            self.assertIn("zzz-truncated.jpg", msg)
            self.assertIn("truncated", msg)
            self.assertFalse(np.from_dlpack(batch.images)[i].any())
            raising = gpufeed.Loader(d, batch_size=7, images=gpufeed.Images("eval", 16))
            with self.assertRaises(gpufeed.SampleError):
                next(iter(raising))

    def test_bad_settings_are_value_errors(self):
        for kw in (dict(transform="rotate"), dict(dtype="int8"), dict(layout="chw"), dict(size=0)):
            with self.assertRaises(ValueError):
                gpufeed.Images(**kw)
        # Bounded where an allocation or a thread count follows from the value (a trial's
        # prefetch_batches=10**9 aborted the process), and checked whatever the transform.
        for kw, says in (
            (dict(prefetch_batches=10**9), "prefetch_batches 1000000000: expected 1 to 64"),
            (dict(threads=10**6), "threads 1000000: expected 0 to 1024"),
            (dict(transform="eval", flip_p=5), "flip_p 5"),
            (dict(transform="eval", scale=(1, 0.5)), "scale"),
            (dict(transform="train", resize=-1), "resize"),
            (dict(max_pixels=1.5), "max_pixels"),
            (dict(size=True), "size=True"),
        ):
            with self.assertRaises(ValueError) as c:
                gpufeed.Images(**kw)
            self.assertIn(says, str(c.exception), kw)


class ImageSettings(unittest.TestCase):
    """Python's door to the image settings' table (the Rust, C and CLI doors are held to it by
    tests/it/capi.rs)."""

    def test_every_setting_has_the_tables_default(self):
        want = {k: (None if d == "none" else d) for k, (d, _unit, _help) in gpufeed.IMAGE_SETTINGS.items()}
        self.assertEqual(gpufeed.Images().settings, want)
        self.assertEqual(want["dtype"], "float32")
        import inspect

        params = inspect.signature(gpufeed.Images).parameters
        for name in gpufeed.IMAGE_SETTINGS:
            self.assertIn(name, params)
            self.assertIsNone(params[name].default, name)

    def test_every_setting_given_reaches_the_spec(self):
        train = dict(
            transform="train", size=(40, 48), dtype="bfloat16", layout="nhwc",
            mean=(0.5, 0.25, 0.125), std=[0.5, 0.5, 0.25], threads=3, scale=(0.25, 0.75),
            ratio=(0.5, 2.0), flip_p=0.25, dct_scaling=False, max_pixels=1000000,
            prefetch_batches=4, hardware_decoder=False,
        )
        s = gpufeed.Images(**train).settings
        self.assertEqual(
            s,
            dict(
                transform="train", size="40x48", dtype="bfloat16", layout="nhwc",
                mean="0.5,0.25,0.125", std="0.5,0.5,0.25", threads="3", scale="0.25,0.75",
                ratio="0.5,2", flip_p="0.25", resize=None, dct_scaling="false",
                max_pixels="1000000", prefetch_batches="4", hardware_decoder="false",
            ),
        )
        e = gpufeed.Images("eval", 40, resize=60).settings
        self.assertEqual((e["resize"], e["scale"]), ("60", None))
        self.assertEqual(gpufeed.Images("eval", 224).settings["resize"], "256")
        untested = set(gpufeed.IMAGE_SETTINGS) - set(train) - {"resize"}
        self.assertEqual(untested, set())
        # Every dtype spelling is one parse: strings, numpy and torch-style names.
        import numpy as np

        for d, name in (("half", "float16"), (np.float16, "float16"), (np.dtype("uint8"), "uint8"),
                        ("bf16", "bfloat16"), ("float", "float32")):
            self.assertEqual(gpufeed.Images(dtype=d).settings["dtype"], name, d)
        # The evaluation crop lies inside the resized image whatever the output's shape.
        self.assertEqual(gpufeed.Images("eval", size=(64, 32)).settings["resize"], "73")
        self.assertEqual(gpufeed.Images("eval", size=[64, 32]).settings["size"], "64x32")
        # Pickled by what it was given.
        import pickle

        self.assertEqual(pickle.loads(pickle.dumps(gpufeed.Images(**train))).settings, s)
        # Equal when they make the same images, defaults spelled or not; usable as keys.
        self.assertEqual(pickle.loads(pickle.dumps(gpufeed.Images(**train))), gpufeed.Images(**train))
        self.assertEqual(gpufeed.Images("train"), gpufeed.Images("train", size=224, dtype="float32"))
        self.assertNotEqual(gpufeed.Images("train"), gpufeed.Images("eval"))
        self.assertNotEqual(gpufeed.Images("train", flip_p=0.2), gpufeed.Images("train"))
        self.assertNotEqual(gpufeed.Images("train"), "train")
        self.assertEqual(len({gpufeed.Images("train"), gpufeed.Images("train", size=224)}), 1)


if __name__ == "__main__":
    unittest.main()
