"""BigBird block-sparse attention, ITC form (Zaheer et al. 2020, eq. 1 and App. D).

Generalised attention ``ATTN_D(X)_i = sum_h softmax(Q_h(x_i) K_h(X_{N(i)})^T / sqrt(d)) V_h(X_{N(i)})``
(eq. 1) with the neighbourhood N(i) built from blocks of ``block_size`` tokens (App. D, "BIGBIRD-ITC"):

* window: query block a reads blocks a-1, a, a+1 (``window_blocks = 3``);
* global: the first and the last block are global: they read every key and every query reads them;
* random: each non-global query block reads ``num_random_blocks`` (3) further blocks.

Choices the paper leaves open (and the fixes of known port defects), written down:

* The random plan is drawn once per layer, at construction, from a ``torch.Generator`` seeded with
  this mixer's seed, and stored as the persistent buffer ``rand_priority [H, nb_max, nb_max]`` (one
  priority per head, query block and key block, for ``nb_max = ceil(max_len/block_size)``): the
  rank (int64, distinct per row) of a uniform draw. Integers, so casting the model to bfloat16/half
  leaves the plan unchanged (float priorities rounded into ties and changed rows of the plan).
  At a length of ``nb`` blocks, query block a reads the ``num_random_blocks`` highest-priority key
  blocks among all blocks of the sequence except its window and the global blocks: a uniform draw
  without replacement from the *whole* sequence, fixed across calls (not redrawn per step, and not
  limited to the first 1024 tokens). Heads get independent plans, as in the reference code.
* When fewer candidate blocks exist than requested (short sequences) a query block reads all of
  them. A sequence of at most two blocks is all-global, i.e. exact softmax; that is the clamp for
  short inputs (no shrinking of the block size).
* A window block that is also a global block is read once (via the global slot).
* Padding: the plan of a sample follows its own real length, not the batch's padded length: with
  ``nb`` = the number of blocks up to its last real token, the global blocks are 0 and ``nb - 1``
  and the random blocks are drawn among its ``nb`` blocks, so a sequence gives the same output
  whatever padding the batch adds (the plan of the padded length would make a padding block
  global and move the random blocks). One path for every batch, padded or not, in static shapes
  and with no host sync: each sample's plan is built on the device from its own ``nb`` (a
  tensor), as one table ``[B, H, nb - 1, 2 + window + r]`` (``nb``: the batch's blocks) over every
  query block after the first, with the random slots drawn among all ``nb`` blocks with those past the sample's end
  excluded (the same blocks as the plan of a batch of that length alone: priorities are distinct
  integers); each sample's last block is its global row (its dense row replaces the table's row),
  blocks past it are padding (zeroed). The batch is folded into the heads, so one block kernel
  serves every plan. The whole batch has one branch on a Python int: ``nb <= 2`` (all global).
  Lengths that do not divide the block size are padded inside (masked keys) and cut back;
  padding is masked everywhere, including inside global and random blocks; a sample with no
  real token gives zeros.
* Block-wise implementation: a gather of ``3 + 2 + r`` key blocks per query block
  (``O(N * (5 + r) * block_size)``) plus dense rows for the two global query blocks. The row of
  the last block is also computed by the block kernel and replaced (one block row of waste, for
  static shapes). On CPU the block kernel runs in pieces of bounded size (``self.on_cpu``,
  :data:`attention.blocks.SCORE_PIECE`); on an accelerator in one pass, so the operators a step
  dispatches do not grow with N: 826 at N 1024 and at 4096 (1.73x linear attention's 478; the
  ragged groups and the split took 1116 and 2532; ``lra.bench --protocol dispatches``, batch 16,
  mixers on their accelerator choices).
"""
from __future__ import annotations

import math

import torch
from torch import Tensor

from attention.base import Mixer
from attention.blocks import block_sparse_attention, dense_rows, from_blocks, mask_blocks, to_blocks
from attention.masking import zero_padded
from attention.padding import Padding
from attention.spec import Grid, Knob, Range, Spec, cap, int_range


class BigBirdAttention(Mixer):
    spec = Spec(
        grid=Grid({"block_size": (64, 1, 2, 3, 5), "num_random_blocks": (3, 0, 1, 2, 5), "window_blocks": (3, 1, 5)},
                  # 7 blocks: the middle blocks have random candidates beyond their window
                  size="block_size", unit=lambda r: cap(r["block_size"], most=8), spans=(7, 6)),
        ranges={"block_size": int_range(1, 6), "num_random_blocks": int_range(0, 5),
                "window_blocks": Range("odd", 1, draw=(1, 7))},
        knobs=(Knob("window_blocks", (1, 3, 5, 9)),), draws=False, small={"block_size": 4},
        precision={"small": {"block_size": 1}},   # 37 blocks of one token: a changed random plan shows
        documented=lambda m, o, heads, max_len: [
            *((k, getattr(m, k), o[k]) for k in ("block_size", "num_random_blocks", "window_blocks")),
            ("plan", tuple(m.rand_priority.shape), (heads, *2 * (-(-max_len // o["block_size"]),)))])

    def __init__(self, n_heads: int, head_dim: int, max_len: int, layer_idx: int = 0, block_size: int = 64,
                 num_random_blocks: int = 3, window_blocks: int = 3) -> None:
        super().__init__(n_heads, head_dim, max_len, layer_idx)
        if block_size <= 0 or num_random_blocks < 0 or window_blocks < 1 or window_blocks % 2 == 0:
            raise ValueError("bigbird needs block_size > 0, num_random_blocks >= 0 and an odd window_blocks >= 1, "
                             f"got {block_size}, {num_random_blocks}, {window_blocks}")
        self.block_size = block_size
        self.num_random_blocks = num_random_blocks
        self.window_blocks = window_blocks
        nb_max = math.ceil(max_len / block_size)
        g = torch.Generator().manual_seed(self.seed)
        ranks = torch.rand(n_heads, nb_max, nb_max, generator=g).argsort(dim=-1).argsort(dim=-1)
        self.register_buffer("rand_priority", ranks)

    def _load_from_state_dict(self, state_dict, prefix, *args, **kwargs) -> None:
        # Checkpoints from before the integer plan stored float priorities: keep their plan (same order).
        key = prefix + "rand_priority"
        if key in state_dict and state_dict[key].is_floating_point():
            state_dict[key] = state_dict[key].float().argsort(dim=-1).argsort(dim=-1)
        super()._load_from_state_dict(state_dict, prefix, *args, **kwargs)

    def random_blocks(self, nb: int) -> tuple[Tensor, Tensor]:
        """The random plan at ``nb`` blocks: ``idx [H, nb, r]`` key blocks and ``valid [H, nb, r]``.

        Rows of the global blocks (0 and nb-1) are meaningless (those blocks read everything).
        """
        return self._random_candidates(0, nb, torch.full((), nb - 1, device=self.rand_priority.device))

    def _random_candidates(self, start: int, nb: int, last: Tensor) -> tuple[Tensor, Tensor]:
        """Random key blocks of query blocks ``start..nb-1`` among ``nb`` blocks whose last real one
        is ``last`` (0-dim: one plan; ``[B]``: one per sample): the highest priorities outside the
        window, the first block and ``last`` and beyond. ``idx, valid [(B,) H, nb - start, r]``; a
        slot is invalid where fewer candidates exist than ``r``."""
        if nb > self.rand_priority.shape[1]:
            raise ValueError(f"bigbird: sequence of {nb} blocks exceeds max_len={self.max_len} "
                             f"({self.rand_priority.shape[1]} blocks of {self.block_size}); raise task.max_len")
        dev = self.rand_priority.device
        a = torch.arange(start, nb, device=dev)[:, None]
        c = torch.arange(nb, device=dev)[None, :]
        w = self.window_blocks // 2
        excluded = ((a - c).abs() <= w) | (c == 0) | (c >= last[..., None, None])     # [(B,) nb - start, nb]
        pri = self.rand_priority[:, start:nb, :nb].masked_fill(excluded.unsqueeze(-3), -1)
        val, idx = pri.topk(min(self.num_random_blocks, nb), dim=-1)
        return idx, val >= 0

    def forward(self, q: Tensor, k: Tensor, v: Tensor, pad: Padding, x: Tensor) -> Tensor:
        """Every sample's own plan (its ``nb`` blocks up to its last real token) in static shapes,
        with no host read: the batch's samples are folded into the heads of one block kernel."""
        mask = pad.mask
        n, bs = q.shape[2], self.block_size
        qs = q * (1.0 / math.sqrt(q.shape[-1]))
        qb, kb, vb, mb = to_blocks(qs, bs), to_blocks(k, bs), to_blocks(v, bs), mask_blocks(mask, bs)
        b, h, nb, _, d = qb.shape
        kf, vf, mf = kb.view(b, h, nb * bs, d), vb.view(b, h, nb * bs, d), mb.view(b, nb * bs)
        if nb <= 2:                                                      # all blocks global: exact softmax
            return zero_padded(dense_rows(qs, kf, vf, mf)[:, :, :n], pad)
        dev = q.device
        pos = torch.arange(1, n + 1, device=dev)
        last = torch.div((pos * mask).amax(dim=-1) + bs - 1, bs, rounding_mode="floor").sub(1).clamp_min(0)  # [B]
        first = dense_rows(qb[:, :, 0], kf, vf, mf)                                      # [B, H, bs, D]
        final = dense_rows(qb[torch.arange(b, device=dev), :, last], kf, vf, mf)         # each sample's last block
        idx, valid = self._tables(nb, last)                                              # [B, H, nb-1, S]
        s_ = idx.shape[-1]
        flat = (idx + nb * torch.arange(b, device=dev)[:, None, None, None]).reshape(-1)
        keys = mb.reshape(b * nb, bs).index_select(0, flat).view(b, h, nb - 1, s_ * bs)
        allow = keys & valid.repeat_interleave(bs, dim=-1)
        # samples folded into the heads: per-head tables are what the block kernel takes
        mid = block_sparse_attention(
            qb[:, :, 1:].reshape(1, b * h, nb - 1, bs, d), kb.reshape(1, b * h, nb, bs, d),
            vb.reshape(1, b * h, nb, bs, d), mb.new_ones(1, nb, bs), idx.reshape(b * h, nb - 1, s_),
            allow.reshape(1, b * h, nb - 1, 1, s_ * bs), split=self.on_cpu).view(b, h, nb - 1, bs, d)
        out = torch.cat([first.unsqueeze(2), mid], dim=2)
        is_last = (torch.arange(nb, device=dev)[None, :] == last[:, None])[:, None, :, None, None]   # [B, 1, nb, 1, 1]
        out = torch.where(is_last, final.unsqueeze(2), out)
        return zero_padded(from_blocks(out, n), pad)

    def _tables(self, nb: int, last: Tensor) -> tuple[Tensor, Tensor]:
        """Key blocks of query blocks ``1..nb-1`` among ``nb`` blocks whose last real one is ``last``
        (0-dim: one plan; ``[B]``: one per sample): global (first, ``last``), window, random
        (``[(B,) H, nb - 1, 2 + window + r]`` and their validity). A window slot on a global block is
        invalid (that block comes via its global slot). The forward takes every sample's table
        (``last [B]``); a 0-dim ``last`` gives the plan of one length."""
        dev, h = last.device, self.rand_priority.shape[0]
        w = self.window_blocks // 2
        a = torch.arange(1, nb, device=dev)[:, None]                                      # query blocks
        lst = last[..., None, None]                                                      # [(B,) 1, 1]
        win = a + torch.arange(-w, w + 1, device=dev)[None, :]                           # [nb-1, W]
        win_valid = (win > 0) & (win < lst)                                              # [(B,) nb-1, W]
        glob = torch.stack(torch.broadcast_tensors(torch.zeros_like(lst), lst), -1)      # [(B,) 1, 1, 2]
        ridx, rvalid = self._random_candidates(1, nb, last)                              # [(B,) H, nb-1, r]
        rows = (*last.shape, h, nb - 1)
        idx = torch.cat([glob.expand(*rows, 2), win.clamp(0, nb - 1).expand(*rows, -1), ridx], -1)
        valid = torch.cat([torch.ones(*rows, 2, dtype=torch.bool, device=dev),
                           win_valid.unsqueeze(-3).expand(*rows, -1), rvalid], -1)
        return idx, valid
