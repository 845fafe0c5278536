"""AdaMRA configs against the float64 reference of eqs. 6-9 (tests/reference/adamra.py): values and
gradients of q, k, v, x and every parameter (router included, in value), train and eval, padded
(with a fully padded row) and unpadded, through ``forward`` and the shell's fused ``forward_input``;
eval output independent of the batch; the learned router learns which head a query needs."""
from __future__ import annotations

import pytest
import torch
from omegaconf import OmegaConf

from attention.adamra import AdaMRAAttention
from attention.base import emulate_accelerator
from attention.padding import Padding
from attention.registry import CONF_DIR, build_mixer
from attention.shell import MultiHeadAttention
from tests.attention_harness import DEVICE, float64_inputs, lengths_mask, make_mixer, qkvx
from tests.reference.adamra import adamra_reference
from tests.reference.agreement import assert_same, grads_of, record_calls


CONFIGS = ["adamra", "adamra_elu", "adamra_random_router", "adamra_softmax", "adamra_t2a", "adamra_t2b"]
N = 37                                   # divides no segment size (2, 4, 8, 16, 32)
MASKS = {"padded": [37, 23, 0], "unpadded": [37, 37, 37]}


def _mixer(name: str, train: bool) -> AdaMRAAttention:
    mixer = make_mixer(name).double().to(DEVICE).train(train)
    with torch.no_grad():  # eq. 9's maps away from their identity init, so each one matters
        mixer.head_weight.add_(0.3 * torch.randn(mixer.head_weight.shape, dtype=torch.float64).to(DEVICE))
    return mixer



@pytest.mark.parametrize("mode", ["train", "eval"])
@pytest.mark.parametrize("padding", list(MASKS))
@pytest.mark.parametrize("name", CONFIGS)
def test_forward_matches_reference(name, padding, mode):
    mixer = _mixer(name, mode == "train")
    inputs, mask = float64_inputs(MASKS[padding], N)
    draws = record_calls(mixer, "random_heads")
    got = grads_of(lambda: (mixer(inputs["q"], inputs["k"], inputs["v"], mask, inputs["x"]), None), inputs, mixer)
    heads = draws[-1] if draws else None
    want = grads_of(lambda: (adamra_reference(mixer, inputs["q"], inputs["k"], inputs["v"], mask, heads), None),
                    inputs, mixer)
    assert_same(got, want)
    if mixer.route is not None:  # the router's gradient is really compared, not zero on both sides
        assert want[1]["param:route.weight"].abs().sum() > 1e-3
    assert want[1]["param:head_weight"].abs().sum() > 1e-3


@pytest.mark.parametrize("tile", [1, 3, 8])
@pytest.mark.parametrize("name", ["adamra", "adamra_softmax", "adamra_t2a"])
def test_groups_spread_over_several_tiles_match_reference(name, tile):
    """At N = 37 each (head, row) group fits one tile of the default 64; smaller tiles spread each
    group over full tiles and a partly empty last one, as at LRA's lengths (the grouped read's
    slots, tile groups and their empty slots)."""
    mixer = _mixer(name, True)
    mixer.tile = tile
    inputs, mask = float64_inputs(MASKS["padded"], N)
    got = grads_of(lambda: (mixer(inputs["q"], inputs["k"], inputs["v"], mask, inputs["x"]), None), inputs, mixer)
    want = grads_of(lambda: (adamra_reference(mixer, inputs["q"], inputs["k"], inputs["v"], mask, None), None),
                    inputs, mixer)
    assert_same(got, want)


@pytest.mark.parametrize("mode", ["train", "eval"])
@pytest.mark.parametrize("padding", list(MASKS))
@pytest.mark.parametrize("name", CONFIGS)
def test_fused_shell_path_matches_reference(name, padding, mode):
    """The path training uses: the shell calls ``forward_input`` with its projection layers."""
    torch.manual_seed(0)
    shell = MultiHeadAttention(16, 2, build_mixer(name), max_len=64).double().to(DEVICE).train(mode == "train")
    mixer = shell.mixer
    with torch.no_grad():
        mixer.head_weight.add_(0.3 * torch.randn(mixer.head_weight.shape, dtype=torch.float64).to(DEVICE))
    inputs, mask = float64_inputs(MASKS[padding], N)
    inputs = {"x": inputs["x"]}
    draws = record_calls(mixer, "random_heads")
    got = grads_of(lambda: (mixer.forward_input(inputs["x"], Padding.of(mask), shell.q_proj, shell.k_proj, shell.v_proj), None),
                   inputs, shell)
    heads = draws[-1] if draws else None
    split = lambda t: t.view(len(mask), N, 2, 8).transpose(1, 2)  # noqa: E731
    x = inputs["x"]
    want = grads_of(lambda: (adamra_reference(mixer, split(shell.q_proj(x)), split(shell.k_proj(x)),
                                              split(shell.v_proj(x)), mask, heads), None), inputs, shell)
    assert_same(got, want)


@pytest.mark.parametrize("path", ["mixer", "shell"])
@pytest.mark.parametrize("name", CONFIGS)
def test_accelerator_memories_match_reference(name, path):
    """The memories as an accelerator builds them (every head's landmarks zero-padded to the finest
    head's count and stacked, :func:`emulate_accelerator`; on CPU they are built per head at their
    sizes), padded batch, training mode, through ``forward`` and the shell's ``forward_input``."""
    torch.manual_seed(0)
    shell = MultiHeadAttention(16, 2, build_mixer(name), max_len=64).double().to(DEVICE).train()
    mixer = emulate_accelerator(shell).mixer
    assert not mixer.on_cpu
    with torch.no_grad():
        mixer.head_weight.add_(0.3 * torch.randn(mixer.head_weight.shape, dtype=torch.float64).to(DEVICE))
    inputs, mask = float64_inputs(MASKS["padded"], N)
    split = lambda t: t.view(len(mask), N, 2, 8).transpose(1, 2)  # noqa: E731
    if path == "shell":
        inputs = {"x": inputs["x"]}
        qkv = lambda: [split(p(inputs["x"])) for p in (shell.q_proj, shell.k_proj, shell.v_proj)]  # noqa: E731
        run = lambda: mixer.forward_input(inputs["x"], Padding.of(mask), shell.q_proj, shell.k_proj, shell.v_proj)  # noqa: E731
    else:
        qkv = lambda: [inputs["q"], inputs["k"], inputs["v"]]  # noqa: E731
        run = lambda: mixer(inputs["q"], inputs["k"], inputs["v"], mask, inputs["x"])  # noqa: E731
    draws = record_calls(mixer, "random_heads")
    got = grads_of(lambda: (run(), None), inputs, shell)
    heads = draws[-1] if draws else None
    want = grads_of(lambda: (adamra_reference(mixer, *qkv(), mask, heads), None), inputs, shell)
    assert_same(got, want)


@pytest.mark.parametrize("name", ["adamra_random_router", "adamra"])
def test_eval_output_of_a_sequence_does_not_depend_on_the_batch(name):
    """A sequence alone, or beside others in a longer padded batch: the same eval output."""
    mixer = _mixer(name, train=False)
    q, k, v, x = (t.double().to(DEVICE) for t in qkvx(b=3, n=N))
    alone = mixer(q[1:2, :, :29], k[1:2, :, :29], v[1:2, :, :29], lengths_mask([29], n=29).to(DEVICE), x[1:2, :29])
    batch = mixer(q, k, v, lengths_mask([37, 29, 11], n=N).to(DEVICE), x)   # the sequence in row 1, padded to 37
    torch.testing.assert_close(batch[1:2, :, :29], alone, rtol=1e-10, atol=1e-12)


def test_random_router_draws_fresh_in_training_fixed_per_position_in_eval():
    """The random router's heads (Table 5, "Rand"): every head in range and drawn, fresh per training
    call, one per position in eval (the same for every row, whatever the batch or its length)."""
    mixer = make_mixer("adamra_random_router")
    mask = lengths_mask([N, 23, 0], n=N).to(DEVICE)
    train = [mixer.train().random_heads(mask) for _ in range(2)]
    assert train[0].shape == mask.shape and not torch.equal(train[0], train[1])
    assert train[0].min() >= 0 and train[0].max() < mixer.n_routed and len(train[0].unique()) == mixer.n_routed
    ev = [mixer.eval().random_heads(m) for m in (mask, lengths_mask([20], n=20).to(DEVICE), mask)]
    assert torch.equal(ev[0], ev[2]) and torch.equal(ev[0][0], ev[0][2])
    assert len(ev[0][0].unique()) == mixer.n_routed
    assert torch.equal(ev[1][0], ev[0][0, :20])   # a position's head does not depend on N or B


def _routing_task(seed: int, b: int = 8, n: int = 32):
    """Queries whose best head is known: head 0 (uncompressed) writes to the first half of the
    channels, head 1 (one landmark) to the second half, and the target takes head 0's output
    where ``q . u > 0``, else head 1's."""
    g = torch.Generator().manual_seed(seed)
    q = torch.randn(b, 2, n, 4, generator=g)
    k = torch.randn(b, 2, n, 4, generator=g)
    v = 1.0 + 0.3 * torch.randn(b, 2, n, 4, generator=g)
    u = torch.tensor([1.0, -1.0, 0.5, 0.0, 0.0, 1.0, -0.5, 1.0])
    best = (q.transpose(1, 2).reshape(b, n, 8) @ u > 0).long() ^ 1           # 0 where q.u > 0
    return q, k, v, best


def _router_agreement(train_router: bool, steps: int = 60) -> tuple[float, float]:
    torch.manual_seed(0)
    mixer = AdaMRAAttention(n_heads=2, head_dim=4, max_len=32, rates=[1.0, 1.0 / 32])
    with torch.no_grad():
        first = torch.tensor([1.0] * 4 + [0.0] * 4)
        mixer.head_weight[0, 2].copy_(torch.diag(first))       # head 0 writes channels 0-3
        mixer.head_weight[1, 2].copy_(torch.diag(1 - first))   # head 1 writes channels 4-7
        mixer.route.weight.mul_(0.1)
    mixer.head_weight.requires_grad_(False)
    mixer.route.weight.requires_grad_(train_router)
    mask = torch.ones(4, 32, dtype=torch.bool)
    q_test, k_test, v_test, best_test = _routing_task(99)

    def agreement() -> float:
        logits = q_test.transpose(1, 2).reshape(8, 32, 8) @ mixer.route.weight.t()
        return (logits.argmax(-1) == best_test).double().mean().item()

    forced = []  # the same heads, every query sent to head h: each head's output for every query
    for h in range(2):
        forced.append(AdaMRAAttention(n_heads=2, head_dim=4, max_len=32, rates=[1.0, 1.0 / 32], router="random"))
        forced[h].head_weight.data.copy_(mixer.head_weight)
        forced[h].random_heads = lambda m, h=h: torch.full(m.shape, h)
    start = agreement()
    opt = torch.optim.Adam([mixer.route.weight], lr=0.1)
    for step in range(steps if train_router else 0):  # frozen: W stays where it started
        q, k, v, best = _routing_task(step, b=4)
        with torch.no_grad():  # the target: each query's best head's output
            outs = [f(q, k, v, mask, None) for f in forced]
            target = torch.where(best[:, None, :, None] == 0, outs[0], outs[1])
        loss = ((mixer(q, k, v, mask, None) - target) ** 2).mean()
        if train_router:
            opt.zero_grad()
            loss.backward()
            opt.step()
    return start, agreement()


def test_learned_router_learns_the_best_head_and_frozen_one_does_not():
    start, trained = _router_agreement(train_router=True)
    _, frozen = _router_agreement(train_router=False)
    print(f"router agreement: start {start:.2f}, trained {trained:.2f}, frozen {frozen:.2f}")
    assert trained > start + 0.2 and trained > 0.85, (start, trained)
    assert frozen == start and trained > frozen + 0.2, (frozen, trained)


def test_table2_configs_are_the_papers_four_head_rows_and_efficiency_uses_them():
    rates = {n: OmegaConf.load(CONF_DIR / "attention" / f"{n}.yaml").rates for n in ("adamra_t2a", "adamra_t2b")}
    assert list(rates["adamra_t2a"]) == [1 / 2, 1 / 4, 1 / 8, 1 / 16]
    assert list(rates["adamra_t2b"]) == [1 / 4, 1 / 8, 1 / 16, 1 / 32]
    sweep = OmegaConf.load(CONF_DIR / "experiment" / "efficiency.yaml").hydra.sweeper.params.attention.split(",")
    assert "adamra_t2a" in sweep and "adamra_t2b" in sweep and "adamra" not in sweep
