"""Checked by mypy (tests/it/python.rs), not run: image batches' ``.images`` is visible without
a cast, and a byte loader's batches have none (the ignore below must be needed:
``--warn-unused-ignores``)."""

import numpy as np

import gpufeed


def image_pass(path: str) -> int:
    loader = gpufeed.Loader(path, batch_size=8, images=gpufeed.Images("eval", size=(32, 48)))
    n = 0
    for batch in loader:
        x = np.from_dlpack(batch.images)
        n += int(x.shape[0]) + len(batch.failed)
    return n


def byte_pass(path: str) -> int:
    loader = gpufeed.Loader(path, batch_size=8, order="sequential", timeout=30.0)
    n = 0
    for batch in loader:
        n += batch.data.nbytes
        batch.images  # type: ignore[attr-defined]
    return n
