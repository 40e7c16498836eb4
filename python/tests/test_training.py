"""Training the way PyTorch users train (issue 22): slow steps and pauses never kill an epoch,
two passes over one loader both work, the usual resume loop resumes, errors and loaders cross
process boundaries, and the torch habits (sizes, dtypes, a sequential order, a new order each
pass) hold. numpy only; the torch glue is tested where torch is installed.

Run by ``tests/it/python.rs``: ``GPUFEED_TEST_DATA`` holds ``good/`` (240 samples in packed
shards; sample ``i`` is ``(i * 7 + j * 13) % 256`` for its length), ``slow-bytes/`` and
``slow-images/`` (104 samples each) and ``samples.txt``.
"""

import glob
import json
import multiprocessing
import os
import pickle
import shutil
import subprocess
import sys
import tempfile
import time
import unittest
import warnings

import numpy as np

import gpufeed

DATA = os.environ.get("GPUFEED_TEST_DATA", "")
HERE = os.path.dirname(os.path.abspath(__file__))


def good(**kw):
    args = dict(batch_size=8, seed=3)
    args.update(kw)
    return gpufeed.Loader(os.path.join(DATA, "good"), **args)


def ids_of(batch):
    return [int(i) for i in np.from_dlpack(batch.sample_ids)]


def open_missing(path):
    """In a spawned worker: opening a dataset that does not exist raises GpufeedError."""
    gpufeed.Loader(path, batch_size=4)


try:
    import torch  # noqa: F401

    HAVE_TORCH = True
except ImportError:
    HAVE_TORCH = False


@unittest.skipUnless(DATA, "GPUFEED_TEST_DATA is not set (tests/it/python.rs sets it)")
class SlowConsumer(unittest.TestCase):
    def test_a_90_s_pause_and_10_s_steps_finish_every_epoch_byte_and_image_one_and_two_ranks(self):
        # Every scenario at once (they are sleeps): one process per rank, as torchrun runs them.
        runs = []
        for kind in ("bytes", "images"):
            for pace in ("pause", "slow"):
                for world in (1, 2):
                    procs = []
                    for rank in range(world):
                        env = dict(os.environ, RANK=str(rank), WORLD_SIZE=str(world))
                        procs.append(subprocess.Popen(
                            [sys.executable, os.path.join(HERE, "slow_consumer.py"), kind, pace,
                             os.path.join(DATA, f"slow-{kind}")],
                            env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True))
                    runs.append((kind, pace, world, procs))
        for kind, pace, world, procs in runs:
            seen = []
            for p in procs:
                out, err = p.communicate(timeout=400)
                self.assertEqual(p.returncode, 0, f"{kind} {pace} {world} ranks:\n{err}")
                seen.extend(json.loads(out.strip().splitlines()[-1]))
            self.assertEqual(sorted(seen), list(range(104)), f"{kind} {pace} {world} ranks")

    def test_a_timeout_is_opt_in_and_speaks_python(self):
        ld = good(prefetch=1, timeout=0.3)
        self.assertEqual(ld.timeout, 0.3)
        self.assertIsNone(good().timeout)
        it = iter(ld)
        kept = []
        with self.assertRaises(gpufeed.GpufeedError) as cm:
            for _ in range(len(ld)):
                kept.append(next(it))
        msg = str(cm.exception)
        for part in ("timeout= is 0.3 s", "prefetch= 1 + 2 in flight",
                     "handed out and are still alive", "copy what you keep"):
            self.assertIn(part, msg)
        self.assertNotIn("prefetch_groups", msg)
        # The pass goes on once the batches are given back, every sample once.
        got = [i for b in kept for i in ids_of(b)]
        del kept
        got += [i for b in it for i in ids_of(b)]
        self.assertEqual(sorted(got), list(range(240)))
        for bad in (0, -1, float("nan")):
            with self.assertRaises(ValueError):
                good(timeout=bad)


@unittest.skipUnless(DATA, "GPUFEED_TEST_DATA is not set")
class TwoPasses(unittest.TestCase):
    def test_a_kept_iterator_does_not_block_a_new_pass_and_resumes_where_it_stood(self):
        ld = good(prefetch=1)
        it = iter(ld)
        first = next(it)
        t0 = time.monotonic()
        second = [i for b in ld for i in ids_of(b)]  # as `for b in loader:` after a peek
        self.assertLess(time.monotonic() - t0, 20, "the new pass waited for the kept one")
        self.assertEqual(sorted(second), list(range(240)))
        # The kept one goes on from its second batch: with its first, every sample once.
        rest = [i for b in it for i in ids_of(b)]
        self.assertEqual(sorted(ids_of(first) + rest), list(range(240)))

    def test_two_passes_used_in_turn_each_deliver_every_sample_once(self):
        # zip keeps the previous batch of each pass while taking the next: three batches of
        # three read groups alive at once (a resumed pass reads its group anew), so the
        # default four buffers, not three.
        ld = good(batch_size=16)
        a, b = iter(ld), iter(ld)
        got_a, got_b = [], []
        for ba, bb in zip(a, b):
            got_a += ids_of(ba)
            got_b += ids_of(bb)
        self.assertEqual(sorted(got_a), list(range(240)))
        self.assertEqual(got_a, got_b, "the same epoch, the same order")


@unittest.skipUnless(DATA, "GPUFEED_TEST_DATA is not set")
class Resume(unittest.TestCase):
    def _epoch(self, ld):
        return [ids_of(b) for b in ld]

    def test_the_usual_resume_loop_resumes(self):
        whole = {}
        ref = good()
        for e in (2, 3):
            ref.set_epoch(e)
            whole[e] = self._epoch(ref)
        n = len(ref)
        # A run stopped after 10 batches of epoch 2.
        run = good()
        run.set_epoch(2)
        it = iter(run)
        done = [ids_of(next(it)) for _ in range(10)]
        saved = run.state_dict()
        self.assertEqual((saved["epoch"], saved["batch"]), (2, 10))
        del it
        # The restart: load, then the loop every trainer writes.
        again = good()
        again.load_state_dict(saved)
        self.assertEqual(again.state_dict()["batch"], 10)
        got = {}
        with warnings.catch_warnings():
            warnings.simplefilter("error")  # no warning on the usual loop
            for e in range(saved["epoch"], 4):
                again.set_epoch(e)
                got[e] = self._epoch(again)
        self.assertEqual(len(got[2]), n - 10, "only the batches not yet yielded")
        self.assertEqual(done + got[2], whole[2])
        self.assertEqual(got[3], whole[3])

    def test_state_dict_says_the_epoch_set(self):
        ld = good()
        ld.set_epoch(5)
        self.assertEqual((ld.state_dict()["epoch"], ld.state_dict()["batch"]), (5, 0))
        for _ in ld:
            pass
        self.assertEqual((ld.state_dict()["epoch"], ld.state_dict()["batch"]), (6, 0))

    def test_another_epoch_drops_a_resume_point_with_a_warning(self):
        st = good().state_dict()
        st.update(epoch=1, batch=4)
        ld = good()
        ld.load_state_dict(st)
        with self.assertWarns(UserWarning) as cm:
            ld.set_epoch(7)
        self.assertIn("replaces the resume point", str(cm.warning))
        self.assertEqual(sum(1 for _ in ld), len(ld), "epoch 7 from its start")

    def test_without_set_epoch_each_finished_pass_reads_the_next_epoch(self):
        ld = good()
        first = self._epoch(ld)
        second = [(b.epoch, ids_of(b)) for b in ld]  # batches are not kept: memory returns
        self.assertEqual({e for e, _ in second}, {1})
        self.assertNotEqual(first, [ids for _, ids in second], "a new order")
        # An unfinished pass is read again from its start.
        ld2 = good()
        it = iter(ld2)
        next(it)
        del it
        self.assertEqual({b.epoch for b in ld2}, {0})  # a set of ints: batches are dropped


@unittest.skipUnless(DATA, "GPUFEED_TEST_DATA is not set")
class AcrossProcesses(unittest.TestCase):
    def test_errors_pickle_to_the_same_type_and_message(self):
        for cls in (gpufeed.GpufeedError, gpufeed.SampleError, gpufeed.DatasetWarning):
            e = pickle.loads(pickle.dumps(cls("sample 3 (x.gpf): bad crc")))
            self.assertIs(type(e), cls)
            self.assertEqual(str(e), "sample 3 (x.gpf): bad crc")
            self.assertEqual(cls.__module__, "gpufeed")

    def test_an_error_in_a_spawned_worker_reaches_the_parent(self):
        ctx = multiprocessing.get_context("spawn")
        missing = os.path.join(DATA, "no-such-dataset")
        with ctx.Pool(1) as pool:
            with self.assertRaises(gpufeed.GpufeedError) as cm:
                pool.apply(open_missing, (missing,))
        self.assertIn("no-such-dataset", str(cm.exception))

    def test_a_loader_pickles_into_the_same_loader_at_the_same_point(self):
        ld = good(order="block", block_bytes=64 << 10, open_blocks=3, prefetch=3,
                  images=None, last_batch="pad", world_size=3, rank=1)
        ld.set_epoch(4)
        it = iter(ld)
        next(it)
        copy = pickle.loads(pickle.dumps(ld))
        self.assertEqual(copy.state_dict(), ld.state_dict())
        self.assertEqual(copy.init_kwargs(), ld.init_kwargs())
        self.assertEqual([ids_of(b) for b in copy], [ids_of(b) for b in it])
        img = gpufeed.Images("eval", size=(48, 64), dtype="float16", resize=80)
        back = pickle.loads(pickle.dumps(img))
        self.assertEqual(repr(back), repr(img))

    def test_unknown_arguments_list_the_loaders_own_too(self):
        with self.assertRaises(TypeError) as cm:
            good(prefetch_groups=2)
        msg = str(cm.exception)
        self.assertIn("did you mean \"prefetch\"", msg)
        self.assertIn("batch_size", msg)
        self.assertIn("timeout", msg)
        self.assertIn("tfrecord_index", msg)
        # The list is the signature's (text_signature), dataset options and the private
        # _batch_part (gpufeed.torch's DataLoader workers) aside.
        import inspect

        params = [p for p in inspect.signature(gpufeed.Loader).parameters
                  if p not in ("dataset",) and not p.startswith("_")]
        for p in params:
            self.assertIn(p, msg)


@unittest.skipUnless(DATA, "GPUFEED_TEST_DATA is not set")
class TorchHabits(unittest.TestCase):
    def test_size_height_width_and_dtypes_as_torch_writes_them(self):
        class TorchLikeDtype:  # what str(torch.float16) is, without torch
            def __str__(self):
                return "torch.float16"

        dtypes = ["float16", np.float16, np.dtype("float16"), TorchLikeDtype()]
        if HAVE_TORCH:
            dtypes.append(torch.float16)
        for dt in dtypes:
            ld = gpufeed.Loader(os.path.join(DATA, "slow-images"), batch_size=8,
                                images=gpufeed.Images("eval", size=(40, 56), dtype=dt))
            b = next(iter(ld))
            x = np.from_dlpack(b.images)
            self.assertEqual(x.shape, (8, 3, 40, 56), dt)
            self.assertEqual(x.dtype, np.float16, dt)
        with self.assertRaises(ValueError):
            gpufeed.Images(dtype="int7")
        with self.assertRaises(ValueError):
            gpufeed.Images(size=(1, 2, 3))

    def test_a_sequential_order_for_evaluation(self):
        seen = []
        for rank in range(3):
            ld = good(order="sequential", rank=rank, world_size=3)
            first = [i for b in ld for i in ids_of(b)]
            ld.set_epoch(9)
            self.assertEqual(first, [i for b in ld for i in ids_of(b)], "the same every epoch")
            self.assertEqual(first, sorted(first), "the dataset's own order")
            seen += first
        self.assertEqual(seen, list(range(240)))

    def test_decode_threads_follow_the_ranks_on_the_node(self):
        cores = len(os.sched_getaffinity(0))
        code = ("import gpufeed,sys; print(gpufeed.Loader(sys.argv[1], batch_size=8, "
                "images=gpufeed.Images()).decode_threads)")
        path = os.path.join(DATA, "slow-images")
        for env, want in (({}, cores), ({"LOCAL_WORLD_SIZE": "2"}, max(1, cores // 2)),
                          ({"GPUFEED_DECODE_THREADS": "3"}, 3)):
            e = {k: v for k, v in os.environ.items()
                 if k not in ("LOCAL_WORLD_SIZE", "GPUFEED_DECODE_THREADS")}
            e.update(env)
            out = subprocess.run([sys.executable, "-c", code, path], env=e, check=True,
                                 capture_output=True, text=True).stdout
            self.assertEqual(int(out), want, env)
        e = dict(os.environ, GPUFEED_DECODE_THREADS="lots")
        r = subprocess.run([sys.executable, "-c", code, path], env=e, capture_output=True,
                           text=True)
        self.assertNotEqual(r.returncode, 0)
        self.assertIn("GPUFEED_DECODE_THREADS", r.stderr)


@unittest.skipUnless(DATA and HAVE_TORCH, "torch is not installed (the GPU machine has it)")
class TorchGlue(unittest.TestCase):
    def test_batches_are_torch_tensors(self):
        import gpufeed.torch as gt

        ld = gpufeed.Loader(os.path.join(DATA, "slow-images"), batch_size=8,
                            images=gpufeed.Images("eval", size=32, dtype=torch.float16))
        n = 0
        for x, y in gt.batches(ld):
            self.assertEqual((x.dtype, x.shape[1:]), (torch.float16, (3, 32, 32)))
            self.assertEqual(y.dtype, torch.int64)
            n += len(y)
        self.assertEqual(n, 104)

    def test_a_dataloader_with_spawned_workers_reads_every_sample_once(self):
        import gpufeed.torch as gt
        from torch.utils.data import DataLoader

        ld = good(batch_size=8)
        ds = gt.IterableDataset(ld)
        for workers, ctx in ((0, None), (2, "spawn")):
            dl = DataLoader(ds, batch_size=None, num_workers=workers,
                            multiprocessing_context=ctx)
            # Sample i starts with byte 7i mod 256, and 183 is 7's inverse mod 256.
            seen = sorted(int(data[o]) * 183 % 256 for data, off, lens, labels in dl
                          for o in off.tolist())
            self.assertEqual(seen, list(range(240)), f"{workers} workers")

    def test_a_batch_carries_what_the_loader_knows_and_unpacks_as_before(self):
        import gpufeed.torch as gt

        with tempfile.TemporaryDirectory(dir=DATA) as d:
            # The 104 images with one cut short: evaluated on rank 0 of 3 with padding.
            shutil.copytree(os.path.join(DATA, "slow-images"), os.path.join(d, "imgs"))
            files = sorted(glob.glob(os.path.join(d, "imgs", "*", "*")))
            with open(files[10], "r+b") as f:
                f.truncate(300)
            bad = os.path.basename(files[10])
            seen, pads, failed = [], 0, []
            for rank in range(3):
                ld = gpufeed.Loader(os.path.join(d, "imgs"), batch_size=8, order="sequential",
                                    rank=rank, world_size=3, last_batch="pad", on_error="mark",
                                    images=gpufeed.Images("eval", size=24, dtype="uint8"))
                for b in gt.batches(ld):
                    images, labels = b  # as the tuple it was
                    self.assertIs(b[0], b.images)
                    self.assertEqual(len(b), 2)
                    self.assertEqual((b.kind, images.shape[1:]), ("images", (3, 24, 24)))
                    for t in (b.sample_ids, b.padding, b.failed, b.valid):
                        self.assertEqual(len(t), len(labels))
                    self.assertEqual((b.padding.dtype, b.failed.dtype), (torch.bool, torch.bool))
                    self.assertTrue(torch.equal(b.valid, ~(b.padding | b.failed)))
                    self.assertEqual(len(b.keys), len(labels))
                    for i in torch.nonzero(b.failed).flatten().tolist():
                        failed.append(os.path.basename(b.keys[i]))
                        self.assertEqual(int(images[i].abs().sum()), 0)
                        self.assertIn(i, [j for j, _ in b.errors])
                    pads += int(b.padding.sum())
                    seen += b.sample_ids[b.valid | b.failed].tolist()
                    # Through a pickle (a DataLoader worker's queue) it stays whole.
                    c = pickle.loads(pickle.dumps(b))
                    self.assertTrue(torch.equal(c.images, b.images) and c.keys == b.keys)
                    self.assertIn("padding", repr(b))
            self.assertEqual(sorted(seen), list(range(104)))
            self.assertEqual(pads, 3 * 35 - 104)
            self.assertEqual(failed, [bad])

    def test_a_dataloader_gives_the_loaders_batches_in_its_order_and_its_length(self):
        import gpufeed.torch as gt
        from torch.utils.data import DataLoader

        # 240 samples in batches of 7: 35 batches, which 2 or 3 workers do not split evenly.
        ld = good(batch_size=7, order="global", seed=9)
        ld.set_epoch(4)
        direct = [b.sample_ids.tolist() for b in gt.batches(ld)]
        self.assertEqual(len(direct), 35)
        for workers in (2, 3):
            ds = gt.IterableDataset(ld)
            ds.set_epoch(4)
            dl = DataLoader(ds, batch_size=None, num_workers=workers,
                            multiprocessing_context="spawn")
            got = [(b.index, b.sample_ids.tolist()) for b in dl]
            self.assertEqual(len(dl), len(got), f"{workers} workers")
            self.assertEqual([ids for _, ids in got], direct, f"{workers} workers")
            self.assertEqual([i for i, _ in got], list(range(35)))

    def test_a_dataloader_with_workers_resumes_where_the_state_says(self):
        import gpufeed.torch as gt
        from torch.utils.data import DataLoader

        # Stopped after 5 of 35 batches; the state loaded into a new loader whose batches reach
        # the trainer through 2 or 3 spawn-started workers: the 30 batches left, in order.
        ld = good(batch_size=7, order="global", seed=9)
        ld.set_epoch(4)
        direct = [b.sample_ids.tolist() for b in gt.batches(ld)]
        run = good(batch_size=7, order="global", seed=9)
        run.set_epoch(4)
        it = iter(run)
        for _ in range(5):
            next(it)
        state = run.state_dict()
        del it
        for workers in (2, 3):
            again = good(batch_size=7, order="global", seed=9)
            again.load_state_dict(state)
            ds = gt.IterableDataset(again)
            ds.set_epoch(4)
            dl = DataLoader(ds, batch_size=None, num_workers=workers,
                            multiprocessing_context="spawn")
            got = [(b.index, b.sample_ids.tolist()) for b in dl]
            self.assertEqual([ids for _, ids in got], direct[5:], f"{workers} workers")
            self.assertEqual([i for i, _ in got], list(range(5, 35)))

    def test_token_batches_are_nanogpts_pairs(self):
        import gpufeed.torch as gt

        with tempfile.TemporaryDirectory(dir=DATA) as d:
            path = os.path.join(d, "train.bin")
            toks = (np.arange(20_000) * 7919 % 50257).astype(np.uint16)
            toks.tofile(path)
            ld = gpufeed.Loader(path, batch_size=6, format="tokens", seq_len=64)
            n = 0
            for x, y in gt.batches(ld):
                self.assertEqual((x.dtype, x.shape[1]), (torch.int64, 64))
                n += len(x)
            for b in gt.batches(ld):
                for i, sid in enumerate(b.sample_ids.tolist()):
                    want = torch.from_numpy(toks[sid * 64 : sid * 64 + 65].astype(np.int64))
                    self.assertTrue(torch.equal(b.x[i], want[:-1]) and torch.equal(b.y[i], want[1:]))
                # The on-device gather (a CUDA batch's path) agrees with the host's pairs.
                raw = next(iter(ld))
                rows = gt._token_rows(raw, torch.from_dlpack(raw.data), torch.from_dlpack(raw.offsets),
                                      torch.from_dlpack(raw.lengths), torch.int64)
                self.assertTrue(torch.equal(rows, torch.from_dlpack(raw.tokens())))
                break
            self.assertEqual(n, ld.num_samples)

    def test_a_sample_error_does_not_end_a_pass_of_torch_batches(self):
        import gpufeed.torch as gt

        with tempfile.TemporaryDirectory(dir=DATA) as d:
            shutil.copytree(os.path.join(DATA, "slow-images"), os.path.join(d, "imgs"))
            files = sorted(glob.glob(os.path.join(d, "imgs", "*", "*")))
            for f in (files[3], files[50]):
                with open(f, "r+b") as fh:
                    fh.truncate(200)
            ld = gpufeed.Loader(os.path.join(d, "imgs"), batch_size=8, order="sequential",
                                images=gpufeed.Images("eval", size=24, dtype="uint8"))
            it = gt.batches(ld)
            seen, raised = [], 0
            while True:
                try:
                    b = next(it)
                except StopIteration:
                    break
                except gpufeed.SampleError as e:
                    raised += 1
                    b = e.batch  # a TorchBatch, its bad sample flagged
                    self.assertIsInstance(b, gt.TorchBatch)
                    self.assertEqual(int(b.failed.sum()), 1)
                seen += b.sample_ids.tolist()
            self.assertEqual((raised, sorted(seen)), (2, list(range(104))))

    def test_to_a_dtype_converts_the_images_only(self):
        import gpufeed.torch as gt

        ld = gpufeed.Loader(os.path.join(DATA, "slow-images"), batch_size=8,
                            images=gpufeed.Images("eval", size=16, dtype="uint8"))
        b = next(gt.batches(ld))
        for c in (b.to(torch.float16), b.to("cpu", torch.float16), b.to(dtype=torch.float16)):
            self.assertEqual(c.images.dtype, torch.float16)
            self.assertEqual((c.labels.dtype, c.sample_ids.dtype), (torch.int64, torch.int64))
            self.assertEqual(c.valid.dtype, torch.bool)
            self.assertTrue(torch.equal(c.images.to(torch.uint8), b.images))

    def test_dataloader_workers_follow_the_epochs(self):
        import gpufeed.torch as gt
        from torch.utils.data import DataLoader

        def epochs_of(dl):
            return sorted({b.epoch for b in dl})

        for persistent in (False, True):
            ds = gt.IterableDataset(good(batch_size=16))
            dl = DataLoader(ds, batch_size=None, num_workers=2, multiprocessing_context="spawn",
                            persistent_workers=persistent)
            # Without set_epoch a finished pass is followed by the next epoch, as the loader's.
            self.assertEqual([epochs_of(dl), epochs_of(dl)], [[0], [1]], f"persistent {persistent}")
            # set_epoch reaches the workers, persistent ones too.
            ds.set_epoch(7)
            self.assertEqual(epochs_of(dl), [7], f"persistent {persistent}")
            # A pass left early reads its epoch again.
            for i, _ in enumerate(dl):
                if i == 1:
                    break
            self.assertEqual(epochs_of(dl), [8], f"persistent {persistent}")
            del dl

    def test_a_forked_worker_is_refused_with_a_message(self):
        import gpufeed.torch as gt
        from torch.utils.data import DataLoader

        dl = DataLoader(gt.IterableDataset(good()), batch_size=None, num_workers=1,
                        multiprocessing_context="fork")
        with self.assertRaises(Exception) as cm:
            next(iter(dl))
        self.assertIn("spawn", str(cm.exception))
        # A bare Loader in a worker is refused too: every worker would read the whole epoch.
        dl = DataLoader(good(), batch_size=None, num_workers=1, multiprocessing_context="spawn")
        with self.assertRaises(Exception) as cm:
            next(iter(dl))
        self.assertIn("gpufeed.torch.IterableDataset", str(cm.exception))


if __name__ == "__main__":
    unittest.main()
