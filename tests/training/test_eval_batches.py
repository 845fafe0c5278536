"""Evaluation batches are length-sorted and cut to their longest real token, and that changes no
prediction: for every variant, a full validation pass gives the per-example predictions of the
unsorted, full-length batches (and logits equal to float rounding)."""
from __future__ import annotations

import numpy as np
import pytest
import torch
from torch.utils.data import DataLoader

from attention.registry import build_mixer, variant_names
from lra.data.datamodule import ArrayDataset, CachedDataModule
from models.network import LRAClassifier

MAX_LEN, N, BATCH = 64, 70, 16


def split(dual: bool = False) -> ArrayDataset:
    g = np.random.default_rng(0)
    shape = (N, 2) if dual else (N,)
    lengths = g.integers(3, MAX_LEN + 1, size=shape)
    lengths.flat[:3] = MAX_LEN  # a full-length example: some batch keeps every position
    ids = g.integers(1, 20, size=(*shape, MAX_LEN))
    ids[np.arange(MAX_LEN) >= lengths[..., None]] = 0
    return ArrayDataset(ids, lengths, g.integers(0, 4, size=N))


def module(dataset: ArrayDataset, **kw) -> CachedDataModule:
    dm = CachedDataModule("unused", max_len=MAX_LEN, batch_size=BATCH, **kw)
    dm.datasets = {"train": dataset, "val": dataset, "test": dataset}
    return dm


def predict(net: LRAClassifier, loader) -> tuple[np.ndarray, np.ndarray, list[int]]:
    logits, index, widths = [], [], []
    with torch.no_grad():
        for batch in loader:
            logits.append(net(batch["ids"], batch["mask"]))
            index.append(batch["index"])
            widths.append(batch["ids"].shape[-1])
    order = torch.cat(index).argsort()
    out = torch.cat(logits)[order]
    return out.argmax(-1).numpy(), out.numpy(), widths


def test_batches_are_sorted_cut_and_cover_the_split_once():
    data = split()
    batches = list(module(data).val_dataloader())
    lengths = [b["mask"].sum(-1) for b in batches]
    assert [b["ids"].shape[-1] for b in batches] == [int(x.max()) for x in lengths]  # cut to the longest
    flat = torch.cat(lengths)
    assert torch.equal(flat, flat.sort(descending=True).values)  # longest first
    assert sorted(torch.cat([b["index"] for b in batches]).tolist()) == list(range(N))
    for b in batches:  # every example its own ids, label and mask
        i = b["index"].numpy()
        assert torch.equal(b["label"], torch.as_tensor(data.labels[i]))
        assert torch.equal(b["ids"], torch.as_tensor(data.ids[i][:, : b["ids"].shape[-1]]))


def test_a_batch_limit_keeps_the_same_examples_as_unsorted_batches():
    dm = module(split())
    dm.trainer = type("T", (), {"limit_val_batches": 2, "limit_test_batches": 0.5})()
    assert sorted(torch.cat([b["index"] for b in dm.val_dataloader()]).tolist()) == list(range(2 * BATCH))
    assert sorted(torch.cat([b["index"] for b in dm.test_dataloader()]).tolist()) == list(range(2 * BATCH))  # int(5 * 0.5) batches


def test_a_fractional_limit_is_applied_once_by_lightning_too():
    """Lightning cuts a fractional ``limit_*_batches`` from the loader it gets; the loader is
    already cut (before sorting), so 0.5 of 5 batches must evaluate 2 batches, not int(2 * 0.5)."""
    import pytorch_lightning as pl

    class Count(pl.LightningModule):
        def __init__(self) -> None:
            super().__init__()
            self.seen: list[int] = []

        def validation_step(self, batch, i):
            self.seen += batch["index"].tolist()

        test_step = validation_step

    dm = module(split())  # 70 examples: 5 batches of 16
    dm.prepare_data = dm.setup = lambda *a, **kw: None
    for limit, kept in ((0.5, 2), (0.8, 4), (3, 3)):
        trainer = pl.Trainer(limit_val_batches=limit, limit_test_batches=limit, logger=False,
                             enable_progress_bar=False, enable_model_summary=False, enable_checkpointing=False)
        for run in (trainer.validate, trainer.test):
            net = Count()
            run(net, datamodule=dm, verbose=False)
            assert sorted(net.seen) == list(range(kept * BATCH)), (limit, run.__name__)


@pytest.mark.parametrize("dual", [False, True])
@pytest.mark.parametrize("kw", [{}, {"eval_batch_size": 24}], ids=["same-batch", "eval-batch-24"])
@pytest.mark.parametrize("multiple", [1, 8])
def test_eval_share_counts_the_positions_the_loader_computes(dual, kw, multiple):
    """What the run's forecast scales a training step by before the first validation is timed."""
    dm = module(split(dual), **kw)
    dm.eval_width_multiple = multiple
    dm.trainer = type("T", (), {"limit_val_batches": 1.0})()
    positions = sum(b["ids"].shape[0] * b["ids"].shape[-1] for b in dm.val_dataloader())
    assert dm.eval_share("val") == pytest.approx(positions / (BATCH * MAX_LEN))
    assert dm.eval_share("val") < N / BATCH  # the cut is counted: less than full-width batches
    dm.trainer.limit_val_batches = 2
    assert dm.eval_share("val") * BATCH * MAX_LEN == pytest.approx(sum(b["ids"].shape[0] * b["ids"].shape[-1] for b in dm.val_dataloader()))


def test_the_forecast_takes_its_first_validation_estimate_from_the_datamodule():
    from types import SimpleNamespace

    from lra.training.forecast import FORWARD_SHARE, RunForecast

    dm = module(split())
    trainer = SimpleNamespace(max_steps=100, val_check_batch=10, limit_val_batches=1.0, global_step=0, datamodule=dm)
    f = RunForecast("quick")
    f.on_train_start(trainer, SimpleNamespace(device=torch.device("cpu")))
    f.step_times.extend([3.0] * 5)
    assert f.val_batches == 5 and f.val_share == dm.eval_share("val") < 5
    assert f.validation_seconds() == (pytest.approx(3.0 * FORWARD_SHARE * dm.eval_share("val")), "estimated until the first validation")
    dm.trainer = trainer = SimpleNamespace(**{**vars(trainer), "limit_val_batches": 0.5})
    f.on_train_start(trainer, SimpleNamespace(device=torch.device("cpu")))
    assert f.val_batches == 2   # the fraction counted once: int(5 * 0.5), not int(2 * 0.5)


@pytest.mark.parametrize("name", variant_names())
def test_sorted_cut_batches_predict_what_full_batches_predict(name):
    torch.manual_seed(0)
    net = LRAClassifier(build_mixer(name), vocab_size=20, num_classes=4, max_len=MAX_LEN, d_model=32,
                        n_layers=2, n_heads=2, d_ffn=64, d_head=64, dropout=0.1).eval()
    data = split()
    full = DataLoader(data, batch_size=BATCH)  # what evaluation read before: split order, max_len wide
    before, logits_before, _ = predict(net, full)
    after, logits_after, widths = predict(net, module(data).val_dataloader())
    assert min(widths) < MAX_LEN  # some padding was skipped
    np.testing.assert_array_equal(after, before)
    np.testing.assert_allclose(logits_after, logits_before, rtol=1e-4, atol=1e-5)


def test_two_document_batches_are_sorted_and_cut_by_the_longer_document():
    data = split(dual=True)
    batches = list(module(data).val_dataloader())
    for b in batches:
        assert b["ids"].shape[1:] == (2, int(b["mask"].sum(-1).max()))
    longer = torch.cat([b["mask"].sum(-1).max(-1).values for b in batches])
    assert torch.equal(longer, longer.sort(descending=True).values)


def test_test_predictions_are_written_in_the_split_order():
    from models.module import LRAModule

    net = LRAClassifier(build_mixer("softmax"), vocab_size=20, num_classes=4, max_len=MAX_LEN, d_model=32,
                        n_layers=1, n_heads=2, d_ffn=64, d_head=64)
    m = LRAModule(net, num_classes=4)
    t = torch.tensor
    # two length-sorted batches: examples 2, 0 then 1
    m._test_parts = [(t([3, 1]), t([True, False]), t([3, 2]), t([60, 40]), t([2, 0])),
                     (t([0]), t([True]), t([0]), t([10]), t([1]))]
    out = m.test_predictions()
    assert out["pred"].tolist() == [1, 0, 3] and out["label"].tolist() == [2, 0, 3]
    assert out["correct"].tolist() == [False, True, True] and out["length"].tolist() == [40, 10, 60]


def test_evaluation_draws_nothing_from_the_global_rng():
    """Otherwise how often a run validates would change its dropout masks, hence its training."""
    dm = module(split())
    before = torch.get_rng_state()
    for loader in (dm.val_dataloader(), dm.test_dataloader()):
        for _ in loader:
            pass
    assert torch.equal(torch.get_rng_state(), before)
