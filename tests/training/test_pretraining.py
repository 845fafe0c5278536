"""The self-pretraining head's contract (issue 64 item 2), every variant: the pretraining loss is a
plain float64 cross-entropy over exactly the masked real positions; logits of real positions do not
depend on padding; a fully padded row, or a batch with nothing masked, gives a finite loss; masks
are drawn deterministically from (seed, stage, step) and only on real positions. Also: what carries
into fine-tuning, identities, and the settings' checks. End to end through run.py:
``tests/training/test_pretraining_runs.py``."""
from __future__ import annotations

import pytest
import torch
from omegaconf import OmegaConf

from attention.registry import build_mixer, config_names, variant_names
from attention.spec import class_of
from lra.badinput import ConfigError
from lra.checks.config import PRETRAIN_OBJECTIVES, check_config
from lra.identity import run_key
from lra.training.pretrained import carried_state, pretraining_config
from models.network import LRAClassifier
from models.pretraining import (IGNORE, OBJECTIVES, MaskedLMModule, draw_masked, mask_generator,
                                next_token_targets, set_causal)
from tests.contract_sizes import SMALL_STRUCTURE
from tests.training.test_config import compose_run

VOCAB, SEQ = 12, 48
LENGTHS = [SEQ, 40, 23, 0]  # the last row is fully padded


def tiny_module(name: str, pool: str = "mean", objective: str = "mlm", dual: bool = False,
                ratio: float = 0.5) -> MaskedLMModule:
    torch.manual_seed(0)
    mixer = build_mixer(name, **SMALL_STRUCTURE.get(name, {}))
    net = LRAClassifier(mixer, vocab_size=VOCAB + 1, num_classes=3, max_len=SEQ, d_model=16, n_layers=2, n_heads=2,
                        d_ffn=32, d_head=16, dropout=0.0, pool=pool, dual=dual)
    return MaskedLMModule(net, vocab_size=VOCAB, objective=objective, mask_ratio=ratio, seed=3).eval()


def batch(lengths: list[int] = LENGTHS, width: int = SEQ, seed: int = 1, pad_id: int = 0) -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(1, VOCAB, (len(lengths), width), generator=g)
    mask = torch.arange(width)[None, :] < torch.tensor(lengths)[:, None]
    return {"ids": ids.masked_fill(~mask, pad_id), "mask": mask, "label": torch.zeros(len(lengths), dtype=torch.long)}


def float64_reference(module: MaskedLMModule, b: dict[str, torch.Tensor], count: int) -> tuple[float, int]:
    """The expected loss built apart from the module's selection: masked positions are those whose
    input is the mask token; the cross-entropy is computed in float64 from the full logits."""
    inputs, targets, selected = module.corrupt(b["ids"], b["mask"], mask_generator(3, "train", count))
    masked = inputs == module.mask_id
    assert not (masked & ~b["mask"]).any()  # never a padded position
    with torch.no_grad():
        logits = module.token_logits(inputs, b["mask"]).double()
    logp = logits.log_softmax(-1)
    rows, cols = masked.nonzero(as_tuple=True)
    nll = -logp[rows, cols, b["ids"][rows, cols]]
    return (float(nll.mean()) if len(nll) else 0.0), len(nll)


@pytest.mark.parametrize("name", variant_names())
def test_loss_is_a_float64_cross_entropy_over_the_masked_real_positions(name):
    module = tiny_module(name)
    b = batch()
    with torch.no_grad():
        loss, logits, targets = module.pretraining_loss(b, "train", count=7)
    expected, n = float64_reference(module, b, 7)
    assert n > 10 and logits.shape == (n, VOCAB) and targets.shape == (n,)
    assert torch.isfinite(loss) and float(loss) == pytest.approx(expected, rel=1e-5, abs=1e-6)


@pytest.mark.parametrize("name", variant_names())
def test_logits_of_real_positions_ignore_what_padding_holds(name):
    module = tiny_module(name)
    clean, noisy = batch(pad_id=0), batch(pad_id=5)
    with torch.no_grad():
        a = module.token_logits(clean["ids"], clean["mask"])
        b = module.token_logits(noisy["ids"], noisy["mask"])
    real = clean["mask"]
    assert torch.isfinite(a).all() and torch.isfinite(b).all()  # the fully padded row too
    torch.testing.assert_close(a[real], b[real], rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("pool", ["mean", "cls"])
def test_extra_padding_changes_neither_masks_nor_loss(pool):
    """Masks are drawn over the position table, so a batch padded wider masks the same real tokens."""
    module = tiny_module("softmax", pool=pool)
    narrow = batch([30, 20, 12, 0], width=32)
    wide = {k: v for k, v in narrow.items()}
    wide["ids"] = torch.nn.functional.pad(narrow["ids"], (0, 16))
    wide["mask"] = torch.nn.functional.pad(narrow["mask"], (0, 16))
    with torch.no_grad():
        a = module.pretraining_loss(narrow, "train", 11)
        b = module.pretraining_loss(wide, "train", 11)
    torch.testing.assert_close(a[2], b[2], rtol=0, atol=0)  # the same targets in the same order
    torch.testing.assert_close(a[0], b[0], rtol=1e-5, atol=1e-6)


def test_token_states_drop_the_cls_position():
    module = tiny_module("softmax", pool="cls")
    b = batch()
    assert module.network.token_states(b["ids"], b["mask"]).shape == (len(LENGTHS), SEQ, 16)


def test_masks_are_real_positions_drawn_from_seed_stage_and_step():
    mask = batch()["mask"]
    first = draw_masked(mask, 0.5, SEQ, mask_generator(0, "train", 5))
    assert torch.equal(first, draw_masked(mask, 0.5, SEQ, mask_generator(0, "train", 5)))  # a resume draws it again
    assert not torch.equal(first, draw_masked(mask, 0.5, SEQ, mask_generator(0, "train", 6)))
    assert not torch.equal(first, draw_masked(mask, 0.5, SEQ, mask_generator(1, "train", 5)))
    assert not torch.equal(first, draw_masked(mask, 0.5, SEQ, mask_generator(0, "val", 5)))
    assert not (first & ~mask).any()
    share = float(first.sum()) / float(mask.sum())
    assert 0.35 < share < 0.65


def test_nothing_masked_or_all_padding_gives_zero_not_nan():
    module = tiny_module("adamra", ratio=1e-9)  # nothing is masked
    b = batch()
    loss, logits, _ = module.pretraining_loss(b, "train", 0)
    assert logits.shape[0] == 0 and float(loss.detach()) == 0.0
    loss.backward()  # still a graph: an optimiser step of zero gradients, no NaN
    empty = batch([0, 0, 0, 0])
    module = tiny_module("linear")
    loss = module.pretraining_loss(empty, "train", 0)[0]
    assert float(loss) == 0.0


def test_a_training_step_takes_the_classifier_batch_and_trains_every_pretrained_weight():
    module = tiny_module("softmax").train()
    loss = module.training_step(batch(), 0)
    loss.backward()
    names = [n for n, _ in module.optimised_parameters()]
    assert any(n.startswith("token_head.") for n in names)
    grads = {n: p.grad for n, p in module.optimised_parameters()}
    assert grads["embed.tokens.weight"] is not None and grads["token_head.proj.weight"] is not None
    assert all(g is None for n, g in grads.items() if n.startswith("head."))  # the classifier is not pretrained


def test_retrieval_pairs_are_pretrained_as_single_documents():
    module = tiny_module("softmax", dual=True)
    flat = batch([SEQ, 40, 23, 0])
    pairs = {"ids": flat["ids"].view(2, 2, SEQ), "mask": flat["mask"].view(2, 2, SEQ)}
    with torch.no_grad():
        a = module.pretraining_loss(flat, "train", 4)[0]
        b = module.pretraining_loss(pairs, "train", 4)[0]
    assert float(a) == float(b)


def test_causal_softmax_predicts_the_next_token_and_sees_no_future():
    module = tiny_module("softmax", objective="causal")
    b = batch()
    targets, selected = next_token_targets(b["ids"], b["mask"])
    assert torch.equal(targets[:, :-1][selected[:, :-1]], b["ids"][:, 1:][selected[:, :-1]])
    assert not selected[:, -1].any() and not selected[1, 39:].any() and not selected[3].any()
    assert (targets[:, -1] == IGNORE).all()
    changed = b["ids"].clone()
    changed[0, 30:] = (changed[0, 30:] % (VOCAB - 1)) + 1  # the future of row 0 from position 30
    with torch.no_grad():
        a = module.token_logits(b["ids"], b["mask"])
        c = module.token_logits(changed, b["mask"])
    torch.testing.assert_close(a[0, :30], c[0, :30])
    assert not torch.allclose(a[0, 30:], c[0, 30:])
    with torch.no_grad():
        loss = module.pretraining_loss(b, "train", 0)[0]
    logp = a.double().log_softmax(-1)
    rows, cols = selected.nonzero(as_tuple=True)
    assert float(loss) == pytest.approx(float(-logp[rows, cols, targets[rows, cols]].mean()), rel=1e-5)


@pytest.mark.parametrize("name", [n for n in variant_names() if not class_of(n).supports_causal])
def test_bidirectional_variants_refuse_a_causal_objective(name):
    with pytest.raises(ValueError, match="pretrain.objective=causal"):
        set_causal(tiny_module(name).network)


def test_the_encoder_carries_and_the_head_starts_fresh():
    pre = tiny_module("adamra")
    torch.manual_seed(1)
    fine = LRAClassifier(build_mixer("adamra"), vocab_size=VOCAB, num_classes=3, max_len=SEQ, d_model=16, n_layers=2,
                         n_heads=2, d_ffn=32, d_head=16, dropout=0.0)
    head_before = {k: v.clone() for k, v in fine.state_dict().items() if k.startswith("head.")}
    state = carried_state(pre.network.state_dict(), fine)
    fine.load_state_dict(state, strict=False)
    own = fine.state_dict()
    assert torch.equal(own["embed.tokens.weight"], pre.network.embed.tokens.weight[:VOCAB])
    assert torch.equal(own["embed.positions.weight"], pre.network.embed.positions.weight)
    enc = [k for k in own if k.startswith("encoder.") and not k.endswith("_extra_state")]
    assert enc and all(torch.equal(own[k], pre.network.state_dict()[k]) for k in enc)
    assert all(torch.equal(own[k], v) for k, v in head_before.items())
    assert not any(k.startswith("head.") or k.endswith("_extra_state") for k in state)


def test_objectives_are_one_list():
    assert PRETRAIN_OBJECTIVES == OBJECTIVES


def test_identities():
    scratch = compose_run("experiment=xiong2021", "task=listops", "attention=adamra")
    spt = compose_run("experiment=xiong2021", "task=listops", "attention=adamra", "+pretrain=mlm")
    assert "pretrain" not in OmegaConf.to_container(scratch)
    pre = pretraining_config(spt)
    keys = {run_key(scratch), run_key(spt), run_key(pre)}
    assert len(keys) == 3  # SPT never pools with from scratch; the stage is a run of its own
    assert pre.mode == "pretrain" and pre.trainer.max_steps == 5000 and pre.pretrain.max_steps == 5000
    assert pre.trainer.val_check_interval == 500 and pre.pretrain.mask_ratio == 0.5
    # fine-tune-only settings do not make another pretraining; pretraining settings do
    other_finetune = compose_run("experiment=xiong2021", "task=listops", "attention=adamra", "+pretrain=mlm",
                                 "task.val_every=100", "trainer.max_steps=4000", "pretrain.max_steps=5000")
    assert run_key(pretraining_config(other_finetune)) == run_key(pre)
    assert run_key(other_finetune) != run_key(spt)
    ratio = compose_run("experiment=xiong2021", "task=listops", "attention=adamra", "+pretrain=mlm",
                        "pretrain.mask_ratio=0.25")
    assert run_key(pretraining_config(ratio)) != run_key(pre) and run_key(ratio) != run_key(spt)


@pytest.mark.parametrize("override,needle", [
    ("pretrain.mask_ratio=1.0", "pretrain.mask_ratio=1.0 is invalid"),
    ("pretrain.mask_ratio=0", "pretrain.mask_ratio=0 is invalid"),
    ("pretrain.max_steps=-3", "pretrain.max_steps=-3 is invalid"),
    ("pretrain.lr=0", "pretrain.lr=0 is invalid"),
    ("pretrain.objective=bert", "unknown pretrain.objective='bert'"),
])
def test_bad_settings_name_the_key(override, needle, tmp_path):
    cfg = compose_run("+pretrain=mlm", override, f"paths.results_dir={tmp_path}", f"paths.checkpoint_dir={tmp_path}")
    with pytest.raises(ConfigError, match=needle.replace(".", r"\.").replace("(", r"\(")):
        check_config(cfg)


def test_causal_with_a_bidirectional_variant_is_one_clear_line(tmp_path):
    from lra.training.pretrain import check_pretraining

    cfg = compose_run("+pretrain=causal", "attention=adamra", "model=tiny", f"paths.data_dir={tmp_path}")
    with pytest.raises(ConfigError) as info:
        check_pretraining(cfg)
    text = str(info.value)
    assert "pretrain.objective=causal" in text and "attention=adamra" in text and "+pretrain=mlm" in text
    assert "\n" not in text
    check_pretraining(compose_run("+pretrain=causal", "attention=softmax", "model=tiny"))  # softmax can


def test_a_fresh_fine_tune_starts_from_the_recorded_encoder(tmp_path):
    """start_from_pretrained finds the finished pretraining by its identity, loads its encoder and
    names it in the fine-tune's record."""
    from lra.records import RunRecord
    from lra.training.pretrain import build_pretraining_module
    from lra.training.pretrained import ENCODER, MODE, start_from_pretrained
    from lra.training.train import build_module

    cfg = compose_run("+pretrain=mlm", "model=tiny", "attention=adamra", f"paths.results_dir={tmp_path}/results",
                      f"paths.checkpoint_dir={tmp_path}/ckpt")
    pre_cfg = pretraining_config(cfg)
    pre = build_pretraining_module(pre_cfg)
    rec = RunRecord(pre_cfg.paths.results_dir, mode=MODE, task="listops", attention="adamra", seed=0,
                    config=OmegaConf.to_container(pre_cfg, resolve=True))
    encoder = tmp_path / "ckpt" / rec.data["run_id"] / ENCODER
    encoder.parent.mkdir(parents=True)
    torch.save(pre.network.state_dict(), encoder)
    rec.update(run_key=run_key(pre_cfg), encoder=str(encoder), metrics={"train_steps": 5}).write()
    rec.finish("finished")
    fine = build_module(cfg)
    head = fine.network.head.net[0].weight.clone()
    record = RunRecord(cfg.paths.results_dir, mode="train", task="listops", attention="adamra", seed=0, config={})
    start_from_pretrained(cfg, fine, record)
    assert torch.equal(fine.network.embed.positions.weight, pre.network.embed.positions.weight)
    assert torch.equal(fine.network.encoder.blocks[0].ffn[0].weight, pre.network.encoder.blocks[0].ffn[0].weight)
    assert torch.equal(fine.network.head.net[0].weight, head)
    assert record.data["pretraining"]["run_id"] == rec.data["run_id"] and record.data["pretraining"]["steps"] == 5
    encoder.unlink()  # gone: one line that names the file and the way out
    from lra.badinput import DataMissingError

    with pytest.raises(DataMissingError, match="is gone"):
        start_from_pretrained(cfg, build_module(cfg), record)


@pytest.mark.slow
@pytest.mark.parametrize("group,name", [*((g, n) for g in ("experiment", "task", "ablation", "model", "trainer")
                                           for n in config_names(g))])
def test_every_config_composes_with_pretraining(group, name, tmp_path):
    choice = f"+{group}={name}" if group == "ablation" else f"{group}={name}"  # ablations are added (README)
    cfg = compose_run(choice, "+pretrain=mlm", f"paths.data_dir={tmp_path}")
    pre = OmegaConf.to_container(pretraining_config(cfg), resolve=True)
    assert pre["mode"] == "pretrain" and pre["trainer"]["max_steps"] == pre["pretrain"]["max_steps"] >= 1
    assert 0 < pre["pretrain"]["mask_ratio"] < 1 and pre["pretrain"]["val_every"] >= 1


def test_pretraining_on_several_devices_is_refused_in_one_line():
    from lra.training.pretrain import check_pretraining

    with pytest.raises(ConfigError, match=r"trainer.devices=2.*use trainer.devices=1"):
        check_pretraining(compose_run("+pretrain=mlm", "model=tiny", "trainer.devices=2"))
