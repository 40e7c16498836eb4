"""gpufeed: keeps GPUs fed with training data.

io_uring O_DIRECT reads into pinned, registered buffers; a batch planner that turns a shuffled
epoch into few, large reads; batches handed over without a copy through DLPack.

Example::

    import gpufeed, torch
    loader = gpufeed.Loader("/nvme/imagenet-gpf", batch_size=256, device="cuda")
    for epoch in range(90):
        loader.set_epoch(epoch)
        for batch in loader:
            data = torch.from_dlpack(batch.data)        # uint8, on the GPU, no copy
            offsets = torch.from_dlpack(batch.offsets)  # int64, host
            lengths = torch.from_dlpack(batch.lengths)
            labels = torch.from_dlpack(batch.labels)

Decoded images (JPEG → augmented tensors on the CPU decode threads)::

    loader = gpufeed.Loader("/data/imagenet/train", batch_size=256,
                            images=gpufeed.Images("train", size=224, dtype=torch.float16))
    for batch in loader:
        x = torch.from_dlpack(batch.images)   # [256, 3, 224, 224] float16, no copy
        y = torch.from_dlpack(batch.labels)

A bad sample (truncated, corrupt, failing its checksum) raises ``gpufeed.SampleError`` naming the
file, the sample and what was wrong (``on_error="raise"``, the default); the error carries the
batch (``err.batch``: its good samples intact, the bad ones flagged in ``failed`` / ``lengths``
and ``err.errors``) and the pass goes on at the next batch. ``on_error="mark"`` hands such
batches out without raising.

``gpufeed.torch`` (imported only when you import it) gives torch tensors directly, and a
``torch.utils.data.IterableDataset`` for code that wants a ``DataLoader``.

Resuming: ``loader.state_dict()`` goes in the checkpoint; after a restart,
``loader.load_state_dict(saved)`` and the usual loop (``for epoch in range(saved["epoch"], E):
loader.set_epoch(epoch); for batch in loader: ...``) yields exactly the batches the
interrupted run had not yet yielded, then the following epochs.
"""

import copyreg

from ._gpufeed import (
    DATASET_OPTIONS,
    IMAGE_SETTINGS,
    LOADER_SETTINGS,
    Batch,
    Buffer,
    DatasetWarning,
    GpufeedError,
    ImageBatch,
    Images,
    Loader,
    SampleError,
    __version__,
    gpu_available,
    set_progress,
    verify,
)


def _reduce_sample_error(e):
    """Pickles a ``SampleError`` by its message and ``errors``: the batch it carries
    (``e.batch``) holds the loader's buffers and stays in this process (``None`` elsewhere)."""
    return (SampleError, e.args, {"batch": None, "errors": getattr(e, "errors", [])})


copyreg.pickle(SampleError, _reduce_sample_error)


def _rebuild(cls, kwargs):
    """Unpickles a gpufeed object made from keyword arguments (``Images``)."""
    return cls(**kwargs)


def _rebuild_loader(kwargs, state):
    """Unpickles a ``Loader``: made anew from its arguments, at the point it had reached."""
    loader = Loader(**kwargs)
    loader.load_state_dict(state)
    return loader


__all__ = [
    "DATASET_OPTIONS",
    "IMAGE_SETTINGS",
    "LOADER_SETTINGS",
    "Batch",
    "Buffer",
    "DatasetWarning",
    "GpufeedError",
    "ImageBatch",
    "Images",
    "Loader",
    "SampleError",
    "__version__",
    "gpu_available",
    "set_progress",
    "verify",
]
