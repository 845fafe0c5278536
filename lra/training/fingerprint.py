"""The behavioural fingerprint: what the model's code does, measured, so that a run knows it.

A commit hash says which code ran, not whether it computes the same thing: an uncommitted edit, a
refactor that keeps every number, and a one-character bug in a mask look alike to it. So every run
record carries a measurement of its model (Sacred records source hashes and a dirty flag; this goes
one step further): the network built from the run's config takes two optimiser steps on one small
canonical batch with padding, and the two training losses and the first logits afterwards (eval
mode) are stored. Resume and the report compare fingerprints within float tolerance
(:func:`lra.identity.behaviour_difference`): an edited variant is a new experiment, a refactor that
keeps behaviour is not.

Choices, written down:

* Seed: the fingerprint is built from :data:`SEED`, not the run's seed, so every seed of one
  experiment shares it and the report can pool them; it is a property of the code and the seedless
  config. (Weights, dropout and a variant's own random stream all start from it.)
* Batch: 2 rows of the task's full ``max_len`` (some variants are built for that length: Linformer's
  projections, block sizes), token ids drawn from a fixed generator in ``[1, vocab)``; row 0 is all
  real, row 1 keeps the first 60% (so padding is exercised); retrieval gets two documents per row,
  the second padded. Labels 0 and 1 (mod the classes).
* Steps: plain SGD at :data:`LR`: its update is linear in the gradient, so the float noise of a
  reordered reduction (another thread count, a fused kernel) stays float noise, while a wrong or
  detached gradient moves the logits. Adam's first step, ``g / (|g| + eps)``, would turn noise on a
  near-zero gradient into a full step. The run's own training step computes each loss
  (``training_step``: the task loss plus a variant's auxiliary loss), in training mode, on CPU, in
  float32, whatever device the run uses, so fingerprints compare across machines.
* Cost: two forward/backward passes at batch 2 (about a second at ListOps' N = 2000 on one thread),
  once per ``run.py`` start; the global RNG states are left as they were.
"""
from __future__ import annotations

import random
import warnings
from typing import Any, Callable

import numpy as np
import torch
from omegaconf import DictConfig, OmegaConf, open_dict

VERSION = 1          # bump when what is measured changes: fingerprints of two versions never compare
SEED = 0
LR = 0.1
STEPS = 2
LOGITS = 8           # how many logits are kept (of the batch's, flattened)
KEEP = 0.6           # the real share of the padded row


def canonical_batch(vocab_size: int, num_classes: int, max_len: int, dual: bool = False) -> dict[str, torch.Tensor]:
    """The fixed batch every fingerprint is measured on (see the module's choices)."""
    g = torch.Generator().manual_seed(20261201)
    docs = 2 if dual else 1
    ids = torch.randint(1, max(int(vocab_size), 2), (2, docs, max_len), generator=g)
    mask = torch.ones(2, docs, max_len, dtype=torch.bool)
    mask[1, -1, max(1, int(KEEP * max_len)):] = False
    ids = ids.masked_fill(~mask, 0)
    if not dual:
        ids, mask = ids[:, 0], mask[:, 0]
    return {"ids": ids, "mask": mask, "label": torch.tensor([0, 1 % max(int(num_classes), 1)]),
            "padded": True}


def measure(module: torch.nn.Module, batch: dict[str, torch.Tensor], forward: Callable[[Any], torch.Tensor] | None = None
            ) -> dict[str, Any]:
    """Two SGD steps of ``module.training_step`` on ``batch``, then the eval-mode logits (``forward``
    maps the batch to them; default: ``module(ids, mask, padded)``)."""
    forward = forward or (lambda b: module(b["ids"], b["mask"], b.get("padded")))
    opt = torch.optim.SGD([p for p in module.parameters() if p.requires_grad], lr=LR)
    losses = []
    module.train()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # self.log() outside a Trainer: nothing to log to, by design
        for step in range(STEPS):
            opt.zero_grad(set_to_none=True)
            loss = module.training_step(dict(batch), step)
            loss.backward()
            opt.step()
            losses.append(float(loss.detach()))
    module.eval()
    with torch.no_grad():
        logits = forward(dict(batch)).detach().float().flatten()[:LOGITS]
    return {"version": VERSION, "losses": losses, "logits": [float(v) for v in logits]}


def isolated(fn: Callable[[], Any]) -> Any:
    """Run ``fn`` from :data:`SEED` without touching the caller's random states or thread settings."""
    state = random.getstate(), np.random.get_state()
    try:
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(SEED)
            random.seed(SEED)
            np.random.seed(SEED)
            return fn()
    finally:
        random.setstate(state[0])
        np.random.set_state(state[1])


def fingerprint_config(cfg: DictConfig) -> DictConfig:
    """The run's config at the fingerprint's seed (settings that follow ``${seed}`` follow it)."""
    copy = OmegaConf.create(OmegaConf.to_container(cfg, resolve=False))
    with open_dict(copy):
        copy.seed = SEED
    return copy


def behavioural_fingerprint(cfg: DictConfig, build: Callable[[DictConfig], torch.nn.Module]) -> dict[str, Any]:
    """The fingerprint of the module ``build(cfg)`` makes (the run's own builder) at :data:`SEED`."""
    fcfg = fingerprint_config(cfg)
    net = fcfg.model
    batch = canonical_batch(net.vocab_size, net.num_classes, int(net.max_len), bool(net.get("dual", False)))
    return isolated(lambda: measure(build(fcfg), batch))
