"""Random plans checked directly, not only read: the references take a variant's draws (BigBird's
plan, LSH rotations, hash planes, router and slot draws, random features) as given, so a bug in
how draws become a plan (a threshold off by one that drops a block, a draw shared where it should
be independent, a biased choice) is invisible to them. Here: counts per row exactly as each paper
says, frequencies over many draws within a binomial (Hoeffding) bound, and independence across
heads, rounds, rows and layers where the method requires it.

Every frequency test uses fixed seeds (it is deterministic: it cannot flake). Its bound is chosen
so that a correct implementation would fail it, for a random choice of seeds, with probability at
most ``ALPHA`` = 1e-6 (a union bound over all the cells the test checks)."""
from __future__ import annotations

import itertools
import math

import pytest
import torch

from attention.abc import ABCAttention
from attention.adamra import AdaMRAAttention
from attention.bigbird import BigBirdAttention
from attention.clustered import ClusteredAttention
from attention.performer import orthogonal_gaussian
from attention.reformer import ReformerAttention
from attention.registry import build_mixer, variant_names

ALPHA = 1e-6


def hoeffding(trials: int, cells: int, width: float = 1.0, alpha: float = ALPHA) -> float:
    """Deviation of a mean of ``trials`` independent values in an interval of ``width`` (a
    frequency: width 1) from its expectation that a correct implementation exceeds in any of
    ``cells`` with probability at most ``alpha``: Hoeffding's ``P(|f - p| >= t) <= 2 exp(-2 n t^2 /
    width^2)`` per cell, union bound over the cells."""
    return width * math.sqrt(math.log(2 * cells / alpha) / (2 * trials))


def assert_frequencies(observed: torch.Tensor, expected: torch.Tensor, trials: int, what: str,
                       width: float = 1.0) -> None:
    t = hoeffding(trials, observed.numel(), width)
    worst = (observed - expected).abs().max().item()
    assert worst <= t, f"{what}: frequency off its probability by {worst:.3f} > bound {t:.3f} ({trials} draws)"


# ----------------------------------------------------------------------------- BigBird
def candidates(a: int, nb: int, w: int) -> list[int]:
    """App. D: the blocks query block ``a`` may draw at random: neither in its window nor global."""
    return [c for c in range(nb) if abs(a - c) > w and c not in (0, nb - 1)]


def bigbird(seed: int, heads: int, nb_max: int, r: int, window: int) -> BigBirdAttention:
    torch.manual_seed(seed)
    return BigBirdAttention(heads, 4, nb_max * 3, block_size=3, num_random_blocks=r, window_blocks=window)


@pytest.mark.parametrize("r,window", [(0, 3), (1, 1), (2, 3), (3, 5), (6, 3)])
def test_bigbird_reads_exactly_its_random_blocks_per_row(r, window):
    """Every middle query block reads min(r, candidates) distinct random blocks, all candidates, and
    its key-block table lists the global, window and random blocks once each (none dropped, none
    twice), at every length up to max_len."""
    mixer = bigbird(0, 4, 14, r, window)
    w = window // 2
    for nb in range(3, 15):
        idx, valid = mixer.random_blocks(nb)
        table, table_valid = mixer._tables(nb, torch.tensor(nb - 1))      # the plan of nb blocks
        for h, a in itertools.product(range(4), range(1, nb - 1)):
            chosen = idx[h, a][valid[h, a]].tolist()
            cands = candidates(a, nb, w)
            assert len(chosen) == len(set(chosen)) == min(r, len(cands)), (nb, h, a, chosen, cands)
            assert set(chosen) <= set(cands), (nb, h, a, chosen, cands)
            read = table[h, a - 1][table_valid[h, a - 1]].tolist()
            window_blocks = {c for c in range(nb) if abs(a - c) <= w} - {0, nb - 1}
            assert sorted(read) == sorted({0, nb - 1} | window_blocks | set(chosen)), (nb, h, a, read)


def test_bigbird_random_blocks_uniform_over_the_candidates():
    """A query block's r random blocks are a uniform draw without replacement from its candidates:
    each candidate is read with probability r / |candidates| (300 plans x 4 heads)."""
    seeds, heads, nb, r = 300, 4, 12, 2
    counts = torch.zeros(nb, nb)
    rows = torch.arange(nb)[None, :, None].expand(heads, nb, r)
    for s in range(seeds):
        idx, valid = bigbird(s, heads, nb, r, 3).random_blocks(nb)
        counts.index_put_((rows[valid], idx[valid]), torch.ones(int(valid.sum())), accumulate=True)
    trials = seeds * heads
    expected = torch.zeros(nb, nb)
    for a in range(1, nb - 1):
        cands = candidates(a, nb, 1)
        expected[a, cands] = min(r, len(cands)) / len(cands)
    assert_frequencies(counts[1:nb - 1] / trials, expected[1:nb - 1], trials, "bigbird random block")


def _same_set_fraction(plans: list[tuple[torch.Tensor, torch.Tensor]], nb: int) -> tuple[float, float]:
    """Fraction of (pair of plans, row) reading the same random set, and its probability when the
    plans are independent (1 / C(|candidates|, r) per row)."""
    same, prob, rows = 0, 0.0, 0
    for (i0, v0), (i1, v1) in plans:
        for a in range(1, nb - 1):
            same += set(i0[a][v0[a]].tolist()) == set(i1[a][v1[a]].tolist())
            prob += 1 / math.comb(len(candidates(a, nb, 1)), int(v0[a].sum()))
            rows += 1
    return same / rows, prob / rows


def test_bigbird_heads_and_layers_draw_independent_plans():
    """Heads get independent plans (as in the reference code) and so do the layers of a model
    (each draws from its own seed): two plans share a row's random set with probability
    1 / C(|candidates|, r), not always."""
    nb, seeds = 12, 150
    heads, layers = [], []
    for s in range(seeds):
        torch.manual_seed(s)
        first, second = (BigBirdAttention(2, 4, nb * 3, layer_idx=i, block_size=3, num_random_blocks=2)
                         for i in range(2))
        plan0, plan1 = first.random_blocks(nb), second.random_blocks(nb)
        heads.append(((plan0[0][0], plan0[1][0]), (plan0[0][1], plan0[1][1])))
        layers.append(((plan0[0][0], plan0[1][0]), (plan1[0][0], plan1[1][0])))
    bound = hoeffding(seeds * (nb - 2), 2)
    for what, pairs in (("heads", heads), ("layers", layers)):
        observed, expected = _same_set_fraction(pairs, nb)
        assert abs(observed - expected) <= bound, f"{what}: {observed:.3f} of rows share their random set " \
                                                  f"(independent plans: {expected:.3f} +- {bound:.3f})"


# ----------------------------------------------------------------------------- Reformer LSH
def unit_vectors(n: int, d: int, seed: int) -> torch.Tensor:
    x = torch.randn(n, d, generator=torch.Generator().manual_seed(seed))
    return x / x.norm(dim=-1, keepdim=True)


def lsh_draws(mixer: ReformerAttention, kn: torch.Tensor, draws: int) -> torch.Tensor:
    """Bucket ids ``[draws, H, R, N]`` of the rows ``kn [H, N, D]`` under ``draws`` training draws."""
    mixer.train()
    nb = mixer.n_buckets
    mask = torch.ones(1, kn.shape[1], dtype=torch.bool)
    return torch.stack([mixer.buckets(kn[None], mask, mixer.rotations(nb, kn.device, kn.dtype), nb)[0]
                        for _ in range(draws)])


def test_lsh_one_bucket_per_token_and_round_padding_its_own():
    mixer = ReformerAttention(2, 8, 64, n_hashes=3, bucket_size=5)          # ceil(64/5) = 13 -> 14 buckets
    nb = mixer.n_buckets
    assert nb == 14
    kn = unit_vectors(2 * 2 * 20, 8, 0).view(2, 2, 20, 8)
    mask = torch.arange(20)[None] < torch.tensor([[20], [11]])
    ids = mixer.buckets(kn, mask, mixer.rotations(nb, kn.device, kn.dtype), nb)
    assert ids.shape == (2, 2, 3, 20)
    real = mask[:, None, None, :].expand_as(ids)
    assert ((ids >= 0) & (ids < nb))[real].all() and (ids[~real] == nb).all()
    assert len(ids[real].unique()) > nb // 2     # the rotations spread tokens over the buckets


def test_lsh_buckets_uniform_and_rounds_and_heads_independent():
    """h(x) = argmax([xR; -xR]) with Gaussian R puts a fixed x in each of the n_buckets buckets with
    probability 1 / n_buckets; rounds and heads use independent rotations, so one token lands in the
    same bucket in two rounds (or two heads) with probability 1 / n_buckets, not 1."""
    draws, tokens = 400, 12
    mixer = ReformerAttention(2, 8, 64, n_hashes=2, bucket_size=8)           # 8 buckets
    nb = mixer.n_buckets
    kn = unit_vectors(tokens, 8, 1).expand(2, tokens, 8)                      # the same tokens in both heads
    ids = lsh_draws(mixer, kn, draws)                                          # [draws, H, R, N]
    freq = torch.stack([(ids == b).double().mean((0, 1, 2)) for b in range(nb)])   # [buckets, tokens]
    assert_frequencies(freq, torch.full_like(freq, 1 / nb), draws * 4, "bucket of a token")
    same_round = (ids[:, :, 0] == ids[:, :, 1]).double().mean()
    same_head = (ids[:, 0] == ids[:, 1]).double().mean()
    bound = hoeffding(draws, 2)   # the tokens of one draw share its rotations: one trial (their mean) per draw
    for what, f in (("rounds", same_round), ("heads", same_head)):
        assert abs(f - 1 / nb) <= bound, f"{what} share a token's bucket {f:.3f} of the time (independent: 1/{nb})"


def test_lsh_collisions_fall_with_the_angle():
    """Angular LSH with two buckets is one random hyperplane: vectors at angle theta share a bucket
    with probability 1 - theta / pi (Charikar), the locality Reformer relies on."""
    draws = 2000
    mixer = ReformerAttention(1, 8, 16, n_hashes=1, bucket_size=8)          # 2 buckets
    assert mixer.n_buckets == 2
    base = unit_vectors(2, 8, 2)
    e0 = base[0]
    e1 = base[1] - (base[1] @ e0) * e0
    e1 = e1 / e1.norm()
    angles = torch.tensor([0.2, 0.6, 1.0, math.pi / 2, 2.5], dtype=torch.float64)
    pts = torch.stack([e0] + [math.cos(t) * e0 + math.sin(t) * e1 for t in angles.tolist()])
    ids = lsh_draws(mixer, pts[None].float(), draws)[:, 0, 0]                # [draws, 1 + angles]
    observed = (ids[:, 1:] == ids[:, :1]).double().mean(0)
    assert_frequencies(observed, 1 - angles / math.pi, draws, "collision at angle")


# ----------------------------------------------------------------------------- clustered: SimHash
def test_simhash_planes_fresh_per_head_and_collide_with_the_angle():
    """Each head hashes with its own planes (a bit agrees across heads half the time) and a bit of
    two queries at angle theta agrees with probability 1 - theta / pi."""
    mixer = ClusteredAttention(2, 8, 64, clusters=4, bits=63).train()
    draws = 40
    base = unit_vectors(2, 8, 3)
    e1 = base[1] - (base[1] @ base[0]) * base[0]
    e1 = e1 / e1.norm()
    theta = 1.1
    pair = torch.stack([base[0], math.cos(theta) * base[0] + math.sin(theta) * e1])
    agree_pair, agree_heads = [], []
    for _ in range(draws):
        planes = mixer.hash_planes(2, 8, torch.device("cpu"))                 # [H, D, bits]
        codes = torch.einsum("nd,hdk->hnk", pair, planes) >= 0               # [H, 2, bits]
        agree_pair.append((codes[:, 0] == codes[:, 1]).double().mean())
        agree_heads.append((codes[0] == codes[1]).double().mean())
    pair_f, heads_f = torch.stack(agree_pair).mean(), torch.stack(agree_heads).mean()
    # Bits (plane columns) and heads are independent; the two queries of a head share its planes.
    assert abs(pair_f - (1 - theta / math.pi)) <= hoeffding(draws * 2 * 63, 2), f"bit collision {pair_f:.3f}"
    assert abs(heads_f - 0.5) <= hoeffding(draws * 63, 2), f"heads agree on {heads_f:.3f} of the bits"


# ----------------------------------------------------------------------------- Performer features
@pytest.mark.parametrize("m,d", [(8, 4), (11, 4), (3, 4)])
def test_performer_features_orthogonal_blocks_with_chi_norms_and_uniform_directions(m, d):
    """orthogonal: true: blocks of d mutually orthogonal rows (the last one cut to m), each rescaled
    to a chi_d norm (E |w|^2 = d), directions uniform (mean of the unit rows ~ 0); orthogonal: false:
    i.i.d. Gaussian rows (not orthogonal)."""
    g = torch.Generator().manual_seed(4)
    draws = 500
    def randn(shape, dtype):
        return torch.randn(shape, generator=g, dtype=dtype)

    w = torch.stack([orthogonal_gaussian(m, d, randn) for _ in range(draws)]).double()
    assert w.shape == (draws, m, d)
    unit = w / w.norm(dim=-1, keepdim=True)
    for start in range(0, m, d):
        block = unit[:, start:start + d]
        gram = block @ block.transpose(-1, -2)
        eye = torch.eye(block.shape[1], dtype=torch.double).expand_as(gram)
        torch.testing.assert_close(gram, eye, atol=1e-5, rtol=0)
    sq_norms, directions = w.pow(2).sum(-1), unit
    # The squared norms of all rows (independent chi^2_d) sum to a chi^2_k, k = rows * d; Laurent &
    # Massart: P(X - k >= 2 sqrt(k x) + 2 x) <= e^-x and P(k - X >= 2 sqrt(k x)) <= e^-x.
    total, k, x = sq_norms.sum().item(), draws * m * d, math.log(2 / ALPHA)
    assert -2 * math.sqrt(k * x) <= total - k <= 2 * math.sqrt(k * x) + 2 * x, \
        f"squared norms sum to {total:.0f}, chi^2_{k} gives {k} (row norms not chi_{d})"
    assert_frequencies(directions.mean(0), torch.zeros(m, d), draws, "mean unit feature", width=2.0)
    iid = orthogonal_gaussian(m, d, randn, orthogonal=False).double()
    cos = (iid / iid.norm(dim=-1, keepdim=True)) @ (iid / iid.norm(dim=-1, keepdim=True)).T
    assert (cos - torch.eye(m, dtype=torch.double)).abs().max() > 1e-3, "orthogonal: false drew orthogonal rows"


# ----------------------------------------------------------------------------- ABC_RD slots, AdaMRA router
def test_abc_random_slots_uniform_independent_across_heads_and_rows():
    """ABC_RD (Table 1): each token one slot, uniform over the m slots; heads and, in training, rows
    draw independently (the same slot with probability 1 / m)."""
    mixer = ABCAttention(2, 4, 32, memory_size=5, control="random").train()
    draws = 300
    slots = torch.stack([mixer.random_slots(2, 20, torch.device("cpu")) for _ in range(draws)])   # [draws, B, H, N]
    assert ((slots >= 0) & (slots < 5)).all()
    freq = torch.stack([(slots == s).double().mean((0, 1, 2)) for s in range(5)])                # [slots, N]
    assert_frequencies(freq, torch.full_like(freq, 0.2), draws * 4, "slot of a position")
    bound = hoeffding(draws * 20, 2)
    for what, f in (("heads", (slots[:, :, 0] == slots[:, :, 1]).double().mean()),
                    ("rows", (slots[:, 0] == slots[:, 1]).double().mean())):
        assert abs(f - 0.2) <= bound, f"{what} share a slot {f:.3f} of the time (independent: 0.2)"


def test_adamra_random_router_uniform_over_heads_and_rows_independent():
    """AdaMRA's random router (Table 5, "Rand"): each real query one head, uniform over the heads,
    rows independent in training."""
    mixer = AdaMRAAttention(2, 4, 32, rates=[0.5, 0.25, 0.125], router="random").train()
    draws = 300
    mask = torch.ones(2, 24, dtype=torch.bool)
    heads = torch.stack([mixer.random_heads(mask) for _ in range(draws)])     # [draws, B, N]
    assert ((heads >= 0) & (heads < 3)).all()
    freq = torch.stack([(heads == h).double().mean((0, 1)) for h in range(3)])
    assert_frequencies(freq, torch.full_like(freq, 1 / 3), draws * 2, "head of a query")
    f = (heads[:, 0] == heads[:, 1]).double().mean()
    assert abs(f - 1 / 3) <= hoeffding(draws * 24, 1), f"rows share a query's head {f:.3f} of the time"


# ----------------------------------------------------------------------------- layers
@pytest.mark.parametrize("name", variant_names())
def test_every_layer_draws_from_its_own_stream(name):
    """The layers of a model built from one partial (one run seed) get different seeds, so random
    plans, features, rotations, planes and slots are independent across layers."""
    torch.manual_seed(0)
    partial = build_mixer(name)
    seeds = [partial(n_heads=2, head_dim=4, max_len=16, layer_idx=i).seed for i in range(3)]
    assert len(set(seeds)) == 3, seeds
