"""GPU tests of the Python package (run by scripts/gpu-check.sh on a GPU machine with torch).

``GPUFEED_GPU_DATA`` is a packed dataset. Device batches are compared with host batches of the
same loader settings (the host path is checked byte for byte against the files by the CPU
tests). With ``GPUFEED_REQUIRE_GPU=1`` a missing GPU fails instead of skipping.
"""

import os
import unittest

import numpy as np

import gpufeed

DATA = os.environ.get("GPUFEED_GPU_DATA", "")
REQUIRED = bool(os.environ.get("GPUFEED_REQUIRE_GPU"))

try:
    import torch

    HAVE_CUDA = torch.cuda.is_available()
except ImportError:  # pragma: no cover - the GPU machine has torch
    torch = None
    HAVE_CUDA = False

if REQUIRED and not (HAVE_CUDA and DATA and gpufeed.gpu_available()[0]):
    raise SystemExit(
        f"GPU required: torch cuda={HAVE_CUDA}, data={DATA!r}, gpufeed={gpufeed.gpu_available()}"
    )


def loader(device, order="global", **kw):
    return gpufeed.Loader(DATA, batch_size=64, order=order, seed=5, device=device, **kw)


@unittest.skipUnless(HAVE_CUDA and DATA, "needs torch with CUDA and GPUFEED_GPU_DATA")
class GpuTests(unittest.TestCase):
    def test_device_batches_equal_host_batches_in_every_mode(self):
        for order in ("global", "shard-buffer", "block"):
            n = 0
            for h, d in zip(loader("cpu", order), loader("cuda:0", order)):
                self.assertEqual(d.device, "cuda:0")
                self.assertEqual(d.data.__dlpack_device__(), (2, 0))
                self.assertEqual(h.sample_ids.tolist(), d.sample_ids.tolist())
                host = np.from_dlpack(h.data)
                dev = torch.from_dlpack(d.data)  # the current stream waits for the copy
                self.assertEqual(dev.device.type, "cuda")
                hoff, hlen = np.from_dlpack(h.offsets), np.from_dlpack(h.lengths)
                doff, dlen = np.from_dlpack(d.offsets), np.from_dlpack(d.lengths)
                back = dev.cpu().numpy()
                for i in range(len(h)):
                    np.testing.assert_array_equal(
                        back[doff[i] : doff[i] + dlen[i]], host[hoff[i] : hoff[i] + hlen[i]]
                    )
                n += len(h)
            self.assertEqual(n, loader("cpu", order).samples_per_epoch, order)

    def test_a_consumer_stream_waits_on_the_copy(self):
        def sample_sums(data, offsets, lengths):
            return [data[o : o + n].sum() for o, n in zip(offsets.tolist(), lengths.tolist())]

        host = []
        for b in loader("cpu"):
            host += sample_sums(np.from_dlpack(b.data).astype(np.int64), b.offsets, b.lengths)
        s = torch.cuda.Stream()
        sums = []
        with torch.cuda.stream(s):
            for b in loader("cuda:0"):
                t = torch.from_dlpack(b.data)  # __dlpack__(stream=s): s waits on the copy
                sums += sample_sums(t.to(torch.int64), b.offsets, b.lengths)  # on s
        s.synchronize()
        self.assertEqual([int(x) for x in sums], [int(x) for x in host])

    def test_device_buffer_is_shared_not_copied(self):
        b = next(iter(loader("cuda:0")))
        t = torch.from_dlpack(b.data)
        self.assertEqual(t.data_ptr(), b.data.ptr)

    def test_cupy_interop(self):
        try:
            import cupy
        except ImportError:
            self.skipTest("cupy is not installed")
        b = next(iter(loader("cuda:0")))
        c = cupy.from_dlpack(b.data)
        self.assertEqual(c.data.ptr, b.data.ptr)
        h = next(iter(loader("cpu")))
        o, n = b.offsets.tolist()[0], b.lengths.tolist()[0]
        ho, hn = h.offsets.tolist()[0], h.lengths.tolist()[0]
        np.testing.assert_array_equal(cupy.asnumpy(c[o : o + n]), np.from_dlpack(h.data)[ho : ho + hn])


if __name__ == "__main__":
    unittest.main()
