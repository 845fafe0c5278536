"""Every baseline config against its float64 paper reference (tests/reference/baselines.py):
values and gradients (q, k, v, x and every parameter), in train and eval mode, unpadded and padded
(with a fully padded row), at lengths that divide no block, bucket or chunk size. The references
read the module's parameters and random draws (LSH rotations, random features, BigBird priorities,
Gumbel draws), never its forward logic."""
from __future__ import annotations

import math

import pytest
import torch

from attention import counter_random
from attention.spec import family_of
from tests.attention_harness import DEVICE, lengths_mask, make_mixer, qkvx, softmax_reference
from tests.reference import baselines as ref


F64 = torch.float64
BASELINES = ("softmax", "linear", "performer", "performer_32", "linformer", "nystromformer", "nystromformer_64",
             "reformer", "bigbird", "local", "longformer", "sparse", "sparse_strided", "sinkhorn",
             "synthesizer_dense", "synthesizer_random")
ATOL, RTOL = 1e-9, 1e-7


def reference(name: str, mixer, q, k, v, mask, x, draws: dict, kw: dict | None = None):
    """The paper reference of ``name`` with the module's parameters and this call's draws; ``kw``,
    the case's settings, picks a model the settings switch (never the module's own attribute)."""
    n, dev, kw = q.shape[2], q.device, kw or {}
    name = family_of(name)   # a config's family: every config of a class meets its class's reference
    if name == "softmax":
        return ref.pattern_attention(q, k, v, mask)
    if name == "linear" and kw.get("normaliser") == "sqrt_len":
        return ref.sqrt_len_linear_attention(q, k, v, mask, mixer.max_len)
    if name == "linear":
        return ref.linear_attention(q, k, v, mask, mixer.eps)
    if name == "performer":
        port_width = 2 ** math.ceil(math.log2(mixer.max_len)) if kw.get("padded_keys") == "zero_keys" else None
        return ref.performer_attention(q, k, v, mask, mixer.features, mixer.kernel, mixer.eps,
                                       twice=kw.get("scaling") == "twice", port_width=port_width)
    if name == "linformer":
        f = mixer.proj_k if mixer.proj_v is None else mixer.proj_v
        return ref.linformer_attention(q, k, v, mask, mixer.proj_k, f)
    if name == "nystromformer":
        return ref.nystrom_attention(q, k, v, mask, mixer.num_landmarks, mixer.pinv_iterations, mixer.conv_weight)
    if name == "reformer":
        nb = ref_n_buckets(mixer)
        return ref.reformer_attention(q, v, mask, draws["rot"], nb, min(mixer.chunk_size, mixer.max_len),
                                      mixer.self_penalty)
    if name == "local":
        return ref.pattern_attention(q, k, v, mask, ref.local_allowed(n, mixer.block_size, mixer.window, dev))
    if name == "longformer":
        return ref.pattern_attention(q, k, v, mask, ref.longformer_allowed(n, mixer.window, dev))
    if name == "sparse":
        allowed = ref.sparse_allowed(n, mixer.pattern_name, mixer.stride, mixer.summary, dev)
        return ref.pattern_attention(q, k, v, mask, allowed)
    if name == "bigbird":
        allowed = ref.bigbird_allowed(mask, mixer.block_size, mixer.window_blocks, mixer.num_random_blocks,
                                      mixer.rand_priority)
        return ref.pattern_attention(q, k, v, mask, allowed)
    if name == "sinkhorn":
        net = mixer.sort_net
        return ref.sinkhorn_attention(q, k, v, mask, mixer.block_size, [net[0].weight, net[0].bias, net[2].weight,
                                      net[2].bias], mixer.sinkhorn_iterations, mixer.temperature, draws.get("u"))
    if name == "synthesizer_dense":
        return ref.dense_synthesizer(v, mask, x, mixer.w1.weight, mixer.w1.bias, mixer.w2, mixer.b2)
    if name == "synthesizer_random":
        r = mixer.r if mixer.rank is None else mixer.r1 @ mixer.r2.transpose(-1, -2)
        return ref.random_synthesizer(v, mask, r)
    raise KeyError(f"family {name!r} has no float64 reference: add one to reference() in "
                   f"tests/attention/test_reference_baselines.py (or a check to CHECKS of test_reference_grid.py)")


def ref_n_buckets(mixer) -> int:
    """The documented rule: ceil(max_len / bucket_size), rounded up to even, 1 when it is <= 1."""
    nb = -(-mixer.max_len // mixer.bucket_size)
    return 1 if nb <= 1 else nb + nb % 2


def forward_with_draws(name: str, mixer, q, k, v, mask, x) -> tuple[torch.Tensor, dict]:
    """Run the module and capture the random draws of this very call."""
    draws: dict = {}
    name = family_of(name)
    if name == "reformer":
        draw = mixer.rotations

        def capture(*args):
            draws["rot"] = draw(*args)
            return draws["rot"]
        mixer.rotations = capture
    noisy = name == "sinkhorn" and mixer.training and mixer.gumbel_noise
    if noisy:
        count = mixer.draws.clone()
        rand = mixer.rand
        mixer.rand = lambda *a: draws.setdefault("full", rand(*a))
    out = mixer(q, k, v, mask, x)
    if noisy:
        nb = -(-q.shape[2] // mixer.block_size)
        shape = (q.shape[0], q.shape[1], mixer.max_blocks, mixer.max_blocks)
        assert draws["full"].shape == shape, "Gumbel noise drawn at the max_len size"
        full = draws.pop("full")
        draws["u"] = full[..., :nb, :nb]
        # the draw is the training stream's: the mixer's key at the count before the call
        assert torch.equal(full, counter_random.uniform(shape, counter_random.key32(mixer.seed), count, full.dtype))
    return out, draws


def inputs(name: str, b: int, n: int, seed: int = 1):
    q, k, v, x = (t.to(DEVICE, F64).requires_grad_(True) for t in qkvx(b=b, n=n, seed=seed))
    return (q, q, v, x) if family_of(name) == "reformer" else (q, k, v, x)


# (config, overrides, n, max_len, padded lengths): n divides no block/bucket/chunk size.
CASES = [
    ("softmax", {}, 37, 64, [37, 23, 0]),
    ("linear", {}, 37, 64, [37, 23, 0]),
    ("linear", dict(normaliser="sqrt_len"), 37, 64, [37, 23, 0]),   # the ablation; n < max_len
    ("performer", {}, 37, 64, [37, 23, 0]),
    ("performer", dict(eps=0.0), 37, 64, [37, 23, 0]),
    ("performer", dict(kernel="relu", nb_features=20), 37, 64, [37, 23, 0]),
    ("performer", dict(scaling="twice"), 37, 64, [37, 23, 0]),
    ("performer", dict(padded_keys="zero_keys"), 37, 48, [37, 23, 0]),     # the port's width: 64, not max_len
    ("performer", dict(padded_keys="zero_keys", kernel="relu", nb_features=20), 37, 64, [37, 23, 0]),
    ("performer", dict(scaling="twice", padded_keys="zero_keys", eps=1e-4, redraw_interval=0), 64, 64,
     [64, 23, 0]),                                                          # the ablation; a row with no zero key
    ("performer_32", {}, 37, 64, [37, 23, 0]),
    ("linformer", {}, 37, 64, [37, 23, 0]),
    ("linformer", dict(k=12, share_kv=True), 37, 64, [37, 23, 0]),
    ("nystromformer", {}, 45, 64, [45, 30, 0]),
    ("nystromformer", dict(num_landmarks=7, conv_kernel=5), 37, 64, [37, 23, 0]),
    ("nystromformer_64", {}, 70, 80, [70, 50, 0]),
    ("reformer", {}, 37, 64, [37, 23, 0]),
    ("reformer", dict(bucket_size=8, chunk_size=7), 37, 64, [37, 23, 0]),
    ("reformer", dict(bucket_size=64, chunk_size=6), 37, 64, [37, 23, 0]),
    ("reformer", dict(n_hashes=3, bucket_size=12, chunk_size=5), 37, 64, [37, 23, 0]),
    ("bigbird", {}, 37, 64, [37, 23, 0]),
    ("bigbird", dict(block_size=5, num_random_blocks=2), 37, 64, [37, 29, 0]),
    ("bigbird", dict(block_size=4, num_random_blocks=1, window_blocks=1), 37, 64, [37, 21, 0]),
    ("local", {}, 37, 64, [37, 23, 0]),
    ("local", dict(block_size=5, window=1), 37, 64, [37, 23, 0]),
    ("local", dict(block_size=6, window=0), 37, 64, [37, 23, 0]),
    ("longformer", {}, 37, 64, [37, 23, 0]),
    ("longformer", dict(window=8), 37, 64, [37, 23, 0]),
    ("longformer", dict(window=7), 37, 64, [37, 23, 0]),
    ("sparse", {}, 37, 64, [37, 23, 0]),
    ("sparse", dict(stride=6, summary=2), 37, 64, [37, 23, 0]),
    ("sparse_strided", {}, 37, 64, [37, 23, 0]),
    ("sparse_strided", dict(stride=5), 37, 64, [37, 23, 0]),
    ("sinkhorn", {}, 37, 64, [37, 23, 0]),
    ("sinkhorn", dict(block_size=8), 37, 64, [37, 20, 0]),
    ("sinkhorn", dict(block_size=6, temperature=0.3, sinkhorn_iterations=3), 37, 64, [37, 20, 0]),
    ("synthesizer_dense", {}, 37, 64, [37, 23, 0]),
    ("synthesizer_random", {}, 37, 64, [37, 23, 0]),
    ("synthesizer_random", dict(rank=4), 37, 64, [37, 23, 0]),
]
IDS = [f"{c}-{'-'.join(f'{k}{v}' for k, v in kw.items()) or 'config'}" for c, kw, *_ in CASES]


def assert_close(a, b, what):
    torch.testing.assert_close(a, b, atol=ATOL, rtol=RTOL, msg=lambda m: f"{what}: {m}")


def family_test(*names: str):
    """One test function per family, so a mutant's check runs only its family's cases."""
    cases = [c for c in CASES if c[0] in names]

    @pytest.mark.parametrize("padded", [False, True], ids=["unpadded", "padded"])
    @pytest.mark.parametrize("train", [False, True], ids=["eval", "train"])
    @pytest.mark.parametrize("name,kw,n,max_len,lengths", cases, ids=[IDS[CASES.index(c)] for c in cases])
    def test(name, kw, n, max_len, lengths, train, padded):
        check_against_reference(name, kw, n, max_len, lengths, train, padded)
    return test


def check_against_reference(name, kw, n, max_len, lengths, train, padded):
    """Values and gradients (q, k, v, x and every parameter) of one config against its reference."""
    mixer = make_mixer(name, max_len=max_len, **kw).to(DEVICE, F64).train(train)
    q, k, v, x = inputs(name, len(lengths), n)
    mask = lengths_mask(lengths if padded else [n] * len(lengths), n).to(DEVICE)
    out, draws = forward_with_draws(name, mixer, q, k, v, mask, x)
    expected = reference(name, mixer, q, k, v, mask, x, draws, kw)
    assert_close(out, expected, "values")
    assert torch.isfinite(out).all()

    g = torch.randn_like(out)
    wrt = [q, v, x] + ([] if name == "reformer" else [k]) + list(mixer.parameters())
    got = torch.autograd.grad((out * g).sum(), wrt, allow_unused=True)
    want = torch.autograd.grad((expected * g).sum(), wrt, allow_unused=True)
    names = ["q", "v", "x", "k"] + [p for p, _ in mixer.named_parameters()]
    for label, a, b, t in zip(names, got, want, wrt):
        a = torch.zeros_like(t) if a is None else a
        b = torch.zeros_like(t) if b is None else b
        assert_close(a, b, f"grad {label}")


test_softmax_equals_reference = family_test("softmax")
test_linear_equals_reference = family_test("linear")
test_performer_equals_reference = family_test("performer", "performer_32")
test_linformer_equals_reference = family_test("linformer")
test_nystromformer_equals_reference = family_test("nystromformer", "nystromformer_64")
test_reformer_equals_reference = family_test("reformer")
test_bigbird_equals_reference = family_test("bigbird")
test_local_equals_reference = family_test("local")
test_longformer_equals_reference = family_test("longformer")
test_sparse_equals_reference = family_test("sparse", "sparse_strided")
test_sinkhorn_equals_reference = family_test("sinkhorn")
test_synthesizer_equals_reference = family_test("synthesizer_dense", "synthesizer_random")


def test_every_baseline_config_has_a_reference_case():
    assert {c[0] for c in CASES} == set(BASELINES)


def test_reference_softmax_agrees_with_the_harness_softmax():
    """The references' masked softmax (with its zero rows for fully padded samples) is the harness's."""
    q, k, v, _ = (t.detach() for t in inputs("softmax", 3, 37))
    mask = lengths_mask([37, 23, 0], 37).to(DEVICE)
    torch.testing.assert_close(ref.pattern_attention(q, k, v, mask), softmax_reference(q, k, v, mask),
                               atol=1e-12, rtol=1e-10)
