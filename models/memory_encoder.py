"""The segment-recurrent encoder of Memformer: the segment loop sits outside the layers.

Segment ``t`` runs through every block with the memory state ``S_t`` and yields its outputs and
``S_{t+1}`` (Eq. 5): ``S = (M_t,)`` for the unified memory (read by each layer's memory
cross-attention between self-attention and FFN, written from the final hidden states), or
``S = (M^1_t, .., M^L_t)`` for per-layer memories (each layer's mixer reads and writes its own).
See :mod:`attention.memformer` for the equations and the choices.

**What the recurrence forces** (issue 62). Segment ``t`` needs ``M_t``, which the slot attention
writes from segment ``t - 1``'s final hidden states, after every layer: so the segments run one
after another through the whole encoder, and a training step launches about ``T`` times one
segment's operators (``T = N / segment_len``; at Table 2's N = 1024 and 32-token segments, 32
passes of about 580 operators each: 18,637, 39 times linear attention's step). Nothing across
segments can be batched without changing the model (a per-layer memory still waits for its own
layer's previous segment). What does not depend on the memory is batched: the embedding, the
segment split, the final concatenation and pooling run once; within a segment every layer's
self-attention, memory read and slot write are batched over the batch and heads. On a GPU that
loop is what CUDA graphs (``bench.compile=reduce-overhead``) replay in one launch per graph.

With a summary (CLS) token at index 0 of the input, the token is processed last, as a segment of
its own that reads the final memory, and its output is returned at index 0 (the CLS pooler's
place): the logits then depend on every segment.

MRBP (``mrbp: true`` in training): each segment runs under checkpointing with the memory state as
its boundary, so the forward pass keeps only the segment inputs and the memories,
and the backward pass replays one segment at a time, back-propagating its output gradient and
``dL/dS_{t+1}`` (Algorithm 1). The checkpointing is the non-reentrant kind (``use_reentrant=False``):
its forward pass keeps no activation of the segment (Algorithm 1 line 4) and the replay runs inside
the ordinary backward pass, under the forward's RNG and autocast state. Unlike the reentrant kind
it runs under DistributedDataParallel (the reentrant one makes DDP see each parameter ready twice,
"Expected to mark a variable ready only once"), and allows ``torch.autograd.grad``; its gradients
equal BPTT's bit for bit in float32 and float64. On CPU a step costs about one extra forward pass
(~1.5x BPTT); the kept state no longer grows with depth (figures: ``python -m lra.bench.mrbp``).
Measured at 32 segments of 32 tokens (batch 8, d 128, 4 layers): the peak of live tensors is 37 MB
against the reentrant kind's 41 MB and BPTT's 520 MB; the process's peak RSS on CPU is higher than
the reentrant kind's (147 against 77 MB, BPTT 778 MB: glibc keeps more freed blocks when the
forward runs with gradients enabled).

Padding is decided once per batch (:class:`attention.padding.Padding`), not once per layer and
segment: a segment is padded if the batch is, or if it is the tail that reaches past the sequence
(:meth:`~attention.padding.Padding.segments`); the summary segment never is. Each segment's
padding is an argument of :meth:`MemformerEncoder.step`, so MRBP's replay in the backward pass
needs no device read either.
"""
from __future__ import annotations

import torch
from torch import Tensor, nn
from torch.utils.checkpoint import checkpoint

from attention.masking import pad_to_multiple
from attention.memformer import MemformerAttention, UnifiedMemory
from attention.padding import Padding, as_padding
from models.encoder import Encoder


class MemformerEncoder(nn.Module):
    def __init__(self, encoder: Encoder, summary_first: bool = False) -> None:
        super().__init__()
        self.encoder = encoder
        self.mixers: list[MemformerAttention] = [b.attn.mixer for b in encoder.blocks]
        first = self.mixers[0]
        self.segment_len, self.unified, self.mrbp = first.segment_len, first.memory == "unified", first.mrbp
        self.summary_first = summary_first
        if self.unified:
            d = encoder.norm.normalized_shape[0]
            self.memory = UnifiedMemory(d, first.n_heads, len(encoder.blocks), first.memory_slots)

    def initial_state(self, batch: int) -> tuple[Tensor, ...]:
        if self.unified:
            return (self.memory.initial.expand(batch, -1, -1),)
        return tuple(m.memory_init.expand(batch, -1, -1) for m in self.mixers)

    def step(self, x: Tensor, pad: Padding, *state: Tensor) -> tuple[Tensor, ...]:
        """One segment ``x [B, L, d]`` with its padding through every layer: ``(H_t, *S_{t+1})``."""
        if self.unified:
            (mem,) = state
            for block, reader in zip(self.encoder.blocks, self.memory.readers):
                x = block.attend(x, pad)
                x = block.feed_forward(x + block.dropout(reader(x, mem)))
            h = self.encoder.norm(x)
            return (h, self.memory.write(mem, h, pad.mask))
        try:
            nxt = []
            for block, mixer, mem in zip(self.encoder.blocks, self.mixers, state):
                mixer.carry = mem
                x = block(x, pad)
                nxt.append(mixer.carry)
        finally:
            for mixer in self.mixers:
                mixer.carry = None
        return (self.encoder.norm(x), *nxt)

    def unroll(self, x: Tensor, pad: Padding | Tensor) -> tuple[Tensor, list[tuple[Tensor, ...]]]:
        """Outputs ``[B, N, d]`` and the states ``S_0 .. S_T`` (after each token segment)."""
        summary, pad = None, as_padding(pad)
        if self.summary_first:              # the CLS column is real: ``any`` is the same without it
            summary, x, pad = x[:, :1], x[:, 1:], Padding.of(pad.mask[:, 1:], pad.any)
        n = x.shape[1]
        xs = pad_to_multiple(x, self.segment_len, dim=1).split(self.segment_len, dim=1)
        run = self.step
        if self.mrbp and self.training and torch.is_grad_enabled():
            def run(*args) -> tuple[Tensor, ...]:
                return checkpoint(self.step, *args, use_reentrant=False)
        states = [self.initial_state(x.shape[0])]
        outs = []
        for xt, pt in zip(xs, pad.segments(self.segment_len)):
            h, *nxt = run(xt, pt, *states[-1])
            outs.append(h)
            states.append(tuple(nxt))
        h = torch.cat(outs, dim=1)[:, :n]
        if summary is not None:
            h = torch.cat([run(summary, Padding.full(x.shape[0], 1, x.device), *states[-1])[0], h], dim=1)
        return h, states

    def forward(self, x: Tensor, pad: Padding) -> Tensor:
        return self.unroll(x, pad)[0]
