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
