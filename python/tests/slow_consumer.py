"""One rank of a slow or pausing consumer, for test_training.py: reads one epoch of a byte or
an image loader (RANK / WORLD_SIZE from the environment, as torchrun sets them), holding each
batch while it "trains", and prints the sample ids it got as JSON on its last line.

    python slow_consumer.py bytes|images pause|slow DATASET

The dataset has 104 samples: 13 batches a rank. With ``prefetch=1`` the loader has three read
buffers of 4-batch groups, so the fourth group waits for the first to be given back, which this
consumer takes 40 s (10 s a batch) or 90 s (a pause) to do; the loader used to fail after 30 s.
"""

import json
import os
import sys
import time

import numpy as np

import gpufeed

kind, pace, path = sys.argv[1:4]
world = int(os.environ.get("WORLD_SIZE", "1"))
images = gpufeed.Images("train", size=32, dtype="uint8", threads=1) if kind == "images" else None
loader = gpufeed.Loader(path, batch_size=8 if world == 1 else 4, seed=11, prefetch=1,
                        images=images)
ids = []
for k, batch in enumerate(loader):
    if kind == "images":
        pixels = np.from_dlpack(batch.images)  # the batch is used while it is held
        assert pixels.shape[1:] == (3, 32, 32) and not np.from_dlpack(batch.failed).any()
    else:
        data = np.from_dlpack(batch.data)
        assert data.size > 0
    ids.extend(int(i) for i in np.from_dlpack(batch.sample_ids))
    if pace == "slow":
        time.sleep(10)
    elif k == 1:
        time.sleep(90)  # an evaluation, a checkpoint, a debugger stop
print(json.dumps(ids))
