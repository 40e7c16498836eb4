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

Each batch is a :class:`TorchBatch`: it unpacks as ``images, labels`` (``x, y`` for a token
corpus, ``data, offsets, lengths, labels`` for other bytes) and also carries what the loader
knows of its samples — ``sample_ids``, ``keys``, ``padding`` (repeats that only even out the
ranks, ``last_batch="pad"``), ``failed`` (samples that could not be read or decoded and are
zeros, ``on_error="mark"``) and ``valid`` (neither)::

    for b in gpufeed.torch.batches(val_loader, device="cuda"):   # last_batch="pad"
        logits = model(b.images)
        correct += (logits.argmax(1) == b.labels)[b.valid].sum()

A token corpus (``format="tokens"``, or a Megatron prefix with ``seq_len``) gives the inputs and
targets nanoGPT's ``get_batch`` gives, ``[batch, seq_len]`` int64 (``ids_dtype=torch.int32``
for int32; the Loader's ``token_dtype`` is the file's element type), ``y`` shifted by one::

    loader = gpufeed.Loader("owt/train.bin", format="tokens", seq_len=1024, batch_size=12)
    for x, y in gpufeed.torch.batches(loader, device="cuda"):
        logits, loss = model(x, y)

Code that must hand a dataset to a ``DataLoader`` wraps the loader in
:class:`IterableDataset` and passes ``batch_size=None`` (gpufeed batches already). With
``num_workers > 0`` the workers must be started with ``spawn`` or ``forkserver``
(``multiprocessing_context="spawn"``): worker ``w`` of ``W`` reads the rank's batches
``w, w + W, w + 2W, …`` (the rank's decode threads shared among them), so the ``DataLoader``
yields exactly the batches, and in the order, that iterating the loader gives, and ``len()`` is
exact. A forked worker is refused with a message: a loader's I/O thread and io_uring ring do not
survive ``fork``. Leaving such a loop early (``break``) shuts the workers down as the
``DataLoader`` does for any dataset; see the package README for what that costs and why the
direct loop is the way where it can be.
"""

import os
from typing import Any, Callable, Dict, Iterator, List, Optional, Tuple, Union

import torch
import torch.utils.data

from . import Batch, GpufeedError, ImageBatch, Loader, SampleError

Device = Union[str, torch.device, None]

__all__ = ["IterableDataset", "TorchBatch", "batches", "to_torch"]


def _flags(buf: Any) -> torch.Tensor:
    """A uint8 flag buffer as a bool tensor."""
    return torch.from_dlpack(buf).bool()


class TorchBatch:
    """One batch as torch tensors, and what the loader knows of its samples.

    It unpacks as the tuple it stands for — ``images, labels`` (decoded images), ``x, y`` (a
    token corpus read as windows), ``data, offsets, lengths, labels`` (other bytes) — and
    ``len()`` and indexing behave as on that tuple, so code written for the tuple keeps working.

    Attributes: ``kind`` ("images", "tokens" or "bytes"); the tensors of that kind (``images``;
    ``x`` and ``y``; ``data``, ``offsets``, ``lengths``; the others None); ``labels`` (int64,
    −1 where none); ``sample_ids`` (int64: each sample's index in the dataset); ``keys``
    (file names or keys, a list of str); ``padding`` (bool: a repeat that only evens out the
    ranks, ``last_batch="pad"`` — drop it when evaluating); ``failed`` (bool: could not be read
    or decoded, ``on_error="mark"``; its image is zeros, its token row zeros, its length −1);
    ``valid`` (bool: neither padding nor failed — the samples to train on or count); ``errors``
    (``(index, message)`` of each failed sample); ``epoch``; ``index`` (the batch's place in the
    rank's epoch). The masks and ids live with the tensors (``device``).
    """

    _FIELDS = {
        "images": ("images", "labels"),
        "tokens": ("x", "y"),
        "bytes": ("data", "offsets", "lengths", "labels"),
    }

    kind: str
    images: Optional[torch.Tensor]
    x: Optional[torch.Tensor]
    y: Optional[torch.Tensor]
    data: Optional[torch.Tensor]
    offsets: Optional[torch.Tensor]
    lengths: Optional[torch.Tensor]
    labels: torch.Tensor
    sample_ids: torch.Tensor
    keys: List[str]
    padding: torch.Tensor
    failed: torch.Tensor
    errors: List[Tuple[int, str]]
    epoch: int
    index: int

    def __init__(
        self,
        kind: str,
        tensors: Dict[str, torch.Tensor],
        sample_ids: torch.Tensor,
        keys: List[str],
        padding: torch.Tensor,
        failed: torch.Tensor,
        errors: List[Tuple[int, str]],
        epoch: int,
        index: int,
    ) -> None:
        self.kind = kind
        self.images = self.x = self.y = None
        self.data = self.offsets = self.lengths = None
        for name, t in tensors.items():
            setattr(self, name, t)
        self.sample_ids = sample_ids
        self.keys = keys
        self.padding = padding
        self.failed = failed
        self.errors = errors
        self.epoch = epoch
        self.index = index

    @property
    def valid(self) -> torch.Tensor:
        """bool: the samples that are neither padding nor failed."""
        return ~(self.padding | self.failed)

    def _tuple(self) -> Tuple[Any, ...]:
        return tuple(getattr(self, f) for f in self._FIELDS[self.kind])

    def __iter__(self) -> Iterator[torch.Tensor]:
        return iter(self._tuple())

    def __len__(self) -> int:
        return len(self._FIELDS[self.kind])

    def __getitem__(self, i: int) -> torch.Tensor:
        return self._tuple()[i]

    def _map(self, fn: Callable[[torch.Tensor], torch.Tensor]) -> "TorchBatch":
        tensors = {}
        for name in ("images", "x", "y", "data", "offsets", "lengths", "labels"):
            t = getattr(self, name)
            if t is not None:
                tensors[name] = fn(t)
        return TorchBatch(
            self.kind,
            tensors,
            fn(self.sample_ids),
            self.keys,
            fn(self.padding),
            fn(self.failed),
            self.errors,
            self.epoch,
            self.index,
        )

    def to(
        self,
        device: Union[Device, torch.dtype] = None,
        dtype: Optional[torch.dtype] = None,
        non_blocking: bool = True,
    ) -> "TorchBatch":
        """The same batch with every tensor moved to ``device``; ``dtype`` (also accepted in the
        first place, as ``tensor.to(torch.float16)``) converts the images only — labels, ids and
        masks keep their types."""
        if isinstance(device, torch.dtype):
            device, dtype = None, device
        if dtype is not None and self.kind != "images":
            raise ValueError(f"TorchBatch.to(dtype=...) converts images; this batch holds {self.kind}")
        out = self if device is None else self._map(
            lambda t: t.to(device, non_blocking=non_blocking))
        if dtype is not None:
            out = out._map(lambda t: t)
            out.images = out.images.to(dtype)
        return out

    def pin_memory(self) -> "TorchBatch":
        """The same batch in pinned host memory (``DataLoader(pin_memory=True)`` calls it)."""
        return self._map(lambda t: t.pin_memory())

    def __repr__(self) -> str:
        main = self._tuple()[0]
        return (
            f"gpufeed.torch.TorchBatch({self.kind}: {list(main.shape)} {main.dtype} on "
            f"{main.device}, epoch {self.epoch}, batch {self.index}, {len(self.keys)} samples, "
            f"{int(self.padding.sum())} padding, {int(self.failed.sum())} failed)"
        )


def _token_rows(
    batch: Batch,
    data: torch.Tensor,
    offsets: torch.Tensor,
    lengths: torch.Tensor,
    dtype: torch.dtype,
) -> torch.Tensor:
    """``[N, seq_len + 1]`` token ids gathered from a batch's bytes with torch (on the GPU for a
    device batch): the same values ``batch.tokens()`` computes on the host."""
    width = {"uint8": 1, "int8": 1, "uint16": 2, "int16": 2, "uint32": 4, "int32": 4,
             "int64": 8}.get(batch.token_dtype)
    if width is None:
        raise GpufeedError(f"token corpus of {batch.token_dtype}: not token ids")
    t = batch.seq_len + 1
    dev = data.device
    if data.numel() == 0:  # every sample failed
        return torch.zeros((len(offsets), t), dtype=dtype, device=dev)
    starts = offsets.to(dev).clamp(min=0)
    idx = starts[:, None] + torch.arange(t * width, device=dev)[None, :]
    raw = data[idx.clamp(max=data.numel() - 1)].reshape(-1, t, width).to(torch.int64)
    rows = torch.zeros(raw.shape[:2], dtype=torch.int64, device=dev)
    for k in range(width):
        rows |= raw[:, :, k] << (8 * k)
    if batch.token_dtype.startswith("int") and width < 8:
        sign = 1 << (8 * width - 1)
        rows = (rows ^ sign) - sign
    rows[lengths.to(dev) < 0] = 0
    return rows.to(dtype)


def to_torch(
    batch: Union[Batch, ImageBatch],
    device: Device = None,
    non_blocking: bool = True,
    ids_dtype: torch.dtype = torch.int64,
) -> TorchBatch:
    """One gpufeed batch as a :class:`TorchBatch`, sharing gpufeed's memory (DLPack) unless
    moved.

    A decoded image batch unpacks as ``(images, labels)``; a batch of a token corpus read as
    windows as ``(x, y)``, each ``[N, seq_len]`` of ``ids_dtype`` (int64 or int32); other byte
    batches as ``(data, offsets, lengths, labels)``. With ``device``, the tensors are moved
    there (``non_blocking``: host image batches are pageable memory, so the copy is synchronous
    unless they are pinned first; a loader with ``device="cuda"`` delivers its batches on the
    GPU already).
    """
    padding = _flags(batch.padding)
    ids = torch.from_dlpack(batch.sample_ids)
    labels = torch.from_dlpack(batch.labels)
    if hasattr(batch, "images"):
        kind = "images"
        tensors = {"images": torch.from_dlpack(batch.images), "labels": labels}
        failed = _flags(batch.failed)
    else:
        lengths = torch.from_dlpack(batch.lengths)
        failed = lengths < 0
        if batch.seq_len is not None:
            kind = "tokens"
            if batch.device == "cpu":
                x, y = batch.pairs(dtype=ids_dtype)
                x, y = torch.from_dlpack(x), torch.from_dlpack(y)
            else:
                rows = _token_rows(batch, torch.from_dlpack(batch.data),
                                   torch.from_dlpack(batch.offsets), lengths, ids_dtype)
                x, y = rows[:, :-1], rows[:, 1:]
            tensors = {"x": x, "y": y, "labels": labels}
        else:
            kind = "bytes"
            tensors = {
                "data": torch.from_dlpack(batch.data),
                "offsets": torch.from_dlpack(batch.offsets),
                "lengths": lengths,
                "labels": labels,
            }
    out = TorchBatch(kind, tensors, ids, batch.keys, padding, failed, batch.errors,
                     batch.epoch, batch.index)
    if device is not None:
        out = out.to(device, non_blocking=non_blocking)
    return out


def batches(
    loader: Loader,
    device: Device = None,
    non_blocking: bool = True,
    ids_dtype: torch.dtype = torch.int64,
) -> Iterator[TorchBatch]:
    """One pass of ``loader`` as :class:`TorchBatch` records (:func:`to_torch` of each batch).

    A ``SampleError`` (``on_error="raise"``) is raised with its ``batch`` as a
    :class:`TorchBatch` (the good samples intact, the bad ones flagged in ``failed``), and the
    pass goes on at the next batch when iterated again, as the loader's own pass does."""
    return _Batches(iter(loader), dict(device=device, non_blocking=non_blocking,
                                       ids_dtype=ids_dtype))


class _Batches:
    """The iterator of :func:`batches`: an object, not a generator, so that an exception raised
    by one batch does not end the pass."""

    def __init__(self, it: Any, opts: Dict[str, Any]) -> None:
        self._it = it
        self._opts = opts

    def __iter__(self) -> "_Batches":
        return self

    def __next__(self) -> TorchBatch:
        try:
            batch = next(self._it)
        except SampleError as e:
            if getattr(e, "batch", None) is not None:
                e.batch = to_torch(e.batch, **self._opts)
            raise
        return to_torch(batch, **self._opts)


class _EpochBoard:
    """The epoch the workers' next pass reads, shared with them: a multiprocessing array that
    each spawn-started worker inherits at its start, so the trainer's ``set_epoch`` reaches
    persistent workers too, and a pass every worker finished moves it to the next epoch (as a
    finished pass of the loader itself does). ``[next epoch, pass id, workers done with it]``."""

    def __init__(self, epoch: int) -> None:
        import multiprocessing

        self.a = multiprocessing.get_context("spawn").Array("q", [epoch, 0, 0])

    def set(self, epoch: int) -> None:
        with self.a.get_lock():
            self.a[0] = epoch
            self.a[2] = 0

    def next_epoch(self) -> int:
        with self.a.get_lock():
            return int(self.a[0])

    def finished(self, pass_id: int, workers: int, epoch: int) -> None:
        """A worker's part of pass ``pass_id`` (one of ``workers``) read whole: the pass of
        epoch ``epoch`` is finished when every worker's is."""
        with self.a.get_lock():
            if self.a[1] != pass_id:
                self.a[1], self.a[2] = pass_id, 0
            self.a[2] += 1
            if self.a[2] == workers and self.a[0] == epoch:
                self.a[0] = epoch + 1


class IterableDataset(torch.utils.data.IterableDataset):
    """A gpufeed ``Loader`` as a ``torch.utils.data.IterableDataset`` of batches.

    Use with ``DataLoader(ds, batch_size=None, ...)``. In the main process (``num_workers=0``) it
    iterates ``loader`` itself; in a worker started by ``spawn`` or ``forkserver`` it makes a
    loader of its own for its part of the rank's epoch: worker ``w`` of ``W`` reads batches
    ``w, w + W, …``, which the ``DataLoader`` takes from the workers in turn — so it yields the
    loader's own batches in the loader's order, each once, and ``len()`` is the loader's. The
    rank's decode threads are shared among the workers (unless ``GPUFEED_DECODE_THREADS`` or
    ``Images(threads=)`` says otherwise). ``set_epoch`` chooses the epoch (as
    ``DistributedSampler.set_epoch``), for the workers too, persistent or not; without it a pass
    every worker finished is followed by the next epoch, as the loader's own passes are. A
    ``SampleError`` in a worker ends the ``DataLoader``'s pass (torch re-raises a worker's
    exception in the trainer and stops): with workers, use ``on_error="mark"`` and ``valid``.
    """

    def __init__(
        self,
        loader: Loader,
        device: Device = None,
        non_blocking: bool = True,
        ids_dtype: torch.dtype = torch.int64,
    ) -> None:
        if not isinstance(loader, Loader):
            raise TypeError(f"expected a gpufeed.Loader, got {type(loader).__name__}")
        self.loader = loader
        self.device = device
        self.non_blocking = non_blocking
        self.ids_dtype = ids_dtype
        self._epoch = None
        self._board: Optional[_EpochBoard] = _EpochBoard(loader.state_dict()["epoch"])
        # Set when unpickled: a spawn-started worker made this copy in its own process.
        self._kwargs = None
        self._made_in = os.getpid()
        self._part_of: Optional[Tuple[int, int]] = None
        self._passes = 0

    def set_epoch(self, epoch: int) -> None:
        """The epoch the next pass reads (here and in the workers)."""
        self._epoch = epoch
        self.loader.set_epoch(epoch)
        if self._board is not None:
            self._board.set(epoch)

    def __len__(self) -> int:
        # Exact with workers too: they read the rank's batches between them.
        return len(self.loader)

    def __getstate__(self) -> Dict[str, Any]:
        # A worker gets the loader's arguments, not the loader: it makes its own part. The
        # epoch board travels only to a process being started (it is shared by inheritance).
        from multiprocessing import context

        state = self.loader.state_dict()
        spawning = context.get_spawning_popen() is not None
        # A resume point (load_state_dict) travels too: the workers' first pass starts there.
        resume = state if state["batch"] > 0 or state.get("stops") else None
        return {
            "kwargs": self.loader.init_kwargs(),
            "resume": resume,
            "epoch": self._epoch if self._epoch is not None else state["epoch"],
            "board": self._board if spawning else None,
            "device": self.device,
            "non_blocking": self.non_blocking,
            "ids_dtype": self.ids_dtype,
        }

    def __setstate__(self, state: Dict[str, Any]) -> None:
        self.loader = None
        self._kwargs = state["kwargs"]
        self._resume = state.get("resume")
        self._epoch = state["epoch"]
        self._board = state["board"]
        self.device = state["device"]
        self.non_blocking = state["non_blocking"]
        self.ids_dtype = state["ids_dtype"]
        self._made_in = os.getpid()
        self._part_of = None
        self._passes = 0

    def __iter__(self) -> Iterator[TorchBatch]:
        info = torch.utils.data.get_worker_info()
        if info is None:
            if self.loader is None:
                self.loader = Loader(**self._kwargs)
                self.loader.set_epoch(self._epoch)
            yield from batches(self.loader, self.device, self.non_blocking, self.ids_dtype)
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
        kwargs["_batch_part"] = (info.id, info.num_workers)
        if "GPUFEED_DECODE_THREADS" not in os.environ:
            # The rank's share of the cores, shared among its workers (the default would give
            # each worker the rank's whole share).
            cores = len(os.sched_getaffinity(0))
            ranks = int(os.environ.get("LOCAL_WORLD_SIZE", "1") or 1)
            os.environ["GPUFEED_DECODE_THREADS"] = str(max(1, cores // (ranks * info.num_workers)))
        board = self._board
        epoch = board.next_epoch() if board is not None else self._epoch
        # Which pass this is: the DataLoader iterator's base seed (one per iterator; the same for
        # every pass of persistent workers) and this worker's count of passes (one each pass,
        # the same in every worker, a pass left early included).
        self._passes += 1
        pass_id = ((info.seed - info.id) * 1_000_003 + self._passes) & 0x7FFF_FFFF_FFFF_FFFF
        n = info.num_workers
        resume = getattr(self, "_resume", None)
        if resume is not None and self._passes == 1 and resume["epoch"] == epoch:
            # Resumed at the rank's batch k: the DataLoader takes batches from workers 0, 1, …
            # in turn, so worker w reads batches k + w, k + w + n, … — part (k + w) mod n, from
            # its batch (k + w) // n — with a loader of that part for this pass.
            k = resume["batch"]
            part = (k + info.id) % n
            reader = Loader(**dict(kwargs, _batch_part=(part, n)))
            reader._mark_worker_part()
            reader.load_state_dict(dict(resume, batch=(k + info.id) // n))
        else:
            if self.loader is None or self._part_of != (info.id, n):
                self.loader = Loader(**kwargs)  # a persistent worker keeps its part's loader
                self.loader._mark_worker_part()
                self._part_of = (info.id, n)
            self.loader.set_epoch(epoch)
            reader, part = self.loader, info.id
        for b in batches(reader, self.device, self.non_blocking, self.ids_dtype):
            b.index = b.index * n + part  # the batch's place in the rank's epoch
            yield b
        if board is not None:
            # Every worker's part of this pass (one DataLoader iterator: one base seed) read.
            board.finished(pass_id, info.num_workers, epoch)
