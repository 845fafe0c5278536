"""Graph-safe draws proven equal in distribution, variant by variant (issue 38).

Graph-safe mode draws other values than eager mode (counter-based uniforms and normals,
:mod:`attention.counter_random`). The uniforms are tested in ``test_counter_random.py``; a
distribution goes wrong in what a variant *builds* from them (a slot rounded instead of floored,
a rotation half dropped), so each test here takes what the variant builds and tests it against
its exact distribution, in both modes (eager passing proves the test's own law right):

* ABC_RD: slot frequencies (uniform over the m slots);
* AdaMRA's random router: the head of each query (uniform over the routed heads);
* BigBird: the random blocks of each row (an r-subset, uniform over the row's candidates), from
  the graph-safe per-sample tables and the eager plan of each length;
* Reformer: bucket occupancy of fixed vectors under the rotations (uniform over the buckets);
* clustered, i_clustered: hash bits of query pairs at angle theta (SimHash: agree w.p. 1 - theta/pi);
* Performer: the feature matrix (orthogonal blocks, chi_d row norms, uniform directions);
* Sinkhorn: the Gumbel noise on the sorting logits (Gumbel(0, 1)).

Decision rule: a test fails when its p-value is below ``ALPHA`` = 1e-6, so a correct
implementation fails with probability 1e-6 at any seed. Each test also checks its own power: with
its number of draws a factor-2 error in any one category (its probability halved: the weakest
case) fails the chi-square with probability >= 0.99 (noncentral chi-square), and the KS tests
resolve a factor-2 density error on a tenth of the mass. The seeds are fixed (deterministic, no
flake); ``GRAPH_SAFE_DIST_SEED=<int>`` reruns them at another seed. The p-values are printed
(``-rA`` or ``-s`` shows them) and kept as ``record_property`` entries.

``test_every_drawing_config_is_covered`` keeps the list complete: a config whose graph-safe
training forward advances a draw counter must have a test here.
"""
from __future__ import annotations

import math
import os
from typing import Callable, Iterator

import pytest
import torch
from scipy import stats
from torch import Tensor

from attention import sinkhorn as sinkhorn_module
from attention.base import Mixer
from attention.clustered import hash_queries
from attention.graph_safe import graph_safe
from attention.registry import build_mixer, variant_names
from tests.attention_harness import DRAWING  # each has a test below

ALPHA = 1e-6          # a p-value below it fails
POWER = 0.99          # the chance a factor-2 error in one category fails, at the least
SEED = int(os.environ.get("GRAPH_SAFE_DIST_SEED", "38"))
CPU = torch.device("cpu")
MODES = ["eager", "graph_safe"]

# BigBird draws its plan at construction; graph-safe mode builds each sample's plan from it
PLANNED = {"bigbird"}


@pytest.fixture(params=MODES)
def mode(request: pytest.FixtureRequest) -> Iterator[str]:
    with graph_safe(request.param == "graph_safe"):
        yield request.param


@pytest.fixture
def report(request: pytest.FixtureRequest, record_property: Callable) -> Callable[[str, float], None]:
    """Prints and records a p-value (``-rA`` shows the print of a passing test)."""
    def _report(what: str, p: float) -> None:
        print(f"{request.node.name} {what}: p = {p:.3g}")
        record_property(what, p)
    return _report


def seeded(offset: int) -> None:
    """The global generator (a mixer's seed comes from it) at this test's seed."""
    torch.manual_seed(SEED * 1000 + offset)


# ----------------------------------------------------------------------------- the statistics
def chi2_groups(observed: Tensor, probs: Tensor, scale: Tensor | None = None) -> tuple[float, int, float]:
    """Pearson's chi-square summed over independent groups: ``observed [G, K]`` counts, ``probs
    [G, K]`` each cell's probability per trial (cells with 0 must be empty: asserted). ``scale
    [G]``: the statistic of a group is ``scale`` times a chi-square (r-subsets: ``(|C| - r) /
    (|C| - 1)``), divided out. Returns (statistic, degrees of freedom, p-value)."""
    observed, probs = observed.double(), probs.double()
    assert (observed[probs == 0] == 0).all(), "a draw landed in a cell of probability 0"
    trials = observed.sum(-1, keepdim=True) / probs.sum(-1, keepdim=True)
    expected = trials * probs
    live = probs > 0
    terms = torch.where(live, (observed - expected) ** 2 / expected.clamp_min(1e-300), torch.zeros_like(expected))
    per_group = terms.sum(-1) / (1.0 if scale is None else scale.double())
    df = int((live.sum(-1) - 1).clamp_min(0).sum())
    stat = float(per_group.sum())
    return stat, df, float(stats.chi2.sf(stat, df))


def assert_resolves_factor_2(expected: Tensor, df: int, scale: Tensor | None = None, alpha: float = ALPHA) -> None:
    """The test has the power it claims: halving any one cell's probability (expected count E,
    group scale s) adds at least ``E / (4 s)`` to the noncentrality, and that fails the test with
    probability >= ``POWER``."""
    e = expected.double()
    s = torch.ones(e.shape[0], dtype=torch.double) if scale is None else scale.double()
    lam = float((e / (4 * s[:, None]))[e > 0].min())
    power = float(stats.ncx2.sf(stats.chi2.isf(alpha, df), df, lam))
    assert power >= POWER, f"too few draws: a factor-2 error in one cell fails with probability {power:.3f}"


def ks(sample: Tensor, cdf: Callable, alpha: float = ALPHA) -> float:
    """One-sample KS p-value, after checking the sample resolves a factor-2 density error on a
    tenth of the mass (a CDF shift of 0.1 * 0.9 / 1.1) twice over the critical distance."""
    n = sample.numel()
    critical = float(stats.kstwo.isf(alpha, n))
    assert 2 * critical < 0.1 * 0.9 / 1.1, f"too few draws ({n}) for a KS test at {alpha}"
    return float(stats.kstest(sample.double().flatten().numpy(), cdf).pvalue)


def unit(x: Tensor) -> Tensor:
    return x / x.norm(dim=-1, keepdim=True)


def fixed_vectors(n: int, d: int) -> Tensor:
    """``n`` unit vectors in R^d, the first all-ones (a draw with a non-zero mean moves its hash
    most), the others random but fixed."""
    g = torch.Generator().manual_seed(SEED)
    x = torch.randn(n, d, generator=g)
    x[0] = 1.0
    return unit(x)


# ----------------------------------------------------------------------------- ABC_RD, AdaMRA
def test_abc_rd_slot_frequencies_uniform(mode: str, report) -> None:
    """Each real token's slot (the one-hot control vectors the variant builds) is uniform over
    the m slots: floor(m u), not round((m - 1) u) (half weight at both ends)."""
    seeded(1)
    mixer = build_mixer("abc_rd")(n_heads=4, head_dim=4, max_len=128).train()
    m = mixer.memory_size
    b, n, calls = 16, 128, 8
    mask = torch.ones(b, n, dtype=torch.bool)
    x = torch.zeros(b, n, 16)
    counts = torch.zeros(m, dtype=torch.long)
    for _ in range(calls):
        phi = mixer.control_vectors(mask, x)                               # [B, H, N, m]
        assert ((phi != 0).sum(-1) == 1).all()                             # one slot per token
        counts += (phi != 0).sum((0, 1, 2))
    probs = torch.full((1, m), 1 / m)
    stat, df, p = chi2_groups(counts[None], probs)
    assert_resolves_factor_2(counts.sum() * probs, df)
    report("slots chi2", p)
    assert p >= ALPHA, f"slot counts {counts.tolist()}: chi2 {stat:.1f} on {df} df"


def test_adamra_random_router_head_choice_uniform(mode: str, report) -> None:
    """The random router sends each query to a head uniform over the routed heads."""
    seeded(2)
    mixer = build_mixer("adamra_random_router")(n_heads=4, head_dim=4, max_len=256).train()
    h = mixer.n_routed
    mask = torch.ones(8, 256, dtype=torch.bool)
    choice = torch.cat([mixer.random_heads(mask).flatten() for _ in range(4)])
    counts = torch.bincount(choice, minlength=h)
    assert counts.numel() == h
    probs = torch.full((1, h), 1 / h)
    stat, df, p = chi2_groups(counts[None], probs)
    assert_resolves_factor_2(counts.sum() * probs, df)
    report("heads chi2", p)
    assert p >= ALPHA, f"head counts {counts.tolist()}: chi2 {stat:.1f} on {df} df"


# ----------------------------------------------------------------------------- BigBird
def test_bigbird_random_blocks_per_row_uniform_over_the_candidates(mode: str, report) -> None:
    """Row a of a sample whose last block is L reads r random blocks, an r-subset uniform over
    its candidates (neither in its window nor 0 nor >= L), in the plan graph-safe mode builds per
    sample (``_tables`` over the padded length) and in the plan of its length alone.
    Heads are independent plans; rows of one head draw independent priorities."""
    seeded(3)
    nb_max, heads = 12, 2000
    mixer = build_mixer("bigbird")(n_heads=heads, head_dim=4, max_len=nb_max * 64)
    r, w = mixer.num_random_blocks, mixer.window_blocks // 2
    lasts = [11, 9, 7]
    skip = 2 + mixer.window_blocks                                         # global and window slots first
    if mode == "graph_safe":
        idx, valid = mixer._tables(nb_max, torch.tensor(lasts))            # [B, H, nb_max - 1, S]
        plans = [(idx[i, :, :, skip:], valid[i, :, :, skip:]) for i in range(len(lasts))]
    else:
        plans = [tuple(t[:, :, skip:] for t in mixer._tables(last + 1, torch.tensor(last))) for last in lasts]
    worst = 1.0
    for last, (ridx, rvalid) in zip(lasts, plans):
        rows = range(1, last)                                              # middle rows of this sample
        counts = torch.zeros(len(rows), nb_max)
        probs = torch.zeros(len(rows), nb_max)
        scale = torch.ones(len(rows))
        for i, a in enumerate(rows):
            cands = [c for c in range(last) if abs(a - c) > w and c != 0]
            picked = ridx[:, i][rvalid[:, i]]                              # row a is table row a - 1
            counts[i] = torch.bincount(picked, minlength=nb_max)[:nb_max].double()
            assert (rvalid[:, i].sum(-1) == min(r, len(cands))).all(), f"row {a}: not min(r, |C|) blocks"
            if len(cands) > r:
                probs[i, cands] = r / len(cands)
                scale[i] = (len(cands) - r) / (len(cands) - 1)
            else:                                                          # every candidate, every time
                assert set(picked.tolist()) <= set(cands) and (counts[i, cands] == heads).all()
        random_rows = probs.sum(-1) > 0
        stat, df, p = chi2_groups(counts[random_rows], probs[random_rows], scale[random_rows])
        p_all = min(1.0, p * len(lasts))                                   # lengths share their heads' priorities
        assert_resolves_factor_2(heads * probs[random_rows], df, scale[random_rows], ALPHA / len(lasts))
        report(f"last block {last} chi2 (x{len(lasts)} Bonferroni)", p_all)
        worst = min(worst, p_all)
    assert worst >= ALPHA, f"random blocks off their uniform law: p = {worst:.3g}"


# ----------------------------------------------------------------------------- Reformer
def test_reformer_bucket_occupancy_uniform(mode: str, report) -> None:
    """A fixed vector x lands in bucket argmax([xR; -xR]) of Gaussian rotations R: uniform over
    the n_buckets buckets whatever x. One token per head (heads and rounds rotate independently),
    four fixed vectors over the heads, so every (head, round, call) is one independent trial."""
    seeded(4)
    heads, d, vectors, calls = 1024, 16, 4, 10
    mixer = build_mixer("reformer")(n_heads=heads, head_dim=d, max_len=256).train()
    nb = mixer.n_buckets
    assert nb == 8
    which = torch.arange(heads) % vectors
    kn = fixed_vectors(vectors, d)[which][None, :, None]                   # [1, H, 1, D]
    mask = torch.ones(1, 1, dtype=torch.bool)
    counts = torch.zeros(vectors, nb)
    for _ in range(calls):
        ids = mixer.buckets(kn, mask, mixer.rotations(nb, CPU, torch.float32), nb)[0, :, :, 0]   # [H, R]
        counts.index_put_((which[:, None].expand_as(ids), ids), torch.ones(ids.shape), accumulate=True)
    probs = torch.full((vectors, nb), 1 / nb)
    stat, df, p = chi2_groups(counts, probs)
    assert_resolves_factor_2(counts.sum(-1, keepdim=True) * probs, df)
    report("buckets chi2", p)
    assert p >= ALPHA, f"bucket counts {counts.tolist()}: chi2 {stat:.1f} on {df} df"


# ----------------------------------------------------------------------------- clustered
@pytest.mark.parametrize("name", ["clustered", "i_clustered"])
def test_clustered_hash_bits_follow_the_angle(name: str, mode: str, report) -> None:
    """SimHash bits of two queries at angle theta (the codes the variant builds from its planes):
    (+,+) and (-,-) each with probability (1 - theta/pi) / 2, (+,-) and (-,+) each theta / (2 pi).
    Bits (plane columns) and heads are independent; one pair per head, four angles."""
    seeded(5)
    heads, d, calls = 256, 8, 4
    mixer = build_mixer(name)(n_heads=heads, head_dim=d, max_len=64).train()
    angles = torch.tensor([0.3, 1.1, math.pi / 2, 2.6], dtype=torch.float64)
    base = fixed_vectors(2 * len(angles), d).double().view(len(angles), 2, d)
    e0 = base[:, 0]
    e1 = unit(base[:, 1] - (base[:, 1] * e0).sum(-1, keepdim=True) * e0)
    pairs = torch.stack([e0, torch.cos(angles)[:, None] * e0 + torch.sin(angles)[:, None] * e1], 1)   # [A, 2, D]
    which = torch.arange(heads) % len(angles)
    q = pairs[which][None].float()                                          # [1, H, 2, D]
    counts = torch.zeros(len(angles), 4)
    for _ in range(calls):
        codes = hash_queries(q, mixer.hash_planes(heads, d, CPU))[0]        # [H, 2, bits] of +-1
        cell = (codes[:, 0] < 0).long() * 2 + (codes[:, 1] < 0).long()     # ++, +-, -+, --
        counts.index_put_((which[:, None].expand_as(cell), cell), torch.ones(cell.shape), accumulate=True)
    t = angles / math.pi
    probs = torch.stack([(1 - t) / 2, t / 2, t / 2, (1 - t) / 2], -1)
    stat, df, p = chi2_groups(counts, probs)
    assert_resolves_factor_2(counts.sum(-1, keepdim=True) * probs, df)
    report("bit pairs chi2", p)
    assert p >= ALPHA, f"bit-pair counts {counts.tolist()}: chi2 {stat:.1f} on {df} df"


# ----------------------------------------------------------------------------- Performer
@pytest.mark.parametrize("name", ["performer", "performer_32"])
def test_performer_features_orthogonal_with_chi_norms_and_uniform_directions(name: str, mode: str, report) -> None:
    """The feature matrix a training forward draws: blocks of d orthogonal rows; row norms chi_d
    (squared: chi^2_d, KS); each coordinate of the unit rows distributed as one coordinate of a
    uniform unit vector, checked per cell of a block (cells are iid across blocks and draws) on
    four equiprobable categories, sign x (square below or above the Beta(1/2, (d-1)/2) median),
    Bonferroni over the d^2 cells: a sign-biased QR or a skewed direction shows here."""
    seeded(6)
    d = 4
    mixer = build_mixer(name)(n_heads=1, head_dim=d, max_len=16).train()
    m = mixer.nb_features
    blocks = m // d
    assert m % d == 0 and mixer.orthogonal
    draws = math.ceil(2048 / blocks)
    q = torch.randn(1, 1, 4, d)
    mask = torch.ones(1, 4, dtype=torch.bool)
    feats = []
    for _ in range(draws):
        mixer.calls.zero_()                                                # every call the first: a redraw
        mixer.training_calls = 0
        mixer(q, q, q, mask, q.view(1, 4, d))
        feats.append(mixer.features.clone())
    w = torch.stack(feats).double().view(draws * blocks, d, d)             # [blocks, row, coordinate]
    rows = unit(w)
    gram = rows @ rows.transpose(-1, -2)
    torch.testing.assert_close(gram, torch.eye(d, dtype=torch.double).expand_as(gram), atol=1e-5, rtol=0,
                               msg=lambda s: f"feature blocks not orthogonal: {s}")
    p_norm = ks(w.pow(2).sum(-1), stats.chi2(d).cdf)
    median = float(stats.beta(0.5, (d - 1) / 2).median())
    cell = (rows < 0).long() * 2 + (rows.pow(2) > median).long()           # [blocks, d, d] in 0..3
    counts = torch.stack([torch.bincount(c, minlength=4) for c in cell.flatten(1).T]).double()   # [d^2, 4]
    probs = torch.full((d * d, 4), 0.25)
    p_cells = [chi2_groups(counts[i:i + 1], probs[i:i + 1])[2] for i in range(d * d)]
    p_dir = min(1.0, d * d * min(p_cells))
    assert_resolves_factor_2(counts.sum(-1, keepdim=True)[:1] * probs[:1], 3, alpha=ALPHA / d ** 2)
    report("squared norms KS", p_norm)
    report(f"directions chi2 (x{d * d} Bonferroni)", p_dir)
    assert p_norm >= ALPHA, f"row norms not chi_{d}: p = {p_norm:.3g}"
    assert p_dir >= ALPHA, f"row directions not uniform: p = {p_dir:.3g} (per cell: {counts.tolist()})"


# ----------------------------------------------------------------------------- Sinkhorn
def test_sinkhorn_gumbel_noise_is_standard_gumbel(mode: str, report, monkeypatch: pytest.MonkeyPatch) -> None:
    """The noise the training forward adds to the sorting logits (read off the logits handed to
    the Sinkhorn iterations, the sorting net zeroed) is Gumbel(0, 1): -log(-log u), not its mirror."""
    seeded(7)
    mixer = build_mixer("sinkhorn")(n_heads=8, head_dim=8, max_len=256).train()
    assert mixer.gumbel_noise
    last = mixer.sort_net[-1]
    with torch.no_grad():
        last.weight.zero_()
        last.bias.zero_()
    seen: list[Tensor] = []
    real = sinkhorn_module.sinkhorn

    def spy(logits: Tensor, iterations: int) -> Tensor:
        seen.append(logits.detach() * mixer.temperature)
        return real(logits, iterations)

    monkeypatch.setattr(sinkhorn_module, "sinkhorn", spy)
    n_b = mixer.max_blocks
    summaries = torch.zeros(8, 8, n_b, 8)
    valid = torch.ones(8, n_b, dtype=torch.bool)
    for _ in range(5):
        mixer.sorting_matrix(summaries, valid)
    noise = torch.cat([s.flatten() for s in seen])
    p = ks(noise, stats.gumbel_r.cdf)
    report("noise KS", p)
    assert p >= ALPHA, f"Gumbel noise off Gumbel(0, 1): p = {p:.3g} (mean {float(noise.mean()):.3f}, 0.577 expected)"


# ----------------------------------------------------------------------------- coverage
def _draw_counters(name: str) -> int:
    """Counter draws of one graph-safe training step of the tiny network of ``name``."""
    from tests.tiny_network import step_batch, tiny_network, training_loss

    net = tiny_network(name, n_layers=1, graph_safe=True).train()
    ids, mask, label = step_batch(True)
    training_loss(net, ids, mask, label)
    return sum(int(m.draws) for m in net.modules() if isinstance(m, Mixer))


def test_every_drawing_config_is_covered() -> None:
    """The configs whose graph-safe forward draws are exactly those tested above (a new drawing
    config needs a distribution test); BigBird's plan is tested without drawing."""
    drawing = {name for name in variant_names() if _draw_counters(name) > 0}
    assert drawing == DRAWING, f"draw in graph-safe mode: {sorted(drawing)}; tested: {sorted(DRAWING)}"
    assert PLANNED <= set(variant_names()) and not PLANNED & drawing
