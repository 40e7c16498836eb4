#!/usr/bin/env python3
"""The same toy training loop as train_torch.py, fed by torch.utils.data.DataLoader over an
ImageFolder directory (one file per sample) — the baseline gpufeed is compared with.

    python examples/train_torch_dataloader.py /nvme/gpufeed-load/small --device cuda
"""

import argparse
import os
import time

import torch
from torch.utils.data import DataLoader, Dataset

K = 1024


class RawImageFolder(Dataset):
    """(first K bytes zero-padded, label) per file of root/<class>/<file>."""

    def __init__(self, root):
        classes = sorted(d for d in os.listdir(root) if os.path.isdir(os.path.join(root, d)))
        self.items = [
            (os.path.join(root, c, f), label)
            for label, c in enumerate(classes)
            for f in sorted(os.listdir(os.path.join(root, c)))
        ]

    def __len__(self):
        return len(self.items)

    def __getitem__(self, i):
        path, label = self.items[i]
        with open(path, "rb") as f:
            raw = f.read()
        x = torch.zeros(K, dtype=torch.uint8)
        head = torch.frombuffer(bytearray(raw[:K]), dtype=torch.uint8)
        x[: len(head)] = head
        return x, label


def main():
    p = argparse.ArgumentParser()
    p.add_argument("root")
    p.add_argument("--device", default="cpu")
    p.add_argument("--epochs", type=int, default=1)
    p.add_argument("--batch-size", type=int, default=256)
    p.add_argument("--classes", type=int, default=1000)
    args = p.parse_args()

    dev = torch.device(args.device)
    dl = DataLoader(
        RawImageFolder(args.root), batch_size=args.batch_size, shuffle=True,
        num_workers=os.cpu_count(), pin_memory=dev.type == "cuda",
    )
    model = torch.nn.Linear(K, args.classes).to(dev)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    for epoch in range(args.epochs):
        t0, seen = time.perf_counter(), 0
        for x, labels in dl:
            x = x.to(dev, non_blocking=True).float() / 255.0
            labels = labels.to(dev, non_blocking=True)
            loss = torch.nn.functional.cross_entropy(model(x), labels)
            opt.zero_grad(set_to_none=True)
            loss.backward()
            opt.step()
            seen += len(labels)
        if dev.type == "cuda":
            torch.cuda.synchronize()
        print(f"epoch {epoch}: loss {loss.item():.3f}, {seen / (time.perf_counter() - t0):.0f} samples/s")


if __name__ == "__main__":
    main()
