"""PyTorch glue: torch tensors from a gpufeed ``Loader``, with or without a ``DataLoader``.

Importing this module imports torch; ``import gpufeed`` alone does not.

The loop most trainers need has no ``DataLoader`` at all — gpufeed reads, checks and decodes on
its own threads, so worker processes add nothing but copies::

    import gpufeed, gpufeed.torch, torch
    loader = gpufeed.Loader("/data/imagenet/train", batch_size=256, order="block",
                            images=gpufeed.Images("train", size=224, dtype=torch.float16))
    for epoch in range(start_epoch, epochs):
        loader.set_epoch(epoch)
        for images, labels in gpufeed.torch.batches(loader, device="cuda"):
            ...   # images: [256, 3, 224, 224] float16, labels: int64

Code that must hand a dataset to a ``DataLoader`` wraps the loader in
:class:`IterableDataset` and passes ``batch_size=None`` (gpufeed batches already). With
``num_workers > 0`` the workers must be started with ``spawn`` or ``forkserver``
(``multiprocessing_context="spawn"``): each one then reads its own part of the epoch (the ranks
are split further by worker), so the epoch still delivers every sample exactly once. A forked
worker is refused with a message: a loader's I/O thread and io_uring ring do not survive
``fork``.
"""

import os

import torch
import torch.utils.data

from . import GpufeedError, Loader

__all__ = ["IterableDataset", "batches", "to_torch"]


def to_torch(batch, device=None, non_blocking=True):
    """One gpufeed batch as torch tensors, sharing gpufeed's memory (DLPack) unless moved.

    An image batch gives ``(images, labels)``; a byte batch ``(data, offsets, lengths,
    labels)``. With ``device``, the tensors are moved there (``non_blocking``: host image batches
    are pageable memory, so the copy is synchronous unless they are pinned first; a loader with
    ``device="cuda"`` delivers byte batches on the GPU already).
    """
    if hasattr(batch, "images"):
        out = (torch.from_dlpack(batch.images), torch.from_dlpack(batch.labels))
    else:
        out = (
            torch.from_dlpack(batch.data),
            torch.from_dlpack(batch.offsets),
            torch.from_dlpack(batch.lengths),
            torch.from_dlpack(batch.labels),
        )
    if device is not None:
        out = tuple(t.to(device, non_blocking=non_blocking) for t in out)
    return out


def batches(loader, device=None, non_blocking=True):
    """One pass of ``loader`` as torch tensors (:func:`to_torch` of each batch)."""
    for batch in loader:
        yield to_torch(batch, device=device, non_blocking=non_blocking)


class IterableDataset(torch.utils.data.IterableDataset):
    """A gpufeed ``Loader`` as a ``torch.utils.data.IterableDataset`` of batches.

    Use with ``DataLoader(ds, batch_size=None, ...)``. In the main process (``num_workers=0``) it
    iterates ``loader`` itself; in a worker started by ``spawn`` or ``forkserver`` it makes a
    loader of its own for its part of the epoch (rank ``rank * num_workers + worker id`` of
    ``world_size * num_workers``), so the workers together deliver every sample exactly once.
    ``set_epoch`` chooses the epoch (as ``DistributedSampler.set_epoch``); it reaches the workers
    the next time they are started (``persistent_workers=False``, the default).
    """

    def __init__(self, loader, device=None, non_blocking=True):
        if not isinstance(loader, Loader):
            raise TypeError(f"expected a gpufeed.Loader, got {type(loader).__name__}")
        self.loader = loader
        self.device = device
        self.non_blocking = non_blocking
        self._epoch = None
        # Set when unpickled: a spawn-started worker made this copy in its own process.
        self._kwargs = None
        self._made_in = os.getpid()

    def set_epoch(self, epoch):
        """The epoch the next pass reads (here and in workers started afterwards)."""
        self._epoch = epoch
        self.loader.set_epoch(epoch)

    def __len__(self):
        return len(self.loader)

    def __getstate__(self):
        # A worker gets the loader's arguments, not the loader: it makes its own part.
        state = self.loader.state_dict()
        return {
            "kwargs": self.loader.init_kwargs(),
            "epoch": self._epoch if self._epoch is not None else state["epoch"],
            "device": self.device,
            "non_blocking": self.non_blocking,
        }

    def __setstate__(self, state):
        self.loader = None
        self._kwargs = state["kwargs"]
        self._epoch = state["epoch"]
        self.device = state["device"]
        self.non_blocking = state["non_blocking"]
        self._made_in = os.getpid()

    def __iter__(self):
        info = torch.utils.data.get_worker_info()
        if info is None:
            if self.loader is None:
                self.loader = Loader(**self._kwargs)
                self.loader.set_epoch(self._epoch)
            yield from batches(self.loader, self.device, self.non_blocking)
            return
        if self._kwargs is None:
            # Not unpickled here: the worker was forked and holds the parent's loader.
            raise GpufeedError(
                "gpufeed.torch.IterableDataset in a DataLoader worker started by fork: a "
                "loader's I/O thread and io_uring ring stay in the parent. Use "
                "DataLoader(..., multiprocessing_context='spawn') (or 'forkserver'), or "
                "num_workers=0 — gpufeed reads and decodes on its own threads, so workers are "
                "rarely needed"
            )
        kwargs = dict(self._kwargs)
        world = kwargs.get("world_size") or 1
        kwargs["rank"] = (kwargs.get("rank") or 0) * info.num_workers + info.id
        kwargs["world_size"] = world * info.num_workers
        part = Loader(**kwargs)
        part._mark_worker_part()
        part.set_epoch(self._epoch)
        yield from batches(part, self.device, self.non_blocking)
