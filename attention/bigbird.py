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
  global and move the random blocks). Samples are processed in groups of equal ``nb`` (one pass
  when the batch has no padding). Host syncs: none for a batch without padding (decided once per
  batch, ``Padding.any``); for a padded batch one ``.tolist()`` of the ``B`` plan lengths per
  layer, which the ragged plans need (the groups are slices of one sort). No tensor is built
  from host data (the global slots come from ``arange``). Graph-safe mode (``torch.compile``)
  reads nothing: each sample's plan is built on the device from its own ``nb`` (a tensor), as one
  table ``[B, H, nb_max - 1, 2 + window + r]`` over every query block after the first, with the
  random slots drawn among all ``nb_max`` blocks with those past the sample's end excluded (the
  same blocks as the eager plan of ``nb``: priorities are distinct integers); each sample's last
  block is its global row, blocks past it are padding (zeroed). Static shapes; the batch is folded
  into the heads so the eager block kernel serves it. Lengths that do not divide the block
  size are padded inside (masked keys) and cut back; padding is masked everywhere, including
  inside global and random blocks; a sample with no real token gives zeros.
* Block-wise implementation: a gather of ``3 + 2 + r`` key blocks per query block
  (``O(N * (5 + r) * block_size)``) plus dense rows for the two global query blocks.
"""
from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import Tensor

from attention.base import Mixer
from attention.blocks import block_sparse_attention, dense_rows, from_blocks, mask_blocks, slot_allow, to_blocks
from attention.graph_safe import graph_safe_active
from attention.masking import zero_padded
from attention.padding import Padding
from attention.spec import Grid, Knob, Range, Spec, cap, int_range


def plan_lengths(mask: Tensor, bs: int) -> tuple[Tensor, list[int]]:
    """Samples ordered by plan length ``[B]``, and the lengths in that order (a host read): a
    sample's plan has the blocks up to its last real token (0 for an empty sample)."""
    pos = torch.arange(1, mask.shape[1] + 1, device=mask.device)
    real_blocks = torch.div((pos * mask).amax(dim=-1) + bs - 1, bs, rounding_mode="floor")
    order = torch.argsort(real_blocks, stable=True)
    return order, real_blocks.index_select(0, order).tolist()


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

    def _table(self, nb: int) -> tuple[Tensor, Tensor]:
        """Key blocks of the middle query blocks 1..nb-2 of the one plan of ``nb`` blocks (``[H,
        nb - 2, 2 + window + r]``): :meth:`_tables` for one sample whose last block is ``nb - 1``,
        without the row of that (global) block."""
        idx, valid = self._tables(nb, torch.full((), nb - 1, device=self.rand_priority.device))
        return idx[:, :-1], valid[:, :-1]

    def forward(self, q: Tensor, k: Tensor, v: Tensor, pad: Padding, x: Tensor) -> Tensor:
        mask = pad.mask
        n, bs = q.shape[2], self.block_size
        if not pad.any:                                        # one plan for the whole batch
            return self._attend(q, k, v, pad)
        if graph_safe_active():
            return self._attend_per_sample(q, k, v, pad)
        order, sizes = plan_lengths(mask, bs)
        if sizes[0] == sizes[-1] == math.ceil(n / bs):
            return self._attend(q, k, v, pad)
        out = None    # in the dtype of the attention (under autocast it need not be v's)
        start = 0
        for stop in range(1, len(sizes) + 1):
            if stop < len(sizes) and sizes[stop] == sizes[start]:
                continue
            nb, rows, start = sizes[start], order[start:stop], stop
            if nb == 0:
                continue
            cut = min(n, nb * bs)
            part = self._attend(q[rows, :, :cut], k[rows, :, :cut], v[rows, :, :cut], Padding.of(mask[rows, :cut], True))
            out = part.new_zeros(v.shape) if out is None else out
            out = out.index_copy(0, rows, F.pad(part, (0, 0, 0, n - cut)))
        return torch.zeros_like(v) if out is None else out

    def _attend(self, q: Tensor, k: Tensor, v: Tensor, pad: Padding) -> Tensor:
        """The BigBird pattern of the (cut) length of ``q``: every sample's last block is its last
        real one."""
        mask = pad.mask
        n, bs = q.shape[2], self.block_size
        qs = q * (1.0 / math.sqrt(q.shape[-1]))
        qb, kb, vb, mb = to_blocks(qs, bs), to_blocks(k, bs), to_blocks(v, bs), mask_blocks(mask, bs)
        b, h, nb, _, d = qb.shape
        kf, vf, mf = kb.view(b, h, nb * bs, d), vb.view(b, h, nb * bs, d), mb.view(b, nb * bs)
        if nb <= 2:                                                      # all blocks global: exact softmax
            return zero_padded(dense_rows(qs, kf, vf, mf)[:, :, :n], pad)
        idx, valid = self._table(nb)
        mid = block_sparse_attention(qb[:, :, 1:nb - 1], kb, vb, mb, idx, slot_allow(valid, bs))
        first = dense_rows(qb[:, :, 0], kf, vf, mf)
        last = dense_rows(qb[:, :, nb - 1], kf, vf, mf)
        out = torch.cat([first.unsqueeze(2), mid, last.unsqueeze(2)], dim=2)
        return zero_padded(from_blocks(out, n), pad)

    def _attend_per_sample(self, q: Tensor, k: Tensor, v: Tensor, pad: Padding) -> Tensor:
        """Graph-safe: every sample's own plan (its ``nb`` blocks up to its last real token) in
        static shapes, no host read. Equals the eager grouping by plan length."""
        mask = pad.mask
        n, bs = q.shape[2], self.block_size
        qs = q * (1.0 / math.sqrt(q.shape[-1]))
        qb, kb, vb, mb = to_blocks(qs, bs), to_blocks(k, bs), to_blocks(v, bs), mask_blocks(mask, bs)
        b, h, nb, _, d = qb.shape
        dev = q.device
        pos = torch.arange(1, n + 1, device=dev)
        last = torch.div((pos * mask).amax(dim=-1) + bs - 1, bs, rounding_mode="floor").sub(1).clamp_min(0)  # [B]
        blocks = torch.arange(nb, device=dev)
        kf, vf, mf = kb.view(b, h, nb * bs, d), vb.view(b, h, nb * bs, d), mb.view(b, nb * bs)
        first = dense_rows(qb[:, :, 0], kf, vf, mf)                                      # [B, H, bs, D]
        rows = torch.arange(b, device=dev)
        final = dense_rows(qb[rows, :, last], kf, vf, mf)                                # each sample's last block
        out = first.unsqueeze(2).expand(b, h, nb, bs, d)
        if nb > 1:
            idx, valid = self._tables(nb, last)                                          # [B, H, nb-1, S]
            s_ = idx.shape[-1]
            flat = (idx + nb * torch.arange(b, device=dev)[:, None, None, None]).reshape(-1)
            keys = mb.reshape(b * nb, bs).index_select(0, flat).view(b, h, nb - 1, s_ * bs)
            allow = keys & valid.repeat_interleave(bs, dim=-1)
            # samples folded into the heads: per-head tables are what the block kernel takes
            mid = block_sparse_attention(
                qb[:, :, 1:].reshape(1, b * h, nb - 1, bs, d), kb.reshape(1, b * h, nb, bs, d),
                vb.reshape(1, b * h, nb, bs, d), mb.new_ones(1, nb, bs), idx.reshape(b * h, nb - 1, s_),
                allow.reshape(1, b * h, nb - 1, 1, s_ * bs)).view(b, h, nb - 1, bs, d)
            out = torch.cat([first.unsqueeze(2), mid], dim=2)
        is_last = (blocks[None, :] == last[:, None])[:, None, :, None, None]             # [B, 1, nb, 1, 1]
        out = torch.where(is_last, final.unsqueeze(2), out)
        return zero_padded(from_blocks(out, n), pad)

    def _tables(self, nb: int, last: Tensor) -> tuple[Tensor, Tensor]:
        """Key blocks of query blocks ``1..nb-1`` among ``nb`` blocks whose last real one is ``last``
        (0-dim: one plan; ``[B]``: one per sample): global (first, ``last``), window, random
        (``[(B,) H, nb - 1, 2 + window + r]`` and their validity). A window slot on a global block is
        invalid (that block comes via its global slot). Graph-safe mode takes every sample's table;
        the eager plan of one length (:meth:`_table`) is the one-sample case."""
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
