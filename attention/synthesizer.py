"""Synthesizer attention (Tay et al. 2020, "Synthesizer: Rethinking Self-Attention in Transformer
Models"): attention weights synthesised without query-key dot products.

* Dense Synthesizer (section 3.1): per head h, logits for token i over positions j come from the
  token alone, B_i = W_2 relu(W_1 X_i + b_1) + b_2 with W_2 mapping to ``max_len`` positions, and
  Y = softmax(B) G(X) with G(X) the values (the shell's V).
* Random Synthesizer (section 3.2): per head a matrix R in R^{max_len x max_len} independent of the
  input, Y = softmax(R) G(X); ``trainable: true`` learns R, ``false`` keeps it fixed at its random
  init (both are in the paper). ``rank: r`` gives the paper's factorised form R = R_1 R_2^T with
  R_1, R_2 in R^{max_len x r}.

Choices the paper leaves open, written down:

* A sequence of length N <= max_len uses the logits of positions 0..N-1 (rows and columns):
  absolute positions, as the method is position-indexed.
* Padding: padded key positions get a large negative logit (never weight); padded query rows are
  zeroed; a sample with no real token gives zeros. Zero logits therefore give the masked mean of
  the real values.
* Dense hidden width per head = ``hidden`` (default: the head dim, so the first layer maps
  d_model -> d_model as in the paper's d x d W_1). W_1 reads the whole block input x (LayerNormed),
  one hidden slice per head. Init: W_1 as nn.Linear; W_2 uniform(+-1/sqrt(hidden)); b_2 zero.
* Random init: R ~ N(0, 1) (factorised: R_1, R_2 ~ N(0, r^-1/2) so R_1 R_2^T has unit variance),
  drawn from the mixer's seeded generator, so a fixed R is reproducible per run and per layer.
* No q/k: ``uses_qk = False``, so the shell builds no query/key projections (the paper drops them).

Memory is O(N^2) by design: both variants form ``[B, H, N, N]`` weights (the method has no query-key
factorisation to avoid it), and the Random Synthesizer also holds ``H x max_len x max_len``
parameters (``rank: r`` makes those O(max_len r), the weights stay N x N). So instead of running the
machine out of memory, :func:`require_fits` raises a :class:`QuadraticMemoryError` BEFORE the
allocation, naming the variant, the bytes it needs, the bytes available and the fix:

* at construction: the parameters (allocated now, on the host) must fit the host, and one example's
  training footprint at ``max_len`` (parameters, their gradients when trainable, and
  ``ACTIVATION_COPIES`` ``[H, N, N]`` tensors) must fit the host or, where CUDA is present, the GPU;
* at the first forward of each (batch, length, dtype, device): ``ACTIVATION_COPIES`` (2 without
  autograd) ``[B, H, N, N]`` tensors must fit the memory available on the device.

Both estimates are lower bounds (an optimiser's state, other layers and the allocator's slack come
on top), so a refusal means the step cannot fit; passing the check promises nothing more (one encoder
block's training step measured ~7 ``[B, H, N, N]`` float32 sizes of peak at N = 2K). Available
memory: CUDA free plus the blocks the caching allocator holds unused; host ``MemAvailable``
(``/proc/meminfo``, else ``sysconf``), capped by a cgroup v2 limit. Whatever the machine reports, a
footprint above ``HARD_LIMIT_BYTES`` is refused (a mistyped max_len, or a host that cannot report
its memory).
"""
from __future__ import annotations

import math
import os
from pathlib import Path

import torch
from torch import Tensor, nn

from attention.base import Mixer, require_positive
from attention.masking import key_bias, zero_padded
from attention.padding import Padding
from attention.spec import Grid, Knob, Spec, int_range


ACTIVATION_COPIES = 3              # [B, H, N, N] alive at once in backward: softmax output, its grad, the logits' grad
HARD_LIMIT_BYTES = 256 * 2**30    # above the largest single accelerator (141 GB) and most hosts
GIB = 2**30


class QuadraticMemoryError(MemoryError):
    """The N x N footprint of a Synthesizer cannot fit; raised before allocating it."""


def host_available_bytes() -> int | None:
    """Memory the host can still give: MemAvailable (or sysconf), capped by a cgroup v2 limit."""
    found: list[int] = []
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemAvailable:"):
                found.append(int(line.split()[1]) * 1024)
    except (OSError, ValueError, IndexError):
        try:
            found.append(os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE"))
        except (ValueError, OSError, AttributeError):
            pass
    try:
        limit = Path("/sys/fs/cgroup/memory.max").read_text().strip()
        if limit != "max":
            found.append(int(limit) - int(Path("/sys/fs/cgroup/memory.current").read_text()))
    except (OSError, ValueError):
        pass
    return min(found) if found else None


def available_memory_bytes(device: torch.device) -> int | None:
    """Bytes a new allocation on ``device`` can still get (None: the device cannot say)."""
    if device.type == "cuda":
        free, _ = torch.cuda.mem_get_info(device)
        return free + torch.cuda.memory_reserved(device) - torch.cuda.memory_allocated(device)
    return host_available_bytes() if device.type == "cpu" else None


def require_fits(variant: str, need: int, devices: list[torch.device], what: str, fix: str) -> None:
    """Raise :class:`QuadraticMemoryError` unless ``need`` bytes fit one of ``devices`` (and the hard bound)."""
    def gib(b: int) -> str:
        return f"{b / GIB:.2f} GiB"

    if need > HARD_LIMIT_BYTES:
        problem = f"more than the hard bound of {gib(HARD_LIMIT_BYTES)}"
    else:
        avail = {d: available_memory_bytes(d) for d in devices}
        if any(a is None or need <= a for a in avail.values()):
            return
        problem = "only " + " / ".join(f"{gib(a)} available on {d}" for d, a in avail.items())
    raise QuadraticMemoryError(
        f"attention={variant}: {what} need {gib(need)}, {problem}. The Synthesizer's memory is O(N^2) by "
        f"design (N x N weights). Fix: a smaller task.max_len, {fix}")


def _check_len(n: int, max_len: int) -> None:
    if n > max_len:
        raise ValueError(f"sequence length {n} exceeds synthesizer max_len {max_len}: set task.max_len")


def synthesized_attention(logits: Tensor, v: Tensor, pad: Padding) -> Tensor:
    """softmax over real keys of ``logits`` ``[B|1, H, N, N]``, applied to ``v``; padded rows zero."""
    weights = torch.softmax(logits + key_bias(pad.mask, logits.dtype), dim=-1)
    return zero_padded(weights @ v, pad)


class _Quadratic(Mixer):
    """Shared memory guard of the two Synthesizers (see the module docstring)."""

    variant = ""
    fix = ""

    def __init__(self, n_heads: int, head_dim: int, max_len: int, layer_idx: int = 0) -> None:
        super().__init__(n_heads, head_dim, max_len, layer_idx)
        self._fits: set[tuple] = set()   # batch shapes already checked by require_batch_fits

    def require_construction_fits(self, param_elems: int, trainable: bool) -> None:
        size = torch.get_default_dtype().itemsize
        params = param_elems * size
        require_fits(self.variant, params, [torch.device("cpu")], f"parameters at max_len={self.max_len}", self.fix)
        one = params * (2 if trainable else 1) + ACTIVATION_COPIES * self.n_heads * self.max_len ** 2 * size
        devices = [torch.device("cpu")] + ([torch.device("cuda")] if torch.cuda.is_available() else [])
        require_fits(self.variant, one, devices, f"one example's training step at max_len={self.max_len}", self.fix)

    def require_batch_fits(self, v: Tensor) -> None:
        """Before the ``[B, H, N, N]`` weights of this batch are formed; once per shape. A host-side
        check of the shape only: under ``torch.compile`` it runs when the graph is traced (once per
        compiled shape, ``dynamic=False``), outside the graph, so there is no break and no mode is
        asked per call."""
        b, h, n, _ = v.shape
        self._require_shape_fits(b, h, n, v.element_size(), v.dtype, v.device, torch.is_grad_enabled())

    @torch._dynamo.assume_constant_result
    def _require_shape_fits(self, b: int, h: int, n: int, itemsize: int, dtype: torch.dtype, device: torch.device,
                            grad: bool) -> bool:
        key = (b, n, dtype, device, grad)
        if key not in self._fits:
            copies = ACTIVATION_COPIES if grad else 2
            require_fits(self.variant, copies * b * h * n * n * itemsize, [device],
                         f"the [B={b}, H={h}, N={n}, N] weights of this batch", self.fix)
            self._fits.add(key)
        return True


class DenseSynthesizer(_Quadratic):
    spec = Spec(grid=Grid({"hidden": (None, 1, 3, 9)}), ranges={"hidden": int_range(1, 10, nullable=True)},
                knobs=(Knob("hidden", (8, 16, 32, 64)),), draws=False, small={}, family="synthesizer_dense",
                documented=lambda m, o, heads, max_len: [("hidden", m.hidden, o["hidden"] or m.head_dim)])
    uses_qk = False
    variant = "synthesizer_dense"
    fix = "a smaller batch, or a variant that is not quadratic (e.g. sparse, linear, performer)"

    def __init__(
        self, n_heads: int, head_dim: int, max_len: int, layer_idx: int = 0, hidden: int | None = None,
    ) -> None:
        super().__init__(n_heads, head_dim, max_len, layer_idx)
        if hidden is not None:
            require_positive(hidden=hidden, hint="or null for the head dim")
        self.hidden = hidden or head_dim
        self.require_construction_fits(n_heads * (self.hidden + 1) * max_len, trainable=True)
        self.w1 = nn.Linear(n_heads * head_dim, n_heads * self.hidden)
        bound = 1.0 / math.sqrt(self.hidden)
        self.w2 = nn.Parameter(torch.empty(n_heads, self.hidden, max_len).uniform_(-bound, bound))
        self.b2 = nn.Parameter(torch.zeros(n_heads, max_len))

    def logits(self, x: Tensor) -> Tensor:
        """``[B, H, N, N]`` synthesised logits of every token over positions 0..N-1."""
        b, n, _ = x.shape
        _check_len(n, self.max_len)
        hid = torch.relu(self.w1(x)).view(b, n, self.n_heads, self.hidden).transpose(1, 2)
        return torch.einsum("bhnc,hcm->bhnm", hid, self.w2[:, :, :n]) + self.b2[None, :, None, :n]

    def forward(self, q: Tensor, k: Tensor, v: Tensor, pad: Padding, x: Tensor) -> Tensor:
        self.require_batch_fits(v)
        return synthesized_attention(self.logits(x).to(v.dtype), v, pad)


class RandomSynthesizer(_Quadratic):
    spec = Spec(grid=Grid({"trainable": (True, False), "rank": (None, 1, 3)}),
                ranges={"rank": int_range(1, 6, nullable=True)}, knobs=(Knob("rank", (4, 16, 64, 256)),), draws=False,
                small={}, family="synthesizer_random", representative="synthesizer_random",
                documented=lambda m, o, heads, max_len: [("rank", m.rank, o["rank"]),
                                                         ("trainable", any(True for _ in m.parameters()), o["trainable"])])
    uses_qk = False
    variant = "synthesizer_random"
    fix = ("attention.rank=r (R = R1 R2^T: O(max_len r) parameters; the N x N weights remain), a smaller batch, "
           "or a variant that is not quadratic")

    def __init__(
        self, n_heads: int, head_dim: int, max_len: int, layer_idx: int = 0,
        trainable: bool = True, rank: int | None = None,
    ) -> None:
        super().__init__(n_heads, head_dim, max_len, layer_idx)
        if rank is not None:
            require_positive(rank=rank, hint="or null for a full matrix")
        self.rank = rank
        self.require_construction_fits(n_heads * max_len * (max_len if rank is None else 2 * rank), trainable)
        g = self.init_generator()
        if rank is None:
            tensors = {"r": torch.randn(n_heads, max_len, max_len, generator=g)}
        else:
            std = rank ** -0.25
            tensors = {"r1": torch.randn(n_heads, max_len, rank, generator=g) * std,
                       "r2": torch.randn(n_heads, max_len, rank, generator=g) * std}
        for name, t in tensors.items():
            if trainable:
                self.register_parameter(name, nn.Parameter(t))
            else:
                self.register_buffer(name, t, persistent=True)

    def logits(self, n: int) -> Tensor:
        """``[1, H, N, N]`` the random logits restricted to positions 0..N-1."""
        _check_len(n, self.max_len)
        if self.rank is None:
            return self.r[None, :, :n, :n]
        return (self.r1[:, :n] @ self.r2[:, :n].transpose(-1, -2))[None]

    def forward(self, q: Tensor, k: Tensor, v: Tensor, pad: Padding, x: Tensor) -> Tensor:
        self.require_batch_fits(v)
        return synthesized_attention(self.logits(v.shape[2]).to(v.dtype), v, pad)
