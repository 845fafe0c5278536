"""Profiling callbacks: exact example/token counts, peak-memory methods, parameter counts, logging."""
from __future__ import annotations

import csv
import functools

import pytest
import torch
from torch import nn

from attention.base import Mixer
from attention.softmax import SoftmaxAttention
from lra import footprint
from lra.footprint import PeakMemory, count_parameters
from models.network import LRAClassifier


class ScaledMixer(Mixer):
    """Softmax with one learned scalar: a mixer that owns a parameter."""

    def __init__(self, n_heads, head_dim, max_len, layer_idx=0):
        super().__init__(n_heads, head_dim, max_len, layer_idx)
        self.scale = nn.Parameter(torch.ones(3))
        self.inner = SoftmaxAttention(n_heads, head_dim, max_len, layer_idx)

    def forward(self, q, k, v, mask, x):
        return self.inner(q, k, v, mask, x) * self.scale[0]


def test_parameter_counts_match_hand_count():
    d, layers = 16, 2
    net = LRAClassifier(ScaledMixer, vocab_size=11, num_classes=3, max_len=20, d_model=d, n_layers=layers,
                        n_heads=2, d_ffn=32, d_head=8, dropout=0.0)
    counts = count_parameters(net)
    assert counts["mixer"] == 3 * layers
    assert counts["attention"] == layers * (4 * (d * d + d) + 3)
    assert counts["total"] == sum(p.numel() for p in net.parameters()) == counts["trainable"]
    net.embed.tokens.weight.requires_grad_(False)
    assert count_parameters(net)["trainable"] == counts["total"] - 11 * d


def test_cpu_peak_memory_resets_per_phase():
    meter = PeakMemory("cpu")
    if meter.method != footprint.CPU_RESET:
        pytest.skip(f"/proc/self/clear_refs not writable here ({meter.method})")
    meter.reset()
    before = meter.peak_mb()
    big = torch.ones(96 * 2**20 // 4)  # 96 MB, touched
    high = meter.peak_mb()
    assert high - before >= 90, (before, high)
    del big
    meter.reset()  # the high-water mark falls back to the current resident set
    assert meter.peak_mb() < high - 60


def test_cpu_peak_memory_falls_back_and_says_so(tmp_path):
    meter = PeakMemory("cpu", clear_refs=tmp_path / "missing" / "clear_refs")
    if meter.method == footprint.CPU_RUSAGE:
        pytest.skip("no /proc on this platform")
    assert meter.method == footprint.CPU_LIFETIME and not meter.resettable
    assert "not writable" in meter.note
    meter.reset()  # a no-op, never an error
    assert meter.peak_mb() >= meter.current_mb() > 0
    no_proc = PeakMemory("cpu", status=tmp_path / "no-status")
    assert no_proc.method == footprint.CPU_RUSAGE and no_proc.peak_mb() > 0


def _batches(n_batches: int, b: int, n: int, seed: int) -> list[dict[str, torch.Tensor]]:
    g = torch.Generator().manual_seed(seed)
    out = []
    for _ in range(n_batches):
        lengths = torch.randint(1, n + 1, (b,), generator=g)
        mask = torch.arange(n)[None] < lengths[:, None]
        out.append({"ids": torch.randint(1, 9, (b, n), generator=g).masked_fill(~mask, 0), "mask": mask,
                    "label": torch.randint(0, 3, (b,), generator=g)})
    return out


def test_callbacks_count_exactly_and_reach_record_and_logger(tmp_path):
    import pytorch_lightning as pl
    from pytorch_lightning.loggers import CSVLogger

    from lra.training.profiling import ParameterCount, PeakMemoryMonitor, ThroughputMonitor
    from models.module import LRAModule

    b, n = 4, 24
    train, val, test = _batches(6, b, n, 0), _batches(3, b, n, 1), _batches(3, b, n, 2)
    net = LRAClassifier(functools.partial(SoftmaxAttention), vocab_size=9, num_classes=3, max_len=n, d_model=16,
                        n_layers=1, n_heads=2, d_ffn=32, d_head=16, dropout=0.0)
    module = LRAModule(net, num_classes=3, lr=1e-3, total_steps=6)
    cbs = [ThroughputMonitor(warmup_steps=2, eval_warmup_batches=1), PeakMemoryMonitor(), ParameterCount()]
    logger = CSVLogger(tmp_path, name="csv", version="")
    trainer = pl.Trainer(max_steps=6, val_check_interval=3, check_val_every_n_epoch=None, logger=logger,
                         callbacks=cbs, enable_checkpointing=False, enable_progress_bar=False,
                         enable_model_summary=False, num_sanity_val_steps=0, accelerator="cpu")
    collate = lambda x: x[0]  # noqa: E731 (batches are prebuilt)
    loader = lambda data: torch.utils.data.DataLoader(data, batch_size=1, collate_fn=collate)  # noqa: E731
    trainer.fit(module, loader(train), loader(val))
    trainer.test(module, loader(test), verbose=False)

    thr = cbs[0]
    # train: steps 3..6 timed; val: 2 runs x 3 batches, the first batch of all is warm-up; test: 2 of 3
    expected = {"train": train[2:], "val": (val + val)[1:], "test": test[1:]}
    for phase, batches in expected.items():
        m = thr.meters[phase]
        assert m.steps == len(batches)
        assert m.examples == b * len(batches)
        assert m.padded == b * n * len(batches)
        assert int(m.tokens) == sum(int(x["mask"].sum()) for x in batches)
    fields = {}
    for cb in cbs:
        fields.update(cb.record_fields())
    t = fields["throughput"]["train"]
    assert t["timed_steps"] == 4 and t["warmup_steps"] == 2
    assert t["tokens_per_s"] == pytest.approx(int(thr.meters["train"].tokens) / thr.meters["train"].seconds)
    assert t["padded_tokens_per_s"] > t["tokens_per_s"] > 0
    assert t["ms_per_step"] == pytest.approx(1000 * thr.meters["train"].seconds / 4)
    assert fields["throughput"]["val"]["timed_batches"] == 5
    over = fields["throughput"]["overhead"]
    assert over["pct_of_step"] >= 0 and over["ms_per_step"] >= 0
    mem = fields["peak_memory"]
    assert mem["method"] in footprint.METHOD_NOTES
    assert all(mem[f"{p}_mb"] > 0 for p in ("train", "val", "test"))
    assert fields["parameters"] == count_parameters(module)
    with open(tmp_path / "csv" / "metrics.csv") as f:
        columns = next(csv.reader(f))
    for key in ("profile/train_examples_per_s", "profile/test_peak_mb", "params/total"):
        assert key in columns


class _ScriptedMeter:
    """A PeakMemory whose resident set the test sets (:func:`_set_level`); ``peak_mb`` is the highest
    level since the last reset, like VmHWM."""

    level = 100.0
    live: list[_ScriptedMeter] = []

    def __init__(self, device) -> None:
        self.method, self.note = footprint.CPU_RESET, footprint.METHOD_NOTES[footprint.CPU_RESET]
        self.high = self.level
        _ScriptedMeter.live.append(self)

    def reset(self) -> None:
        self.high = self.level

    def peak_mb(self) -> float:
        return self.high

    def current_mb(self) -> float:
        return self.level


def _set_level(mb: float) -> None:
    _ScriptedMeter.level = mb
    for meter in _ScriptedMeter.live:
        meter.high = max(meter.high, mb)


def _stretch(ckpt_dir, max_steps: int, spikes: dict[tuple[str, int], float], ckpt_path=None,
             test_from=None) -> tuple[dict, dict]:
    """Fit to ``max_steps`` (validation every 3 steps, a checkpoint every 2: ``step=2.ckpt``, ...),
    from ``ckpt_path`` if given, then test ``test_from`` if given (as a run tests its best checkpoint).
    ``spikes``: ``{(phase, global_step): MB}``, a transient rise inside that training step or
    validation (the level falls back to 100 MB at once; the mark keeps it). Returns the record's
    peaks and the throughput counts (one warm-up batch per phase; every token real)."""
    import pytorch_lightning as pl
    from pytorch_lightning.callbacks import ModelCheckpoint

    from lra.training.profiling import PeakMemoryMonitor, ThroughputMonitor
    from models.module import LRAModule

    class Spikes(pl.Callback):
        def spike(self, phase: str, step: int) -> None:
            if (phase, step) in spikes:
                _set_level(spikes[phase, step])
                _set_level(100.0)

        def on_train_batch_start(self, trainer, *args) -> None:
            self.spike("train", trainer.global_step)

        def on_validation_batch_start(self, trainer, *args) -> None:
            self.spike("val", trainer.global_step)

    b, n = 2, 12
    torch.manual_seed(0)
    net = LRAClassifier(functools.partial(SoftmaxAttention), vocab_size=9, num_classes=3, max_len=n, d_model=8,
                        n_layers=1, n_heads=2, d_ffn=16, d_head=4, dropout=0.0)
    module = LRAModule(net, num_classes=3, lr=1e-3, total_steps=6)
    monitor, throughput = PeakMemoryMonitor(), ThroughputMonitor(warmup_steps=1, eval_warmup_batches=1)
    ckpt = ModelCheckpoint(dirpath=ckpt_dir, filename="{step}", every_n_train_steps=2, save_top_k=-1)
    trainer = pl.Trainer(max_steps=max_steps, val_check_interval=3, check_val_every_n_epoch=None, logger=False,
                         callbacks=[monitor, throughput, Spikes(), ckpt], enable_progress_bar=False,
                         enable_model_summary=False, num_sanity_val_steps=0, accelerator="cpu")
    collate = lambda x: x[0]  # noqa: E731 (batches are prebuilt)
    loader = lambda data: torch.utils.data.DataLoader(data, batch_size=1, collate_fn=collate)  # noqa: E731
    full = lambda batches: [{**x, "mask": torch.ones_like(x["mask"])} for x in batches]  # noqa: E731
    _ScriptedMeter.level, _ScriptedMeter.live = 100.0, []
    trainer.fit(module, loader(full(_batches(12, b, n, 0))), loader(full(_batches(2, b, n, 1))), ckpt_path=ckpt_path)
    if test_from is not None:
        trainer.test(module, loader(_batches(2, b, n, 2)), ckpt_path=test_from, verbose=False)
    mem = monitor.record_fields()["peak_memory"]
    counts = {"from_step": throughput.record_fields()["throughput"]["from_step"]}
    if counts["from_step"] == 0 and ckpt_path is not None:  # carried over: the hooks' own time too
        (earlier,) = [v for k, v in torch.load(ckpt_path, weights_only=False)["callbacks"].items()
                      if "ThroughputMonitor" in k]
        assert throughput.overhead_s > earlier["overhead_s"] > 0
    for phase in ("train", "val"):
        m = throughput.meters[phase]
        assert m.examples == b * m.steps and m.padded == b * n * m.steps and int(m.tokens) == m.padded, phase
        assert m.seconds > 0 or m.steps == 0
        counts[phase] = (m.seen, m.steps)
    return {k: mem[k] for k in ("train_mb", "val_mb", "from_step")}, counts


def _edit_state(src, dst, callback: str, edit) -> None:
    ckpt = torch.load(src, weights_only=False)
    (key,) = [k for k in ckpt["callbacks"] if callback in k]
    edit(ckpt["callbacks"], key)
    torch.save(ckpt, dst)


def test_a_resumed_run_reports_the_whole_run(tmp_path, monkeypatch):
    """Peak memory: spikes of 900 MB in training step 1, 700 MB in the validation after step 3 and
    950 MB in the training step after it, then 100 MB to the end; a run resumed after them reports
    them from step 0, as the uninterrupted run does. Checkpoints are written while training is open
    (step 2, before any validation; step 4, after one): the spikes reach them from the live
    high-water mark. Throughput: the counts of every stretch add up, each process skipping its own
    warm-up batch. Testing an older checkpoint changes neither. A checkpoint without the peaks
    (written before they were kept), or measured by another method or on another machine, gives
    this stretch's figures and says from which step."""
    import lra.training.profiling as profiling

    monkeypatch.setattr(profiling, "PeakMemory", _ScriptedMeter)
    spikes = {("train", 1): 900.0, ("val", 3): 700.0, ("train", 3): 950.0}

    def peaks(train: float, val: float, from_step: int) -> dict:
        return {"train_mb": train, "val_mb": val, "from_step": from_step}

    # (seen, timed) per phase: 6 steps, 1 warm-up; validations at 3 and 6 of 2 batches, 1 warm-up
    assert _stretch(tmp_path / "whole", 6, spikes) == (peaks(950.0, 700.0, 0),
                                                       {"from_step": 0, "train": (6, 5), "val": (4, 3)})
    ckpts = tmp_path / "first"
    _stretch(ckpts, 4, spikes)  # writes step=2.ckpt and step=4.ckpt
    # from step 2: (2, 1) + (4, 3) training, (0, 0) + (4, 3) validation
    assert _stretch(tmp_path / "r2", 6, {}, ckpts / "step=2.ckpt") == (peaks(900.0, 100.0, 0),
                                                                       {"from_step": 0, "train": (6, 4), "val": (4, 3)})
    # from step 4: (4, 3) + (2, 1), (2, 1) + (2, 1); the test restores callbacks from step 2's checkpoint
    assert _stretch(tmp_path / "r4", 6, {}, ckpts / "step=4.ckpt", ckpts / "step=2.ckpt") == (
        peaks(950.0, 700.0, 0), {"from_step": 0, "train": (6, 4), "val": (4, 2)})
    here = {"from_step": 4, "train": (2, 1), "val": (2, 1)}  # this stretch alone
    _edit_state(ckpts / "step=4.ckpt", tmp_path / "old.ckpt", "PeakMemoryMonitor", lambda cbs, key: cbs.pop(key))
    assert _stretch(tmp_path / "r-old", 6, {}, tmp_path / "old.ckpt")[0] == peaks(100.0, 100.0, 4)
    _edit_state(ckpts / "step=4.ckpt", tmp_path / "other.ckpt", "PeakMemoryMonitor",
                lambda cbs, key: cbs[key].update(method=footprint.CPU_LIFETIME))
    assert _stretch(tmp_path / "r-other", 6, {}, tmp_path / "other.ckpt")[0] == peaks(100.0, 100.0, 4)
    _edit_state(ckpts / "step=4.ckpt", tmp_path / "moved.ckpt", "ThroughputMonitor",
                lambda cbs, key: cbs[key].update(machine="cuda: NVIDIA H200, 1 threads"))
    assert _stretch(tmp_path / "r-moved", 6, {}, tmp_path / "moved.ckpt") == (peaks(950.0, 700.0, 0), here)
