"""Baselines beyond one call: padding-independence (the same sequence in a batch padded to N or to
2N), the random-draw schedules (Performer features redrawn every ``redraw_interval`` training
steps and never at eval; Reformer's rotations fresh per training step and fixed at eval) and a
BigBird plan that survives a cast to bfloat16."""
from __future__ import annotations

import pytest
import torch

from tests.attention_harness import DEVICE, lengths_mask, make_mixer
from tests.attention.test_reference_baselines import CASES, F64, IDS, inputs
from tests.reference import baselines as ref



@pytest.mark.parametrize("train", [False, True], ids=["eval", "train"])
@pytest.mark.parametrize("name,kw,n,max_len,lengths", CASES, ids=IDS)
def test_padding_to_twice_the_length_changes_nothing(name, kw, n, max_len, lengths, train):
    """Bucket counts, chunk lengths, landmarks, block plans and random draws must not follow the
    batch's padded length: the real outputs at N and at 2N agree (fresh mixers of one seed)."""
    max_len = 2 * n + 6
    q, k, v, x = (t.detach() for t in inputs(name, len(lengths), n))
    q2, k2, v2, x2 = (t.detach() for t in inputs(name, len(lengths), 2 * n, seed=7))
    q2, k2, v2 = (torch.cat([a, b[:, :, n:]], dim=2) for a, b in ((q, q2), (k, k2), (v, v2)))
    x2 = torch.cat([x, x2[:, n:]], dim=1)
    if name == "reformer":
        k2 = q2
    outs = []
    for args, size in (((q, k, v, x), n), ((q2, k2, v2, x2), 2 * n)):
        mixer = make_mixer(name, max_len=max_len, **kw).to(DEVICE, F64).train(train)
        mask = lengths_mask(lengths, size).to(DEVICE)
        with torch.no_grad():
            outs.append(mixer(*args[:3], mask, args[3]))
    assert torch.equal(outs[1][:, :, n:], torch.zeros_like(outs[1][:, :, n:]))
    torch.testing.assert_close(outs[1][:, :, :n], outs[0], atol=1e-11, rtol=1e-9)


def test_performer_features_redrawn_every_interval_training_steps_never_at_eval():
    mixer = make_mixer("performer_32", redraw_interval=3).to(DEVICE, F64)
    made = {}   # training calls before a draw -> the draw (a draw is made every training call)
    draw = mixer._draw
    mixer._draw = lambda device: made.setdefault(int(mixer.calls), draw(device))
    q, k, v, x = (t.detach() for t in inputs("performer", 2, 11))
    mask = lengths_mask([11, 6], 11).to(DEVICE)
    # Training call t uses the draw of call 3 * (t // 3); eval calls neither redraw nor advance the schedule.
    schedule = ["train", "eval", "train", "train", "eval", "eval", "train", "train", "train", "eval", "train"]
    expected = [0, 0, 0, 0, 0, 0, 3, 3, 3, 3, 6]
    seen = []
    for mode in schedule:
        mixer.train(mode == "train")
        with torch.no_grad():
            mixer(q, k, v, mask, x)
        seen.append(mixer.features.clone())
    for step, (feat, want) in enumerate(zip(seen, expected)):
        assert torch.equal(feat, made[want].to(F64)), f"call {step} ({schedule[step]}) should use the draw of call {want}"
    assert int(mixer.calls) == schedule.count("train") == mixer.get_extra_state()["training_calls"]
    assert not torch.equal(made[0], made[3]) and not torch.equal(made[3], made[6])   # each redraw is fresh


def test_reformer_rotations_fresh_per_training_step_fixed_at_eval():
    mixer = make_mixer("reformer", bucket_size=8, chunk_size=7).to(DEVICE, F64)
    seen = []
    draw = mixer.rotations
    mixer.rotations = lambda *a: seen.append(draw(*a)) or seen[-1]
    q, _, v, x = (t.detach() for t in inputs("reformer", 2, 37))
    mask = lengths_mask([37, 20], 37).to(DEVICE)
    shape = (mixer.n_heads, mixer.n_hashes, mixer.head_dim, 4)        # 8 buckets: ceil(64 / 8)
    with torch.no_grad():
        for mode in (True, True, True, False, False, True):
            mixer.train(mode)(q, q, v, mask, x)
    assert all(r.shape == shape for r in seen)
    # counter-based draws: fresh per training call, one fixed eval draw
    train, evaluation = [seen[0], seen[1], seen[2], seen[5]], seen[3]
    assert all(not torch.equal(a, b) for i, a in enumerate(train + [evaluation]) for b in (train + [evaluation])[i + 1:])
    for got, want in zip(seen, [train[0], train[1], train[2], evaluation, evaluation, train[3]]):
        assert torch.equal(got, want)
    assert not torch.equal(train[0], train[1])


def test_bigbird_plan_unchanged_by_bfloat16_cast():
    mixer = make_mixer("bigbird", n_heads=4, max_len=2000)
    lengths = (32, 20, 7)
    before = [mixer.random_blocks(nb) for nb in lengths]
    mixer.to(torch.bfloat16)
    for nb, (idx, valid) in zip(lengths, before):
        idx2, valid2 = mixer.random_blocks(nb)
        assert torch.equal(idx, idx2) and torch.equal(valid, valid2), f"plan changed at {nb} blocks"


def test_bigbird_float_priorities_of_old_checkpoints_keep_their_plan():
    mixer = make_mixer("bigbird", block_size=4, num_random_blocks=2)
    old = torch.rand(mixer.rand_priority.shape, dtype=torch.float64)
    mixer.load_state_dict({**mixer.state_dict(), "rand_priority": old})
    w = mixer.window_blocks // 2
    nb = 12
    a = torch.arange(nb)
    excluded = ((a[:, None] - a[None, :]).abs() <= w) | (a[None, :] == 0) | (a[None, :] == nb - 1)
    want = old[:, :nb, :nb].masked_fill(excluded, -1.0).topk(2, dim=-1).indices
    assert torch.equal(mixer.random_blocks(nb)[0], want)


def test_linformer_every_layer_owns_its_projections():
    """One LRA port kept E, F as a class attribute shared by every layer and model in the process."""
    first, second = (make_mixer("linformer", layer_idx=i, seed=i) for i in range(2))
    for a, b in ((first.proj_k, second.proj_k), (first.proj_v, second.proj_v)):
        assert a is not b and a.data_ptr() != b.data_ptr() and not torch.equal(a, b)


def test_performer_port_stabiliser_takes_the_zero_keys_projection_into_its_max():
    """The port's key stabiliser is a max over every key of the padded batch, zero keys included
    (projection 0). With random keys some real projection is positive and the zero key cannot
    change the max; keys whose every projection is negative show it (the eps term moves)."""
    mixer = make_mixer("performer", nb_features=4, padded_keys="zero_keys", eps=1e-2, max_len=48).to(DEVICE, F64).eval()
    w = mixer.features
    q, _, v, x = (t.detach() for t in inputs("performer", 2, 37))
    away = -(w / w.pow(2).sum(-1, keepdim=True)).sum(0)           # W @ away = -1 on every (orthogonal) row
    k = 6.0 * mixer.head_dim ** 0.25 * away.expand_as(q) + 0.1 * torch.randn_like(q)
    assert ((k * mixer.head_dim ** -0.25) @ w.T).amax() < -1      # no real key reaches the zero key's 0
    mask = lengths_mask([37, 23], 37).to(DEVICE)
    with torch.no_grad():
        out = mixer(q, k, v, mask, x)
    expected = ref.performer_attention(q, k, v, mask, w, "softmax", 1e-2, port_width=64)
    torch.testing.assert_close(out, expected, atol=1e-11, rtol=1e-9)


@pytest.mark.parametrize("orthogonal", [True, False])
def test_performer_orthogonal_setting_decides_the_feature_rows(orthogonal):
    """``orthogonal: true`` draws orthogonal blocks of ``d`` rows (FAVOR+); ``false`` i.i.d. Gaussian
    rows, whose Gram matrix within a block is far from diagonal."""
    mixer = make_mixer("performer", nb_features=16, orthogonal=orthogonal).to(DEVICE, F64).train()
    q, k, v, x = (t.detach() for t in inputs("performer", 2, 11))
    with torch.no_grad():
        mixer(q, k, v, lengths_mask([11, 6], 11).to(DEVICE), x)
    d = mixer.head_dim
    block = mixer.features[:d].to(F64)                                   # [d, d]: the first block's rows
    gram = block @ block.T
    off = (gram - torch.diag(torch.diagonal(gram))).abs().max() / torch.diagonal(gram).max()
    assert (off < 1e-5) if orthogonal else (off > 0.05), f"orthogonal={orthogonal}: off-diagonal Gram {float(off):.3g}"
