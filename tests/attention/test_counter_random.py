"""The counter-based draws of graph-safe mode: a pure function of (key, counter, position) with the
moments of their distribution. The draws are deterministic, so these bounds (about 5 standard
errors) either always hold or never do: no flake."""
from __future__ import annotations

import math

import torch

from attention import counter_random as cr

N = 1 << 18


def test_uniform_is_strictly_inside_the_unit_interval_with_uniform_moments() -> None:
    u = cr.uniform((N,), cr.key32(12345), torch.tensor(7))
    assert 0.0 < float(u.min()) and float(u.max()) < 1.0  # log(u) and log(1 - u) stay finite
    se = math.sqrt(1 / 12 / N)
    assert abs(float(u.mean()) - 0.5) < 5 * se
    assert abs(float(u.var()) - 1 / 12) < 0.002
    counts = torch.histc(u, bins=16, min=0, max=1)
    assert float(((counts - N / 16) ** 2 / (N / 16)).sum()) < 40  # chi-square, 15 dof (p ~ 5e-4)


def test_extreme_hashes_stay_strictly_inside_the_unit_interval() -> None:
    u = cr.unit_interval(torch.tensor([0, 2**32 - 1], dtype=torch.int64))
    assert float(u[0]) > 0.0 and float(u[1]) < 1.0 and u.dtype == torch.float32
    assert torch.isfinite(torch.log(u)).all() and torch.isfinite(torch.log1p(-u)).all()


def test_normal_has_unit_moments() -> None:
    z = cr.normal((N,), cr.key32(99), torch.tensor(0))
    assert abs(float(z.mean())) < 5 / math.sqrt(N)
    assert abs(float(z.std()) - 1.0) < 0.01
    assert abs(float((z ** 4).mean()) - 3.0) < 0.1


def test_streams_are_reproducible_and_distinct_per_key_counter_and_position() -> None:
    key = cr.key32(2**61 + 5)
    a = cr.uniform((4, 25000), key, torch.tensor(3))
    assert torch.equal(a, cr.uniform((4, 25000), key, torch.tensor(3)))
    others = [cr.uniform((4, 25000), key, torch.tensor(4)), cr.uniform((4, 25000), cr.key32(2**61 + 6), torch.tensor(3))]
    for b in others + [a.roll(1, dims=-1)]:
        assert abs(float(torch.corrcoef(torch.stack([a.flatten(), b.flatten()]))[0, 1])) < 5 / math.sqrt(a.numel())
    assert cr.key32(1) != cr.key32(1 + 2**32)  # both halves of a 62-bit seed count


def test_float64_draws_and_shapes() -> None:
    u = cr.uniform((2, 3, 5), cr.key32(1), torch.tensor(0), dtype=torch.float64)
    assert u.shape == (2, 3, 5) and u.dtype == torch.float64
    assert cr.normal((7,), cr.key32(1), torch.tensor(0), dtype=torch.bfloat16).dtype == torch.bfloat16


def test_compiled_draws_equal_eager_draws() -> None:
    def draw(counter: torch.Tensor) -> torch.Tensor:
        return cr.normal((64,), cr.key32(5), counter)

    counter = torch.tensor(11)
    compiled = torch.compile(draw, fullgraph=True, backend="aot_eager")
    torch.testing.assert_close(compiled(counter), draw(counter), rtol=0, atol=0)
