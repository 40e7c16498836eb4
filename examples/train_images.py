#!/usr/bin/env python3
"""Train an image classifier on images gpufeed decodes, with checkpoints that resume exactly.

    # PyTorch (CPU or GPU), an ImageFolder or packed shards of JPEGs:
    python examples/train_images.py /data/imagenet/train --epochs 90 --checkpoint run.ckpt
    # the same loop without torch: softmax regression in numpy (what CI runs)
    python examples/train_images.py DATA --backend numpy --epochs 2 --checkpoint run.ckpt

What it shows is the loop every trainer writes, and that it survives being killed:

    loader = gpufeed.Loader(DATA, batch_size=B, on_error="mark",
                            images=gpufeed.Images("train", size=S))
    start = 0
    if checkpoint exists:
        model, opt, saved = load(checkpoint)
        loader.load_state_dict(saved)           # where the interrupted run stood
        start = saved["epoch"]
    for epoch in range(start, epochs):
        loader.set_epoch(epoch)                 # keeps the resume point for the saved epoch
        for b in gpufeed.torch.batches(loader, device="cuda"):   # the rest of that epoch, ...
            step(b.images[b.valid], b.labels[b.valid])   # a damaged image is not trained on
            if time to save: save(model, opt, loader.state_dict())

A damaged image (truncated, corrupt) is named once on stderr and left out of the step
(``on_error="mark"``: its batch arrives with the image zeroed and flagged in ``failed``).

A step may take seconds and the run may pause for minutes (evaluation, a checkpoint): gpufeed
waits as long as the step takes. ``--stop-after N`` ends the run after N steps, as a crash would
(run again with the same checkpoint to resume; steps after the last save are done again, as
after a real crash); ``--log-ids FILE`` appends each epoch's sample
ids (one JSON line per batch) so a test can check that every sample was seen exactly once
across the interruption.
"""

import argparse
import json
import os
import pickle
import sys
import time

import numpy as np

import gpufeed


class NumpyModel:
    """Softmax regression on 8×8 average-pooled images: the same loop, no torch."""

    def __init__(self, classes, size):
        self.pool = size // 8
        self.w = np.zeros((3 * 8 * 8, classes), dtype=np.float32)
        self.b = np.zeros(classes, dtype=np.float32)

    def step(self, x, y, lr=0.05):
        x = x.astype(np.float32)
        n, c, h, w = x.shape
        p = self.pool
        x = x[:, :, : 8 * p, : 8 * p].reshape(n, c, 8, p, 8, p).mean(axis=(3, 5)).reshape(n, -1)
        logits = x @ self.w + self.b
        logits -= logits.max(axis=1, keepdims=True)
        prob = np.exp(logits)
        prob /= prob.sum(axis=1, keepdims=True)
        loss = float(-np.log(prob[np.arange(n), y] + 1e-9).mean())
        prob[np.arange(n), y] -= 1.0
        self.w -= lr * (x.T @ prob) / n
        self.b -= lr * prob.mean(axis=0)
        return loss

    def save(self, path, loader_state):
        with open(path + ".tmp", "wb") as f:
            pickle.dump({"w": self.w, "b": self.b, "loader": loader_state}, f)
        os.replace(path + ".tmp", path)  # a checkpoint is whole or absent

    def load(self, path):
        with open(path, "rb") as f:
            st = pickle.load(f)
        self.w, self.b = st["w"], st["b"]
        return st["loader"]


class TorchModel:
    """A small CNN, trained with SGD on the loader's tensors (shared with torch by DLPack)."""

    def __init__(self, classes, size, device):
        import torch

        self.torch = torch
        self.device = torch.device(device)
        self.net = torch.nn.Sequential(
            torch.nn.Conv2d(3, 16, 3, stride=2, padding=1), torch.nn.ReLU(),
            torch.nn.Conv2d(16, 32, 3, stride=2, padding=1), torch.nn.ReLU(),
            torch.nn.AdaptiveAvgPool2d(1), torch.nn.Flatten(), torch.nn.Linear(32, classes),
        ).to(self.device)
        self.opt = torch.optim.SGD(self.net.parameters(), lr=0.05, momentum=0.9)

    def step(self, x, y):
        torch = self.torch
        loss = torch.nn.functional.cross_entropy(self.net(x.float()), y)
        self.opt.zero_grad(set_to_none=True)
        loss.backward()
        self.opt.step()
        return loss.item()

    def save(self, path, loader_state):
        state = {"net": self.net.state_dict(), "opt": self.opt.state_dict(), "loader": loader_state}
        self.torch.save(state, path + ".tmp")
        os.replace(path + ".tmp", path)

    def load(self, path):
        st = self.torch.load(path, weights_only=False)
        self.net.load_state_dict(st["net"])
        self.opt.load_state_dict(st["opt"])
        return st["loader"]


def batches(loader, backend, device):
    """(images, labels of the valid samples; sample ids, epoch, errors) of each batch of a pass:
    with torch the ``gpufeed.torch`` records, with numpy the batch's own buffers and flags."""
    if backend == "torch":
        import gpufeed.torch

        for b in gpufeed.torch.batches(loader, device=device):
            yield b.images[b.valid], b.labels[b.valid], b.sample_ids.tolist(), b.epoch, b.errors
    else:
        for b in loader:
            valid = (np.from_dlpack(b.failed) == 0) & (np.from_dlpack(b.padding) == 0)
            yield (np.from_dlpack(b.images)[valid], np.from_dlpack(b.labels)[valid],
                   np.from_dlpack(b.sample_ids).tolist(), b.epoch, b.errors)


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("dataset")
    p.add_argument("--backend", choices=("torch", "numpy"), default="torch")
    p.add_argument("--device", default="cpu", help="torch backend: cpu, cuda, cuda:N")
    p.add_argument("--epochs", type=int, default=1)
    p.add_argument("--batch-size", type=int, default=64)
    p.add_argument("--size", type=int, default=64, help="training crop side in pixels")
    p.add_argument("--classes", type=int, default=1000, help="labels are 0 .. classes - 1")
    p.add_argument("--checkpoint", help="saved every --save-every steps and at each epoch's end")
    p.add_argument("--save-every", type=int, default=5)
    p.add_argument("--stop-after", type=int, default=0, help="end after this many steps")
    p.add_argument("--log-ids", help="append each batch's sample ids (JSON lines)")
    args = p.parse_args()

    loader = gpufeed.Loader(
        args.dataset, batch_size=args.batch_size, on_error="mark",
        images=gpufeed.Images("train", size=args.size,
                              dtype="float16" if args.backend == "torch" else "float32"),
    )
    classes = args.classes
    if args.backend == "torch":
        model = TorchModel(classes, args.size, args.device)
    else:
        model = NumpyModel(classes, args.size)
    start = 0
    if args.checkpoint and os.path.exists(args.checkpoint):
        saved = model.load(args.checkpoint)
        loader.load_state_dict(saved)
        start = saved["epoch"]
        print(f"resuming at epoch {saved['epoch']}, batch {saved['batch']}", flush=True)
    print(f"{loader.num_samples} images, {len(loader)} batches an epoch, {classes} classes, "
          f"{loader.decode_threads} decode threads", flush=True)
    log = open(args.log_ids, "a") if args.log_ids else None
    steps = 0
    for epoch in range(start, args.epochs):
        loader.set_epoch(epoch)
        t0, seen, loss = time.perf_counter(), 0, float("nan")
        for x, y, ids, batch_epoch, errors in batches(loader, args.backend, args.device):
            for _, message in errors:
                print(f"left out: {message}", file=sys.stderr, flush=True)
            if len(y):
                loss = model.step(x, y)
            seen += len(ids)
            steps += 1
            if log:
                log.write(json.dumps({"epoch": batch_epoch, "ids": ids}) + "\n")
                log.flush()
            if args.checkpoint and steps % args.save_every == 0:
                model.save(args.checkpoint, loader.state_dict())
            if args.stop_after and steps >= args.stop_after:
                print(f"stopping after {steps} steps (epoch {epoch})", flush=True)
                return 3
        if args.checkpoint:
            model.save(args.checkpoint, loader.state_dict())
        rate = seen / (time.perf_counter() - t0)
        print(f"epoch {epoch}: {seen} images, loss {loss:.3f}, {rate:.0f} images/s", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
