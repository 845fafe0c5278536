"""A 2-layer LRA classifier of any config and its batches, small enough to train a step of every
config in a test (host-sync counts, CUDA-autocast emulation, DDP): the variant check's network
(:mod:`lra.checks.contract`)."""
from __future__ import annotations

from lra.checks.contract import BATCH, PADDED_LENGTHS, SEQ, step_batch, tiny_network, training_loss  # noqa: F401
