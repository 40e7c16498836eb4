#!/usr/bin/env python3
"""A minimal PyTorch training loop reading through gpufeed (CPU or GPU).

    python examples/train_torch.py /nvme/gpufeed-load/packed --device cuda --epochs 2

The dataset is any gpufeed dataset with labels (e.g. `gpufeed bench load`'s packed shards, or
`gpufeed pack` of an ImageFolder). To stay dependency-free the "model" learns from the first
K raw bytes of each sample (a real pipeline decodes images here); what matters is the data path:
batches arrive as one uint8 buffer plus offsets, shared with torch through DLPack without a
copy, and on the GPU the copy stream is ordered before the compute stream with no host sync.
Run it under torchrun and each rank reads its own part (RANK / WORLD_SIZE / LOCAL_RANK).
"""

import argparse
import os
import time

import torch

import gpufeed

K = 1024  # bytes of each sample the toy model sees


def features(data, offsets, lengths):
    """(batch, K) float features: each sample's first K bytes, zero-padded, gathered at once."""
    idx = offsets[:, None] + torch.arange(K, device=data.device)[None, :]
    mask = torch.arange(K, device=data.device)[None, :] < lengths[:, None]
    idx = torch.where(mask, idx, torch.zeros_like(idx))
    return torch.where(mask, data[idx], torch.zeros_like(idx, dtype=torch.uint8)).float() / 255.0


def main():
    p = argparse.ArgumentParser()
    p.add_argument("dataset")
    p.add_argument("--device", default="cpu", help='"cpu", "cuda" or "cuda:N"')
    p.add_argument("--epochs", type=int, default=1)
    p.add_argument("--batch-size", type=int, default=256)
    p.add_argument("--classes", type=int, default=1000)
    args = p.parse_args()

    loader = gpufeed.Loader(args.dataset, batch_size=args.batch_size, device=args.device)
    if args.device == "cuda":  # gpufeed reads to cuda:LOCAL_RANK; train there too
        dev = torch.device("cuda", int(os.environ.get("LOCAL_RANK", "0")))
    else:
        dev = torch.device(args.device)
    model = torch.nn.Linear(K, args.classes).to(dev)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    print(f"{loader.num_samples} samples, {len(loader)} batches per epoch on {dev}")
    for epoch in range(args.epochs):
        loader.set_epoch(epoch)
        t0, seen = time.perf_counter(), 0
        for batch in loader:
            data = torch.from_dlpack(batch.data)  # uint8 on the batch's device, no copy
            offsets = torch.from_dlpack(batch.offsets).to(dev, non_blocking=True)
            lengths = torch.from_dlpack(batch.lengths).to(dev, non_blocking=True)
            labels = torch.from_dlpack(batch.labels).to(dev, non_blocking=True)
            x = features(data, offsets, lengths)
            loss = torch.nn.functional.cross_entropy(model(x), labels.clamp(min=0))
            opt.zero_grad(set_to_none=True)
            loss.backward()
            opt.step()
            seen += len(batch)
        if dev.type == "cuda":
            torch.cuda.synchronize()
        dt = time.perf_counter() - t0
        print(f"epoch {epoch}: loss {loss.item():.3f}, {seen / dt:.0f} samples/s")


if __name__ == "__main__":
    main()
