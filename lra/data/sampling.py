"""A training sampler that is a pure function of (seed, optimiser step), so a resumed run reads
exactly the batches an uninterrupted run would have read.

Lightning restarts a plain DataLoader from its beginning when it resumes mid-epoch, which silently
changes the data order. Here one Lightning "epoch" is the whole run: the stream is the
concatenation of per-epoch permutations ``perm(seed, e)`` of the dataset, batch ``t`` of rank ``r``
is stream positions ``[(t*W + r)*B, (t*W + r + 1)*B)``, and iteration starts at the step the trainer
has restored. Batches may straddle an epoch boundary (documented choice: every batch is full).
"""
from __future__ import annotations

from typing import Callable, Iterator

import torch
from torch.utils.data import Sampler


class StepStreamSampler(Sampler[int]):
    def __init__(
        self, n: int, batch_size: int, total_steps: int, seed: int,
        start_step: Callable[[], int] = lambda: 0, rank: int = 0, world_size: int = 1,
    ) -> None:
        if n <= 0:
            raise ValueError("the training split is empty: check the task's data settings")
        self.n, self.batch_size, self.total_steps = n, batch_size, total_steps
        self.seed, self.start_step, self.rank, self.world_size = seed, start_step, rank, world_size

    def __len__(self) -> int:
        return self.total_steps * self.batch_size

    def _perm(self, epoch: int) -> torch.Tensor:
        g = torch.Generator().manual_seed(self.seed * 1_000_003 + epoch)
        return torch.randperm(self.n, generator=g)

    def __iter__(self) -> Iterator[int]:
        b, w = self.batch_size, self.world_size
        epoch, perm = -1, None
        for step in range(self.start_step(), self.total_steps):
            first = (step * w + self.rank) * b
            for pos in range(first, first + b):
                e, offset = divmod(pos, self.n)
                if e != epoch:
                    epoch, perm = e, self._perm(e)
                yield int(perm[offset])
