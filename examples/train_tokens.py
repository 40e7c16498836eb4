#!/usr/bin/env python3
"""Train a language model on a token corpus as nanoGPT does, with checkpoints that resume exactly.

    # PyTorch (CPU or GPU): nanoGPT's train.bin (uint16 tokens) or a Megatron-LM prefix
    python examples/train_tokens.py data/owt/train.bin --seq-len 1024 --vocab 50304
    python examples/train_tokens.py data/my_text_document --seq-len 2048 --vocab 50304
    # the same loop without torch: a bigram model in numpy (what CI runs)
    python examples/train_tokens.py DATA --backend numpy --vocab 256 --epochs 2 --checkpoint run.ckpt

Where nanoGPT's ``get_batch`` draws random windows from a memmap, gpufeed reads an epoch of
windows (every window once, a new order each epoch, restartable mid-epoch) and hands each batch
over as the same pair: ``x`` is ``[batch, seq_len]`` int64 tokens, ``y`` the same shifted by one::

    loader = gpufeed.Loader(DATA, format="tokens", seq_len=T, batch_size=B)   # flat file
    loader = gpufeed.Loader(PREFIX, seq_len=T, batch_size=B)                 # Megatron prefix
    for x, y in gpufeed.torch.batches(loader, device="cuda"):               # torch
        logits, loss = model(x, y)
    for batch in loader:                                                     # numpy
        x, y = (np.from_dlpack(t) for t in batch.pairs())

``--stop-after N`` ends the run after N steps, as a crash would; run again with the same
checkpoint to resume. ``--log-ids FILE`` appends each batch's window ids (JSON lines) so a
test can check that every window was seen exactly once across the interruption.
"""

import argparse
import json
import os
import pickle
import sys
import time

import numpy as np

import gpufeed


class NumpyBigram:
    """nanoGPT's bigram model (logits of the next token are a row of a table) in numpy."""

    def __init__(self, vocab):
        self.w = np.zeros((vocab, vocab), dtype=np.float32)

    def step(self, x, y, lr=1.0):
        logits = self.w[x]  # [B, T, V]
        logits -= logits.max(axis=-1, keepdims=True)
        prob = np.exp(logits)
        prob /= prob.sum(axis=-1, keepdims=True)
        b, t = y.shape
        bi, ti = np.meshgrid(np.arange(b), np.arange(t), indexing="ij")
        loss = float(-np.log(prob[bi, ti, y] + 1e-9).mean())
        prob[bi, ti, y] -= 1.0
        np.add.at(self.w, x.reshape(-1), -lr * prob.reshape(-1, prob.shape[-1]) / (b * t))
        return loss

    def save(self, path, loader_state):
        with open(path + ".tmp", "wb") as f:
            pickle.dump({"w": self.w, "loader": loader_state}, f)
        os.replace(path + ".tmp", path)  # a checkpoint is whole or absent

    def load(self, path):
        with open(path, "rb") as f:
            st = pickle.load(f)
        self.w = st["w"]
        return st["loader"]


class TorchBigram:
    """The same model in torch (nanoGPT's ``BigramLanguageModel``), trained with AdamW."""

    def __init__(self, vocab, device):
        import torch

        self.torch = torch
        self.device = torch.device(device)
        self.table = torch.nn.Embedding(vocab, vocab).to(self.device)
        self.opt = torch.optim.AdamW(self.table.parameters(), lr=1e-2)

    def step(self, x, y):
        logits = self.table(x)
        loss = self.torch.nn.functional.cross_entropy(logits.view(-1, logits.size(-1)), y.view(-1))
        self.opt.zero_grad(set_to_none=True)
        loss.backward()
        self.opt.step()
        return loss.item()

    def save(self, path, loader_state):
        st = {"table": self.table.state_dict(), "opt": self.opt.state_dict(), "loader": loader_state}
        self.torch.save(st, path + ".tmp")
        os.replace(path + ".tmp", path)

    def load(self, path):
        st = self.torch.load(path, weights_only=False)
        self.table.load_state_dict(st["table"])
        self.opt.load_state_dict(st["opt"])
        return st["loader"]


def pairs(loader, backend, device):
    """(x, y, window ids, epoch) of each batch of one pass."""
    if backend == "torch":
        import gpufeed.torch

        for b in gpufeed.torch.batches(loader, device=device):
            x, y = b
            yield x, y, b.sample_ids.tolist(), b.epoch
    else:
        for b in loader:
            x, y = (np.from_dlpack(t) for t in b.pairs())
            yield x, y, np.from_dlpack(b.sample_ids).tolist(), b.epoch


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("dataset", help="a flat token file (nanoGPT's train.bin) or a Megatron prefix")
    p.add_argument("--backend", choices=("torch", "numpy"), default="torch")
    p.add_argument("--device", default="cpu", help="torch backend: cpu, cuda, cuda:N")
    p.add_argument("--seq-len", type=int, default=256)
    p.add_argument("--vocab", type=int, default=50304, help="token ids are below this")
    p.add_argument("--token-dtype", default=None, help="flat files: u16 (default) or u32")
    p.add_argument("--epochs", type=int, default=1)
    p.add_argument("--batch-size", type=int, default=12)
    p.add_argument("--checkpoint", help="saved every --save-every steps and at each epoch's end")
    p.add_argument("--save-every", type=int, default=5)
    p.add_argument("--stop-after", type=int, default=0, help="end after this many steps")
    p.add_argument("--log-ids", help="append each batch's window ids (JSON lines)")
    args = p.parse_args()

    # A Megatron prefix names itself (PREFIX.idx beside it); a flat file needs format="tokens".
    megatron = any(os.path.exists(p + ".idx")
                   for p in (args.dataset, os.path.splitext(args.dataset)[0]))
    opts = {} if megatron else {"format": "tokens", "token_dtype": args.token_dtype}
    loader = gpufeed.Loader(args.dataset, batch_size=args.batch_size, seq_len=args.seq_len, **opts)
    if args.backend == "torch":
        model = TorchBigram(args.vocab, args.device)
    else:
        model = NumpyBigram(args.vocab)
    start = 0
    if args.checkpoint and os.path.exists(args.checkpoint):
        saved = model.load(args.checkpoint)
        loader.load_state_dict(saved)
        start = saved["epoch"]
        print(f"resuming at epoch {saved['epoch']}, batch {saved['batch']}", flush=True)
    print(f"{loader.num_samples} windows of {args.seq_len} + 1 tokens, {len(loader)} batches an "
          f"epoch", flush=True)
    log = open(args.log_ids, "a") if args.log_ids else None
    steps = 0
    for epoch in range(start, args.epochs):
        loader.set_epoch(epoch)
        t0, seen, loss = time.perf_counter(), 0, float("nan")
        for x, y, ids, batch_epoch in pairs(loader, args.backend, args.device):
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
        rate = seen * args.seq_len / (time.perf_counter() - t0)
        print(f"epoch {epoch}: {seen} windows, loss {loss:.3f}, {rate:.0f} tokens/s", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
