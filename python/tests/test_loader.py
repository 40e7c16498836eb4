"""Tests of the Python package (CPU; numpy, no torch needed).

Run by the Rust test ``tests/it/python.rs``, which builds the wheel, installs it in a fresh
virtualenv and makes the datasets: ``GPUFEED_TEST_DATA`` holds ``good/`` (packed shards) and
``corrupt/`` (the same, one sample damaged on disk), and ``samples.txt`` lists each sample's
key and length. Sample ``i``'s bytes are ``(i * 7 + j * 13) % 256`` for ``j < length``.
"""

import gc
import glob
import os
import pickle
import shutil
import tempfile
import unittest

import numpy as np

import gpufeed

DATA = os.environ.get("GPUFEED_TEST_DATA", "")
MODES = ("global", "shard-buffer", "block")


def expected(key, length):
    i = int(key)
    return ((i * 7 + np.arange(length, dtype=np.int64) * 13) % 256).astype(np.uint8)


def samples():
    with open(os.path.join(DATA, "samples.txt")) as f:
        return {k: int(n) for k, n in (line.split() for line in f if line.strip())}


def loader(name="good", **kw):
    args = dict(batch_size=8, seed=3, shuffle_buffer=40, block_bytes=64 << 10, open_blocks=3)
    args.update(kw)
    return gpufeed.Loader(os.path.join(DATA, name), **args)


@unittest.skipUnless(DATA, "GPUFEED_TEST_DATA is not set (tests/it/python.rs sets it)")
class LoaderTests(unittest.TestCase):
    def test_every_sample_once_with_its_bytes_in_every_mode_and_across_ranks(self):
        want = samples()
        for order in MODES:
            seen = {}
            for rank in range(3):
                ld = loader(order=order, rank=rank, world_size=3)
                count = 0
                for b in ld:
                    data = np.from_dlpack(b.data)
                    offsets = np.from_dlpack(b.offsets)
                    lengths = np.from_dlpack(b.lengths)
                    labels = np.from_dlpack(b.labels)
                    for i, key in enumerate(b.keys):
                        got = data[offsets[i] : offsets[i] + lengths[i]]
                        self.assertEqual(lengths[i], want[key], key)
                        np.testing.assert_array_equal(got, expected(key, want[key]), key)
                        self.assertEqual(labels[i], int(key) % 5)
                        self.assertEqual(b.sample(i), got.tobytes())
                        seen[key] = seen.get(key, 0) + 1
                    count += 1
                self.assertEqual(count, len(ld))
            self.assertEqual(seen, {k: 1 for k in want}, order)

    def test_dlpack_shares_memory(self):
        ld = loader()
        b = next(iter(ld))
        self.assertEqual(b.data.__dlpack_device__(), (1, 0))
        arr = np.from_dlpack(b.data)
        self.assertEqual(arr.ctypes.data, b.data.ptr, "numpy views gpufeed's memory")
        self.assertEqual(arr.dtype, np.uint8)
        self.assertEqual(arr.nbytes, b.data.nbytes)
        self.assertEqual(b.data.tolist()[:16], arr[:16].tolist())
        self.assertEqual(b.data.tobytes(), arr.tobytes())
        offs = np.from_dlpack(b.offsets)
        self.assertEqual(offs.ctypes.data, b.offsets.ptr)
        self.assertEqual(offs.dtype, np.int64)

    def test_a_kept_batch_stays_intact_while_others_are_recycled(self):
        ld = loader(prefetch=1)
        it = iter(ld)
        first = next(it)
        kept = np.from_dlpack(first.data)
        snapshot = kept.copy()
        ptr = kept.ctypes.data
        del first
        gc.collect()
        rest = 0
        addresses = set()
        for b in it:
            addresses.add(b.data.ptr)
            rest += 1
        self.assertEqual(rest, len(ld) - 1)
        np.testing.assert_array_equal(kept, snapshot)
        self.assertEqual(kept.ctypes.data, ptr)
        self.assertGreater(len(addresses), 0)

    def test_resume_from_state_dict_equals_an_uninterrupted_run(self):
        for order in MODES:
            full = loader(order=order)
            full.set_epoch(4)
            whole = [(b.index, b.sample_ids.tolist()) for b in full]
            part = loader(order=order)
            part.set_epoch(4)
            it = iter(part)
            head = [next(it) for _ in range(5)]
            state = part.state_dict()
            self.assertEqual((state["epoch"], state["batch"]), (4, 5))
            del it, head
            again = loader(order=order)
            again.load_state_dict(state)
            tail = [(b.index, b.sample_ids.tolist()) for b in again]
            self.assertEqual(tail, whole[5:], order)
        with self.assertRaises(ValueError):
            loader(seed=99).load_state_dict(state)
        # A state saved before epoch orders were versioned (version 1: another global order)
        # is refused, saying why and what to do.
        old = dict(state)
        del old["order_version"]
        with self.assertRaisesRegex(ValueError, "version 1.*set_epoch\\(4\\)"):
            loader(order=MODES[-1]).load_state_dict(old)
        old["order_version"] = 2
        loader(order=MODES[-1]).load_state_dict(old)  # version 3 changed shard-buffer only
        sb = loader(order="shard-buffer").state_dict()
        sb["order_version"] = 2
        with self.assertRaisesRegex(ValueError, "version 2.*shard-buffer order reads windows"):
            loader(order="shard-buffer").load_state_dict(sb)
        sb["order_version"] = state["order_version"]
        loader(order="shard-buffer").load_state_dict(sb)

    def test_a_resume_on_another_rank_count_delivers_the_rest_exactly_once(self):
        # Ranks stop together after k batches (lockstep), every new rank loads rank 0's state,
        # and the new ranks deliver what the epoch still owed, each sample once; a second move
        # (8 -> 6 -> 3) goes through the state the resumed run saved.
        def run(world, k, state, **kw):
            got, states, counts = [], [], []
            for rank in range(world):
                ld = loader(rank=rank, world_size=world, batch_size=4, **kw)
                if state is None:
                    ld.set_epoch(2)
                else:
                    ld.load_state_dict(state)
                n = 0
                it = iter(ld)
                for b in it:
                    pad = np.from_dlpack(b.padding)
                    got += [i for i, p in zip(b.sample_ids.tolist(), pad) if not p]
                    n += 1
                    if n == k:
                        break
                else:
                    counts.append(n)
                states.append(ld.state_dict())
                del it
            same = [{k: v for k, v in s.items() if k != "rank"} for s in states]
            self.assertTrue(all(s == same[0] for s in same))
            return got, states[0], counts

        for order in MODES + ("sequential",):
            for last_batch in ("pad", "drop", "short"):
                kw = dict(order=order, last_batch=last_batch)
                owed = {w: sorted(run(w, 0, None, **kw)[0]) for w in (8, 2, 4)}
                for chain in ((8, 6), (2, 3), (4, 1), (8, 6, 3)):
                    what = f"{order} {last_batch} {chain}"
                    got, state = [], None
                    for level, world in enumerate(chain):
                        last = level + 1 == len(chain)
                        part, state, counts = run(world, 0 if last else 3, state, **kw)
                        got += part
                        if last and last_batch != "short":
                            self.assertEqual(len(set(counts)), 1, what)
                    if chain == (8, 6, 3):
                        self.assertEqual(state["stops"], [], what)  # finished: the next epoch
                        self.assertEqual(state["epoch"], 3, what)
                    self.assertEqual(sorted(got), owed[chain[0]], what)
        # A state that moved names its stop, and resumes on that count rank for rank.
        _, state, _ = run(8, 3, None, order="global", last_batch="pad")
        _, moved, _ = run(6, 1, state, order="global", last_batch="pad")
        self.assertEqual(moved["stops"], [[8, 3]])
        self.assertEqual((moved["epoch"], moved["batch"]), (2, 1))
        bad = dict(moved, stops=[[8, 999]])
        with self.assertRaisesRegex(ValueError, "rank 0 had only"):
            loader(world_size=6, rank=0, batch_size=4, order="global",
                   last_batch="pad").load_state_dict(bad)

    def test_prefetch_next_epoch_delivers_the_same_epochs(self):
        def epochs(ld, which):
            out = []
            for e in which:
                ld.set_epoch(e)
                out.append([b.sample_ids.tolist() for b in ld])
            return out

        # In sequence (each next epoch asked ahead is used), after a skip (the one asked ahead
        # is dropped), and a restart of the same epoch after a partial iteration.
        which = [0, 1, 2, 7, 8]
        plain = epochs(loader(), which)
        ahead = loader(prefetch_next_epoch=True)
        self.assertIsNone(ahead.prefetched_epoch)
        self.assertEqual(epochs(ahead, which), plain)
        self.assertEqual(ahead.prefetched_epoch, 9)
        self.assertIsNone(loader().prefetched_epoch)
        ahead.set_epoch(8)
        it = iter(ahead)
        next(it)
        del it
        self.assertEqual(epochs(ahead, [8]), plain[-1:])

    def test_a_corrupt_sample_raises_naming_file_and_sample(self):
        with open(os.path.join(DATA, "corrupt.txt")) as f:
            shard, sample = f.read().split()
        raised = []
        it = iter(loader("corrupt"))
        while True:
            try:
                next(it)
            except StopIteration:
                break
            except gpufeed.SampleError as e:
                raised.append(str(e))
        self.assertEqual(len(raised), 1, raised)
        self.assertIn(shard, raised[0])
        self.assertIn(f"sample {sample}", raised[0])
        self.assertTrue(issubclass(gpufeed.SampleError, gpufeed.GpufeedError))
        marked = [(b, i) for b in loader("corrupt", on_error="mark") for i, _ in b.errors]
        self.assertEqual(len(marked), 1)
        b, i = marked[0]
        self.assertEqual(np.from_dlpack(b.lengths)[i], -1)

    def test_verify_names_the_damaged_sample(self):
        with open(os.path.join(DATA, "corrupt.txt")) as f:
            shard, sample = f.read().split()
        good = gpufeed.verify(os.path.join(DATA, "good"))
        self.assertTrue(good["ok"])
        self.assertEqual(good["samples"], len(samples()))
        self.assertTrue(good["checksums"])
        bad = gpufeed.verify(os.path.join(DATA, "corrupt"))
        self.assertFalse(bad["ok"])
        self.assertEqual(bad["bad_total"], 1)
        self.assertEqual(bad["samples"], len(samples()))
        self.assertIn(shard, bad["bad"][0]["path"])
        # Shards are verified one by one: the sample number is the shard's own, the key the
        # dataset's (the loader's message numbers samples across the dataset).
        self.assertIn(f'key "{int(sample)}"', bad["bad"][0]["message"])
        with self.assertRaises(gpufeed.GpufeedError):
            gpufeed.verify("/nonexistent/dataset")

    def test_long_work_reports_to_a_python_function(self):
        import tempfile

        seen = []
        with tempfile.TemporaryDirectory() as root:
            for c in ("cat", "dog", "eel"):
                os.mkdir(os.path.join(root, c))
                for i in range(2):
                    with open(os.path.join(root, c, f"{i}.jpg"), "wb") as f:
                        f.write(b"\xff\xd8\xff\xe0" + bytes(100) + b"\xff\xd9")
            gpufeed.set_progress(lambda *e: seen.append(e))
            try:
                gpufeed.Loader(root, batch_size=2)
            finally:
                gpufeed.set_progress(None)
            self.assertIn((f"listing {root}", 3, 3, "folders", True), seen)
            # Back to the line on stderr: nothing more reaches the function.
            n = len(seen)
            gpufeed.Loader(root, batch_size=2)
            self.assertEqual(len(seen), n)

    def test_bad_arguments_and_missing_files_are_exceptions(self):
        with self.assertRaises(gpufeed.GpufeedError):
            gpufeed.Loader("/nonexistent/dataset", batch_size=8)
        with self.assertRaises(ValueError):
            loader(order="sideways")
        with self.assertRaises(ValueError):
            loader(device="tpu")

    @property
    def cache(self):
        d = tempfile.mkdtemp()
        self.addCleanup(shutil.rmtree, d, True)
        return d

    def test_malformed_store_settings_are_errors_never_panics(self):
        # object_store panicked on these at the first request: PanicException, which
        # `except Exception` does not catch.
        for name, value in [
            ("AWS_ENDPOINT_URL", "http://h:99999"),
            ("AWS_ENDPOINT_URL", "not a url"),
            ("AWS_ENDPOINT_URL_S3", "http://"),
            ("AWS_REGION", "a b"),
            ("AWS_SESSION_TOKEN", "a\nb"),
        ]:
            saved = os.environ.get(name)
            os.environ[name] = value
            try:
                with self.assertRaises(gpufeed.GpufeedError) as c:
                    gpufeed.Loader("s3://bucket/prefix", batch_size=8, cache_dir=self.cache)
                self.assertIn(name, str(c.exception))
            finally:
                if saved is None:
                    del os.environ[name]
                else:
                    os.environ[name] = saved

    def test_timeout_bounds_the_open_of_a_store_that_never_answers(self):
        # A server that accepts connections, reads, and never answers: the open took 120 s,
        # silently, whatever timeout= said.
        import socket
        import threading
        import time

        srv = socket.socket()
        srv.bind(("127.0.0.1", 0))
        srv.listen(16)
        held = []

        def serve():
            while True:
                try:
                    c, _ = srv.accept()
                except OSError:
                    return
                held.append(c)

        threading.Thread(target=serve, daemon=True).start()
        env = dict(
            AWS_ENDPOINT_URL="http://127.0.0.1:%d" % srv.getsockname()[1],
            AWS_ACCESS_KEY_ID="k",
            AWS_SECRET_ACCESS_KEY="s",
            AWS_REGION="us-east-1",
        )
        saved = {k: os.environ.get(k) for k in env}
        os.environ.update(env)
        try:
            t0 = time.monotonic()
            with self.assertRaises(gpufeed.GpufeedError) as c:
                gpufeed.Loader(
                    "s3://bucket/prefix", batch_size=8, timeout=1.5, cache_dir=self.cache
                )
            took = time.monotonic() - t0
            self.assertIn("timeout", str(c.exception))
            self.assertLess(took, 4.0, str(c.exception))
        finally:
            for k, v in saved.items():
                if v is None:
                    del os.environ[k]
                else:
                    os.environ[k] = v
            srv.close()
            for c in held:
                c.close()

    def test_rank_and_world_size_default_to_torch_distributed_env(self):
        os.environ.update(RANK="1", WORLD_SIZE="4")
        try:
            ld = loader()
        finally:
            del os.environ["RANK"], os.environ["WORLD_SIZE"]
        self.assertEqual((ld.rank, ld.world_size), (1, 4))
        self.assertEqual(len(ld), -(-(-(-ld.num_samples // 4)) // 8))

    def test_no_gpu_is_an_exception_not_a_crash(self):
        ok, why = gpufeed.gpu_available()
        if ok:
            self.skipTest(f"a GPU is present: {why}")
        with self.assertRaises(gpufeed.GpufeedError) as c:
            loader(device="cuda:0")
        self.assertTrue("CUDA" in str(c.exception) or "GPU" in str(c.exception))


@unittest.skipUnless(DATA, "GPUFEED_TEST_DATA is not set (tests/it/python.rs sets it)")
class StatsTests(unittest.TestCase):
    def test_stats_say_where_the_waiting_went(self):
        l = loader()
        n, waited, read = 0, 0.0, 0.0
        for batch in l:
            t = batch.timing
            waited += t["stall"]["total_s"]
            read += t["read_s"]
            n += len(batch)
        st = l.stats()
        self.assertEqual(st["samples"], n)
        # The epoch's figures are its batches' figures summed; the groups took time to read.
        self.assertAlmostEqual(st["stall"]["total_s"], waited, places=9)
        self.assertGreater(read, 0.0)
        self.assertIn(st["bound"], ("storage", "remote", "copy", "verify", "decode", "other"))
        parts = st["stall"]
        self.assertAlmostEqual(
            parts["total_s"],
            sum(
                parts[k]
                for k in ("storage_s", "remote_s", "copy_s", "verify_s", "decode_s", "other_s")
            ),
            places=9,
        )
        self.assertGreaterEqual(st["read_amplification"], 1.0)
        self.assertGreater(st["reads_per_sample"], 0.0)
        self.assertGreaterEqual(st["io_thread_cpu_s"], 0.0)
        self.assertIsNone(st["device_phases"], "bytes on the host: no device image path")
        # The memory the loader holds: 4 slots (prefetch + in flight) sized from the work, the
        # index, no device memory on the host.
        m = st["memory"]
        self.assertEqual(m["arena_bytes"], 4 * m["slot_bytes"])
        self.assertEqual(m["slot_bytes"] % (2 << 20), 0)
        self.assertLess(m["arena_bytes"], 64 << 20)  # a small test set: no 128 MiB floor
        self.assertGreater(m["index_bytes"], 0)
        self.assertEqual(m["device_bytes"], 0)



def _iterate_in_child(l, q):
    try:
        n = sum(len(b) for b in l)
        q.put(f"ok {n}")
    except Exception as e:  # the error the child must see
        q.put(f"{type(e).__name__}: {e}")


@unittest.skipUnless(DATA, "GPUFEED_TEST_DATA is not set (tests/it/python.rs sets it)")
class ForkTests(unittest.TestCase):
    def test_a_loader_used_in_a_forked_child_raises_at_once(self):
        import multiprocessing as mp

        l = loader()
        first = sum(len(b) for b in l)  # the I/O thread runs in this process
        ctx = mp.get_context("fork")
        q = ctx.Queue()
        p = ctx.Process(target=_iterate_in_child, args=(l, q))
        p.start()
        p.join(timeout=30)
        if p.is_alive():
            p.kill()
            self.fail("the child hung iterating a loader built before fork()")
        msg = q.get(timeout=5)
        self.assertIn("after fork()", msg)
        self.assertIn("spawn", msg)  # it says what to do
        # The parent's loader goes on.
        self.assertEqual(sum(len(b) for b in l), first)


@unittest.skipUnless(DATA, "GPUFEED_TEST_DATA is not set (tests/it/python.rs sets it)")
class ThreadTests(unittest.TestCase):
    def _drain(self, it, out, errors):
        try:
            for b in it:
                out.extend(b.keys)
                data = np.from_dlpack(b.data)
                offsets, lengths = np.from_dlpack(b.offsets), np.from_dlpack(b.lengths)
                for i, key in enumerate(b.keys):
                    got = data[offsets[i] : offsets[i] + lengths[i]]
                    np.testing.assert_array_equal(got, expected(key, lengths[i]), key)
        except Exception as e:  # noqa: BLE001 - reported to the main thread
            errors.append(e)

    def _two_threads(self, iterable):
        """Drains `iterable` from two threads at once; the keys each one got."""
        import threading

        got = [[], []]
        errors = []
        ts = [threading.Thread(target=self._drain, args=(iterable, got[k], errors)) for k in range(2)]
        for t in ts:
            t.start()
        for t in ts:
            t.join(timeout=60)
            self.assertFalse(t.is_alive(), "a thread hung")
        self.assertEqual(errors, [])
        return got

    def test_one_epoch_iterated_from_two_threads_shares_its_batches(self):
        want = samples()
        l = loader()
        got = self._two_threads(iter(l))
        keys = got[0] + got[1]
        self.assertEqual(sorted(keys), sorted(want), "each batch went to one thread")

    def test_one_loader_iterated_from_two_threads_gives_each_a_whole_epoch(self):
        want = samples()
        l = loader()
        got = self._two_threads(l)
        for k in range(2):
            self.assertEqual(sorted(got[k]), sorted(want), f"thread {k}")


@unittest.skipUnless(DATA, "GPUFEED_TEST_DATA is not set (tests/it/python.rs sets it)")
class Settings(unittest.TestCase):
    """Python's door to the loader settings' table (the Rust, C and CLI doors are held to it
    by tests/it/capi.rs)."""

    def setUp(self):
        self.env = {k: os.environ.pop(k) for k in ("RANK", "WORLD_SIZE") if k in os.environ}

    def tearDown(self):
        os.environ.update(self.env)

    def test_every_setting_has_the_tables_default(self):
        l = gpufeed.Loader(os.path.join(DATA, "good"))
        want = {k: (None if d == "none" else d) for k, (d, _unit, _help) in gpufeed.LOADER_SETTINGS.items()}
        self.assertEqual(l.settings, want)
        self.assertEqual(want["batch_size"], "256")
        # Every setting is an argument of Loader, None meaning the default.
        import inspect

        params = inspect.signature(gpufeed.Loader).parameters
        for name in gpufeed.LOADER_SETTINGS:
            self.assertIn(name, params)
            self.assertIsNone(params[name].default, name)

    def test_every_setting_given_reaches_the_loader(self):
        given = dict(
            batch_size=16, order="block", seed=9, rank=1, world_size=2, prefetch=3, in_flight=4,
            last_batch="pad", verify=False, on_error="mark", shuffle_buffer=77,
            block_bytes="64K", open_blocks=3, queue_depth=16, memory_budget=64 << 20,
            timeout=2.5, open_files_max=4, prefetch_next_epoch=True,
        )
        untested = set(gpufeed.LOADER_SETTINGS) - set(given)
        self.assertEqual(untested, {"device"}, "a CUDA device needs a GPU")
        l = gpufeed.Loader(os.path.join(DATA, "good"), **given)
        s = l.settings
        self.assertEqual(s["block_bytes"], "65536")
        self.assertEqual(s["timeout"], "2.5")
        self.assertEqual(s["verify"], "false")
        for k, v in given.items():
            if k not in ("block_bytes", "verify", "prefetch_next_epoch"):
                self.assertEqual(s[k], str(v), k)
        self.assertEqual(s["prefetch_next_epoch"], "true")
        # A pickled loader is made anew with the same settings.
        import pickle

        self.assertEqual(pickle.loads(pickle.dumps(l)).settings, s)
        # torchrun's environment, and the errors of the table.
        os.environ["RANK"], os.environ["WORLD_SIZE"] = "1", "2"
        try:
            self.assertEqual(gpufeed.Loader(os.path.join(DATA, "good")).settings["rank"], "1")
        finally:
            del os.environ["RANK"], os.environ["WORLD_SIZE"]
        with self.assertRaises(ValueError) as c:
            gpufeed.Loader(os.path.join(DATA, "good"), queue_depth=5000)
        self.assertIn("queue_depth must be in 1..=4096", str(c.exception))
        with self.assertRaises(ValueError) as c:
            gpufeed.Loader(os.path.join(DATA, "good"), timeout=0)
        self.assertIn("timeout", str(c.exception))


if __name__ == "__main__":
    unittest.main()


@unittest.skipUnless(DATA, "GPUFEED_TEST_DATA is not set (tests/it/python.rs sets it)")
class WhatATorchUserReachesFor(unittest.TestCase):
    """Issue 36, item 5: classes, reprs, resume mismatches in Python's words, and the batch a
    SampleError carries."""

    def images_with_one_cut(self, d):
        shutil.copytree(os.path.join(DATA, "slow-images"), os.path.join(d, "imgs"))
        files = sorted(glob.glob(os.path.join(d, "imgs", "*", "*")))
        with open(files[17], "r+b") as f:
            f.truncate(300)
        return os.path.join(d, "imgs"), os.path.basename(files[17])

    def test_classes_are_torchvisions(self):
        with tempfile.TemporaryDirectory(dir=DATA) as d:
            root = os.path.join(d, "folder")
            for c in ("zebra", "Apple", "ant", "b10", "b9"):
                os.makedirs(os.path.join(root, c))
                shutil.copy(glob.glob(os.path.join(DATA, "slow-images", "*", "*"))[0],
                            os.path.join(root, c, "x.jpg"))
            ld = gpufeed.Loader(root, batch_size=2)
            # torchvision's find_classes: the subfolders' names, sorted.
            want = sorted(e.name for e in os.scandir(root) if e.is_dir())
            self.assertEqual(ld.classes, want)
            self.assertEqual(ld.class_to_idx, {c: i for i, c in enumerate(want)})
            labels = {}
            for b in ld:
                for k, y in zip(b.keys, np.from_dlpack(b.labels)):
                    labels[k.split("/")[0]] = int(y)
            self.assertEqual(labels, ld.class_to_idx)
        self.assertEqual(loader().classes, [])

    def test_names_that_are_not_utf8_are_torchvisions(self):
        # Two class folders and two files whose names differ only in a byte that is not UTF-8:
        # distinct names, as os.fsdecode (and so torchvision) gives them, not one lossy name.
        with tempfile.TemporaryDirectory(dir=DATA) as d:
            root = os.path.join(d, "odd").encode()
            src = glob.glob(os.path.join(DATA, "slow-images", "*", "*"))[0]
            for c in (b"c\xfe", b"c\xff"):
                os.makedirs(os.path.join(root, c))
                for f in (b"x\xfe.jpg", b"x\xff.jpg"):
                    shutil.copy(src, os.path.join(root, c, f))
            ld = gpufeed.Loader(os.fsdecode(root), batch_size=4, order="sequential")
            want = sorted(e.name for e in os.scandir(os.fsdecode(root)) if e.is_dir())
            self.assertEqual(ld.classes, want)
            self.assertEqual(len(set(ld.classes)), 2)
            self.assertEqual(ld.class_to_idx, {c: i for i, c in enumerate(want)})
            keys = [k for b in ld for k in b.keys]
            self.assertEqual(len(set(keys)), 4)
            for k in keys:
                self.assertTrue(os.path.isfile(os.path.join(os.fsdecode(root), k)), k)

    def test_reprs_say_what_a_user_needs(self):
        img = gpufeed.Images("eval", size=(32, 48), dtype="uint8")
        self.assertIn("size=(32, 48)", repr(img))
        self.assertIn("'eval'", repr(img))
        self.assertNotIn("flip_p", repr(img))  # defaults left out
        self.assertIn("flip_p=0.2", repr(gpufeed.Images("train", flip_p=0.2)))
        ld = loader(batch_size=8)
        r = repr(ld)
        for part in ("240 samples", "batch_size=8", "30 batches per epoch", "packed", 'device="cpu"'):
            self.assertIn(part, r)
        b = next(iter(ld))
        self.assertIn("8 samples", repr(b))
        self.assertIn("batch 0", repr(b))
        ib = next(iter(gpufeed.Loader(os.path.join(DATA, "slow-images"), batch_size=4, images=img)))
        self.assertIn("[4, 3, 32, 48] uint8", repr(ib))

    def test_a_resume_mismatch_names_the_setting_in_python_words(self):
        state = loader(world_size=8, rank=0).state_dict()
        with self.assertRaises(ValueError) as e:
            loader(world_size=8, rank=1).load_state_dict(state)
        self.assertIn("saved by rank 0 of 8", str(e.exception))
        self.assertIn("load rank 1's", str(e.exception))
        with self.assertRaises(ValueError) as e:
            loader(world_size=8, rank=0, seed=5, batch_size=4).load_state_dict(state)
        msg = str(e.exception)
        self.assertIn("seed=3 when saved, 5 here", msg)
        self.assertNotIn("Settings", msg)
        self.assertNotIn("shuffle_buffer", msg)  # only what differs
        # The order's parameters shape its batches: another buffer or block size is refused.
        sb = loader(order="shard-buffer", shuffle_buffer=40).state_dict()
        with self.assertRaisesRegex(ValueError, "shuffle_buffer=40 when saved, 80 here"):
            loader(order="shard-buffer", shuffle_buffer=80).load_state_dict(sb)
        bl = loader(order="block", block_bytes=64 << 10).state_dict()
        with self.assertRaisesRegex(ValueError, "block_bytes=65536 when saved, 131072 here"):
            loader(order="block", block_bytes=128 << 10).load_state_dict(bl)
        # Fields of the wrong kind are named.
        with self.assertRaisesRegex(ValueError, "state's \"batch\" is -1"):
            loader().load_state_dict(dict(loader().state_dict(), batch=-1))
        with self.assertRaisesRegex(ValueError, "state has no \"epoch\""):
            loader().load_state_dict({})
        # Another rank count is a resume, not a mismatch; another seed with it still is one.
        loader(world_size=6, rank=5).load_state_dict(state)
        with self.assertRaises(ValueError) as e:
            loader(world_size=6, rank=0, seed=4).load_state_dict(state)
        self.assertIn("seed=3 when saved, 4 here", str(e.exception))
        self.assertNotIn("world_size", str(e.exception).split("—")[0])
        with tempfile.TemporaryDirectory(dir=DATA) as d:
            path = os.path.join(d, "train.bin")
            np.arange(4000, dtype=np.uint16).tofile(path)
            state = gpufeed.Loader(path, batch_size=4, format="tokens", seq_len=64).state_dict()
            with self.assertRaises(ValueError) as e:
                gpufeed.Loader(path, batch_size=4, format="tokens", seq_len=128,
                               stride=32).load_state_dict(state)
            self.assertIn("seq_len=64 when saved, 128 here", str(e.exception))
            self.assertIn("stride=None when saved, 32 here", str(e.exception))
            # Another corpus of as many windows is not this one.
            other = os.path.join(d, "val.bin")
            np.arange(4000, 8000, dtype=np.uint16).tofile(other)
            with self.assertRaisesRegex(ValueError, "the dataset's files"):
                gpufeed.Loader(other, batch_size=4, format="tokens",
                               seq_len=64).load_state_dict(state)

    def test_a_sample_error_carries_its_batch_and_the_pass_goes_on(self):
        with tempfile.TemporaryDirectory(dir=DATA) as d:
            root, bad = self.images_with_one_cut(d)
            img = gpufeed.Images("eval", size=24, dtype="uint8")
            marked = {}
            for b in gpufeed.Loader(root, batch_size=8, order="sequential", on_error="mark", images=img):
                x = np.from_dlpack(b.images)
                for i, sid in enumerate(np.from_dlpack(b.sample_ids)):
                    marked[int(sid)] = x[i].copy()
            seen, errors = {}, []
            it = iter(gpufeed.Loader(root, batch_size=8, order="sequential", images=img))
            while True:
                try:
                    b = next(it)
                except StopIteration:
                    break
                except gpufeed.SampleError as e:
                    errors.append(e)
                    b = e.batch
                    self.assertEqual(len(e.errors), 1)
                    i = e.errors[0][0]
                    self.assertEqual(int(np.from_dlpack(b.failed)[i]), 1)
                    self.assertIn(bad, b.keys[i])
                    # Pickled (a worker's error to its parent) by its message and errors.
                    back = pickle.loads(pickle.dumps(e))
                    self.assertEqual((str(back), back.errors, back.batch), (str(e), e.errors, None))
                x = np.from_dlpack(b.images)
                for i, sid in enumerate(np.from_dlpack(b.sample_ids)):
                    seen[int(sid)] = x[i].copy()
            self.assertEqual(len(errors), 1)
            self.assertIn(bad, str(errors[0]))
            self.assertEqual(sorted(seen), list(range(104)))
            for sid, x in marked.items():
                np.testing.assert_array_equal(seen[sid], x)

