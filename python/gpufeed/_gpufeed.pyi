"""Type hints for the compiled module."""

import os
from typing import (
    Any,
    Callable,
    Dict,
    Generic,
    Iterator,
    List,
    Optional,
    Sequence,
    Tuple,
    TypeVar,
    Union,
    overload,
)

__version__: str

class DatasetWarning(UserWarning):
    """Indexing found damage: the samples it covers are not in the dataset."""

class GpufeedError(Exception):
    """An error from gpufeed; the message names the file, the sample and what was wrong."""

class SampleError(GpufeedError):
    """A batch held a sample that could not be read, decoded or checked (``on_error="raise"``).
    ``batch`` is that batch — its good samples intact, the bad ones flagged (``failed``, or
    ``lengths`` −1) — and ``errors`` its ``(index, message)`` pairs; the pass goes on at the
    next batch. Pickled with its message and ``errors``; ``batch`` stays in its process (None
    in another)."""

    batch: Optional[Union["Batch", "ImageBatch"]]
    errors: List[Tuple[int, str]]

class Buffer:
    """A buffer (uint8 sample bytes, int64 offsets/lengths/labels/ids, or a decoded image
    tensor) implementing the DLPack protocol: ``numpy.from_dlpack(buf)``, ``torch.from_dlpack(buf)`` share it."""

    def __dlpack__(
        self,
        stream: Optional[int] = None,
        max_version: Optional[Tuple[int, int]] = None,
        dl_device: Optional[Tuple[int, int]] = None,
        copy: Optional[bool] = None,
    ) -> Any: ...
    def __dlpack_device__(self) -> Tuple[int, int]: ...
    def __len__(self) -> int: ...
    @property
    def ptr(self) -> int:
        """Address of the first element (host or device)."""
    @property
    def dtype(self) -> str: ...
    @property
    def shape(self) -> List[int]: ...
    @property
    def nbytes(self) -> int: ...
    def tolist(self) -> List[int]: ...
    def tobytes(self) -> bytes: ...

class Batch:
    """One batch: ``data[offsets[i] : offsets[i] + lengths[i]]`` is sample ``i``."""

    def __repr__(self) -> str: ...
    def __len__(self) -> int: ...
    @property
    def data(self) -> Buffer: ...
    @property
    def offsets(self) -> Buffer: ...
    @property
    def lengths(self) -> Buffer:
        """int64 lengths; -1 for a failed sample when the loader was made with on_error="mark"."""
    @property
    def labels(self) -> Buffer: ...
    @property
    def sample_ids(self) -> Buffer: ...
    @property
    def padding(self) -> Buffer:
        """uint8 flags, 1 for a sample repeated only to even out ranks (last_batch="pad")."""
    @property
    def keys(self) -> List[str]: ...
    @property
    def errors(self) -> List[Tuple[int, str]]: ...
    @property
    def epoch(self) -> int: ...
    @property
    def index(self) -> int: ...
    @property
    def device(self) -> str:
        """"cpu" or "cuda:N"."""
    @property
    def timing(self) -> Dict[str, Any]:
        """``stall`` (this batch's wait, by cause), and its group's read_s, copy_s, queue_s."""
    def sample(self, i: int) -> bytes:
        """Sample ``i``'s bytes, copied (host batches)."""
    @property
    def seq_len(self) -> Optional[int]:
        """Tokens per window less one, for a token corpus read as windows; else None."""
    @property
    def token_dtype(self) -> Optional[str]:
        """A token corpus's element type as numpy names it ("uint16"…); else None."""
    def tokens(self, dtype: Any = None) -> Buffer:
        """``[N, seq_len + 1]`` token ids (int64, or ``dtype="int32"``), one row per window."""
    def pairs(self, dtype: Any = None) -> Tuple[Buffer, Buffer]:
        """``(x, y)``: inputs and targets, each ``[N, seq_len]``, ``y`` shifted by one."""

class Images:
    """What decoded image batches look like: ``Loader(..., images=Images("train", 224))``.

    ``transform``: "train" (torchvision's RandomResizedCrop with ``scale``, ``ratio`` and a
    horizontal flip with probability ``flip_p``) or "eval" (the shorter side to ``resize``,
    default 8/7 of the output's longer side, then the centre crop). Bilinear with antialiasing, as Pillow
    resizes. ``size``: one side (square) or ``(height, width)`` as torchvision takes it;
    default 224. ``dtype``: "uint8" (pixels, no normalisation), "float16", "bfloat16" or
    "float32" (``(x / 255 - mean) / std``, ImageNet's by default; the default) — as a string,
    a torch dtype (``torch.float16``) or a numpy dtype. ``layout``: "nchw" or "nhwc".
    ``threads``: decode threads (0: this rank's share of the cores — the cores divided by
    ``LOCAL_WORLD_SIZE``, or ``GPUFEED_DECODE_THREADS``). Every argument is one of
    ``gpufeed.IMAGE_SETTINGS`` (name → default, unit, help); ``None`` is its default. Crops and flips follow from
    (seed, epoch, sample id) alone: the same whatever the ranks, threads or resume point.
    Host image batches are ordinary (pageable) memory: a ``.to("cuda", non_blocking=True)``
    copy of them does not overlap compute unless pinned first (``tensor.pin_memory()``).
    """

    def __init__(
        self,
        transform: Optional[str] = None,
        size: Union[int, Tuple[int, int], None] = None,
        dtype: Any = None,
        layout: Optional[str] = None,
        mean: Optional[Sequence[float]] = None,
        std: Optional[Sequence[float]] = None,
        threads: Optional[int] = None,
        scale: Optional[Tuple[float, float]] = None,
        ratio: Optional[Tuple[float, float]] = None,
        flip_p: Optional[float] = None,
        resize: Optional[int] = None,
        dct_scaling: Optional[bool] = None,
        max_pixels: Optional[int] = None,
        prefetch_batches: Optional[int] = None,
        hardware_decoder: Optional[bool] = None,
    ) -> None: ...
    @property
    def settings(self) -> Dict[str, Optional[str]]:
        """The image settings in effect, as text (None: not used by this transform): the names
        of ``IMAGE_SETTINGS``."""
    def __eq__(self, other: object) -> bool:
        """Equal when they make the same images (defaults spelled or not)."""
    def __hash__(self) -> int: ...


class ImageBatch:
    """A batch of decoded images: ``images`` is one tensor, [N, 3, H, W] or [N, H, W, 3]."""

    def __repr__(self) -> str: ...
    def __len__(self) -> int: ...
    @property
    def images(self) -> Buffer:
        """The tensor (DLPack; host memory, or device memory with ``device="cuda"``):
        ``torch.from_dlpack(batch.images)``, no copy."""
    @property
    def labels(self) -> Buffer: ...
    @property
    def sample_ids(self) -> Buffer: ...
    @property
    def padding(self) -> Buffer: ...
    @property
    def failed(self) -> Buffer:
        """uint8 flags, 1 for a sample that could not be read or decoded (its image is zeros)."""
    @property
    def errors(self) -> List[Tuple[int, str]]: ...
    @property
    def keys(self) -> List[str]: ...
    @property
    def shape(self) -> List[int]: ...
    @property
    def device(self) -> str:
        """"cpu" or "cuda:N"."""
    @property
    def epoch(self) -> int: ...
    @property
    def index(self) -> int: ...
    @property
    def timing(self) -> Dict[str, Any]:
        """``stall`` (this batch's wait, by cause, decode included), read_s, copy_s, queue_s."""

_B = TypeVar("_B", Batch, ImageBatch)

class _Epoch(Iterator[_B]):
    """One pass over an epoch (``iter(loader)``)."""

    def __next__(self) -> _B: ...
    def stats(self) -> Dict[str, Any]: ...
    @property
    def epoch(self) -> int: ...
    @property
    def position(self) -> int:
        """The index of the batch this pass yields next."""

class Loader(Generic[_B]):
    """Reads a dataset epoch by epoch: ``for batch in loader`` is one pass; batches are
    :class:`Batch` (bytes) or, with ``images=``, :class:`ImageBatch` (decoded tensors).

    ``paths``: a dataset (packed shards, WebDataset tars, TFRecords, a Megatron prefix, token
    files, an ImageFolder directory) or a list of its files. ``order``: "global", "block",
    "shard-buffer" or "sequential" (no shuffle, the same every epoch: evaluation).
    Every setting (``batch_size`` … ``open_files_max``) is one of ``gpufeed.LOADER_SETTINGS``,
    the table the C options struct and the CLI's flags follow too: ``None`` means its default
    there (batches of 256, prefetch 2, in flight 2, queue depth 128, a 4 GiB memory budget…);
    sizes may be written ``"4G"``. ``rank`` / ``world_size`` default to ``RANK`` /
    ``WORLD_SIZE``.
    ``device``: "cpu", "cuda" (``LOCAL_RANK``) or "cuda:N". ``last_batch``: "short" (default:
    every sample exactly once, the last batch may be short), "drop", or "pad" (every rank the
    same number of samples, repeats flagged in ``Batch.padding``); ``drop_last=True`` is the
    alias of "drop". ``on_error``: "raise" (a batch with a bad sample raises SampleError) or
    "mark" (its length is -1, ``Batch.errors`` says why). ``memory_budget``: bytes the arena
    may take (default 4 GiB); slots are sized from the dataset and the batch size within it.
    ``prefetch_next_epoch``: when an epoch's iteration starts, also ask for the next one
    (``set_epoch(e + 1)`` then uses it), so its first batches are read while this epoch's last
    are used — no wait at the boundary; one that is not used is dropped. ``timeout``: seconds
    one wait for a batch may last before ``GpufeedError`` says what it waits for and who holds
    the read buffers (default None: as long as it takes — a slow step or a pause is never an
    error; the pass stays usable after a timeout). It bounds each of the open's waits for an
    object store too (a store that accepts connections and never answers fails the open in that
    time instead of after two minutes of retries).

    Passes: ``set_epoch(e)`` chooses the epoch the next pass reads; without it, a finished pass
    is followed by the next epoch (a new order each pass). A loader reads one pass at a time:
    making or using another pass parks the one reading (its batches stay valid) and using the
    parked one again resumes it where it stood. Batches hold the loader's read buffers until
    they are dropped: keeping them all (``list(loader)``) waits for ever once the buffers run
    out (a warning says so after 30 s); copy what you keep.

    The dataset options (``format``, ``payload``, ``label_ext``, ``label_offset``,
    ``tfrecord_index``, ``tfrecord_payload``, ``tfrecord_label``, ``tfrecord_recover``,
    ``token_dtype``, ``seq_len``, ``stride``, ``strict``) are the CLI's ``--format``,
    ``--payload``… with the same defaults: ``gpufeed.DATASET_OPTIONS`` documents each; ``None``
    means the default. Damage found while indexing is warned about once
    (``gpufeed.DatasetWarning``) and listed in ``problems``; ``strict=True`` refuses it.
    """

    @overload
    def __init__(
        self: "Loader[Batch]",
        paths: Union[str, os.PathLike, Sequence[Union[str, os.PathLike]]],
        batch_size: Optional[int] = None,
        order: Optional[str] = None,
        seed: Optional[int] = None,
        rank: Optional[int] = None,
        world_size: Optional[int] = None,
        device: Optional[str] = None,
        prefetch: Optional[int] = None,
        last_batch: Optional[str] = None,
        drop_last: Optional[bool] = None,
        verify: Optional[bool] = None,
        on_error: Optional[str] = None,
        shuffle_buffer: Optional[int] = None,
        block_bytes: Optional[Union[int, str]] = None,
        open_blocks: Optional[int] = None,
        queue_depth: Optional[int] = None,
        memory_budget: Optional[Union[int, str]] = None,
        prefetch_next_epoch: Optional[bool] = None,
        images: None = None,
        timeout: Optional[float] = None,
        in_flight: Optional[int] = None,
        open_files_max: Optional[int] = None,
        *,
        format: Optional[str] = None,
        payload: Optional[Union[str, Sequence[str]]] = None,
        label_ext: Optional[str] = None,
        label_offset: Optional[int] = None,
        tfrecord_index: Optional[Union[str, os.PathLike]] = None,
        tfrecord_payload: Optional[str] = None,
        tfrecord_label: Optional[str] = None,
        tfrecord_recover: Optional[bool] = None,
        token_dtype: Optional[str] = None,
        seq_len: Optional[int] = None,
        stride: Optional[int] = None,
        strict: Optional[bool] = None,
        cache_dir: Optional[Union[str, os.PathLike]] = None,
        cache_limit: Optional[Union[int, str]] = None,
        cache_extent: Optional[Union[int, str]] = None,
    ) -> None: ...
    @overload
    def __init__(
        self: "Loader[ImageBatch]",
        paths: Union[str, os.PathLike, Sequence[Union[str, os.PathLike]]],
        batch_size: Optional[int] = None,
        order: Optional[str] = None,
        seed: Optional[int] = None,
        rank: Optional[int] = None,
        world_size: Optional[int] = None,
        device: Optional[str] = None,
        prefetch: Optional[int] = None,
        last_batch: Optional[str] = None,
        drop_last: Optional[bool] = None,
        verify: Optional[bool] = None,
        on_error: Optional[str] = None,
        shuffle_buffer: Optional[int] = None,
        block_bytes: Optional[Union[int, str]] = None,
        open_blocks: Optional[int] = None,
        queue_depth: Optional[int] = None,
        memory_budget: Optional[Union[int, str]] = None,
        prefetch_next_epoch: Optional[bool] = None,
        *,
        images: Images,
        timeout: Optional[float] = None,
        in_flight: Optional[int] = None,
        open_files_max: Optional[int] = None,
        format: Optional[str] = None,
        payload: Optional[Union[str, Sequence[str]]] = None,
        label_ext: Optional[str] = None,
        label_offset: Optional[int] = None,
        tfrecord_index: Optional[Union[str, os.PathLike]] = None,
        tfrecord_payload: Optional[str] = None,
        tfrecord_label: Optional[str] = None,
        tfrecord_recover: Optional[bool] = None,
        token_dtype: Optional[str] = None,
        seq_len: Optional[int] = None,
        stride: Optional[int] = None,
        strict: Optional[bool] = None,
        cache_dir: Optional[Union[str, os.PathLike]] = None,
        cache_limit: Optional[Union[int, str]] = None,
        cache_extent: Optional[Union[int, str]] = None,
    ) -> None: ...
    @property
    def problems(self) -> List[Dict[str, Any]]:
        """What indexing found wrong: message, path, offset, sample (the first 1000)."""
    @property
    def classes(self) -> List[str]:
        """Class names by label where the dataset names them (an ImageFolder's subfolders);
        empty otherwise."""
    @property
    def class_to_idx(self) -> Dict[str, int]:
        """``{class name: label}``, as torchvision's ``ImageFolder.class_to_idx``."""
    @property
    def problems_total(self) -> int: ...
    @property
    def notes(self) -> List[str]: ...
    @property
    def recovered(self) -> int: ...
    @property
    def settings(self) -> Dict[str, Optional[str]]:
        """The loader settings in effect, as text (None: unset): the names of
        :data:`LOADER_SETTINGS`, as the C ABI's ``gpufeed_loader_settings`` and ``gpufeed bench
        load --json`` give them."""
        ...
    @property
    def dataset_options(self) -> Dict[str, Optional[str]]:
        """The dataset options in effect (as ``gpufeed inspect --json`` prints them)."""
    @property
    def last_batch(self) -> str: ...
    @property
    def samples_per_epoch(self) -> int: ...
    @property
    def slot_bytes(self) -> Tuple[int, int]:
        """(bytes of each arena slot, slots): sized from the dataset within memory_budget."""
    def stats(self) -> Dict[str, Any]:
        """The epoch being iterated (or the last): samples, bytes_read, reads_per_sample,
        read_amplification, consumer_wait_s, ``stall`` (storage_s, copy_s, verify_s, decode_s,
        other_s, total_s: where the consumer's waiting went), ``bound`` (the largest part),
        io_thread_cpu_s, consumer_cpu_s, check_cpu_s (the I/O thread checking frames and
        checksums ahead of the consumer), decode_cpu_s, and ``device_phases`` (decoded images
        on the GPU: per phase its wall and CPU seconds and count, CPU-ms per image on each
        route; None elsewhere)."""
    @property
    def prefetched_epoch(self) -> Optional[int]:
        """The epoch asked for ahead (``prefetch_next_epoch``), if one is."""
        ...
    @property
    def decode_threads(self) -> int:
        """Decode threads (``images=`` loaders; 0 otherwise)."""
    @property
    def timeout(self) -> Optional[float]: ...
    def set_epoch(self, epoch: int) -> None:
        """The epoch the next pass reads; after ``load_state_dict``, the saved epoch keeps its
        resume point (another drops it, with a warning)."""
    def __len__(self) -> int: ...
    def __iter__(self) -> _Epoch[_B]: ...
    def state_dict(self) -> Dict[str, Any]:
        """Where a run resumed from it starts (``epoch``, ``batch``: after the last batch yielded;
        ``stops``: where the epoch stopped on other rank counts before) and the settings that
        must match. In this process a new pass after an unfinished one starts that epoch again,
        as a new ``DataLoader`` iterator does."""
    def load_state_dict(self, state: Dict[str, Any]) -> None:
        """The next pass resumes there (``set_epoch`` of the saved epoch keeps it). Saved with
        another ``world_size``, every new rank loads the same state and together they deliver
        what the epoch still owed, each sample once."""
    def init_kwargs(self) -> Dict[str, Any]:
        """The arguments it was made with (rank and world size resolved): ``Loader(**kw)``."""
    def _mark_worker_part(self) -> None: ...
    @property
    def num_samples(self) -> int: ...
    @property
    def rank(self) -> int: ...
    @property
    def world_size(self) -> int: ...

def gpu_available() -> Tuple[bool, str]: ...
def set_progress(callback: Optional[Callable[[str, int, int, str, bool], None]]) -> None:
    """Sends the reports of long work (indexing a dataset of many files) to
    ``callback(what, done, total, unit, finished)`` instead of a line on stderr; ``None``
    restores the line. At most every 100 ms per piece of work, plus a last one."""
def verify(
    paths: Union[str, os.PathLike, Sequence[Union[str, os.PathLike]]], **dataset: Any
) -> Dict[str, Any]:
    """Reads and checks every sample, as ``gpufeed verify`` does: ``samples``, ``files``,
    ``checksums``, ``ok``, ``bad_total`` and ``bad`` (the first 1000, each a dict with
    ``message``, ``path``, ``offset``, ``sample``). The dataset options are keyword arguments."""

DATASET_OPTIONS: Dict[str, Tuple[str, str]]
#: The loader settings ``Loader`` takes: name → (default, unit, help); the C options struct and
#: the CLI's flags follow the same table. ``None`` for an argument means its default.
LOADER_SETTINGS: Dict[str, Tuple[str, str, str]]
# The image settings Images takes: name -> (default, unit, help).
IMAGE_SETTINGS: Dict[str, Tuple[str, str, str]]
"""Every dataset option ``Loader`` takes: name -> (default, help)."""
