"""Is a trained Performer tied to its own random features? Validation accuracy of a
``performer_32`` checkpoint with the features it trained with, then with fresh draws of the same
distribution (orthogonal, chi norms; no training in between).

    python results/xiong2021-listops-cpu/probes/performer_redraw.py <checkpoint> [draws]

A diagnostic for the README of this folder, not part of the suite: the checkpoint must be of
``experiment=xiong2021 task=listops attention=performer_32``. The first line must equal the
validation accuracy recorded at that step (a check that the probe evaluates what the run did).
The best checkpoint it was run on is in git history: ``git show 2a42ce6:results/xiong2021-listops-cpu/
checkpoints/20261129T060019-train-listops-performer_32-s0-fa10de/best-1000.ckpt > best-1000.ckpt``.
"""
import sys
from pathlib import Path

import pytorch_lightning as pl
import torch
from hydra import compose, initialize_config_dir
from hydra.utils import instantiate

from attention.performer import PerformerAttention, orthogonal_gaussian
from lra.training.train import build_module

ROOT = Path(__file__).resolve().parents[3]


def main(checkpoint: str, draws: int) -> None:
    torch.set_num_threads(1)
    with initialize_config_dir(config_dir=str(ROOT / "conf"), version_base=None):
        cfg = compose("config", overrides=["experiment=xiong2021", "task=listops", "attention=performer_32"])
    module = build_module(cfg)
    module.load_state_dict(torch.load(checkpoint, map_location="cpu", weights_only=False)["state_dict"])
    datamodule = instantiate(cfg.task.datamodule)
    trainer = pl.Trainer(accelerator="cpu", logger=False, enable_progress_bar=False, enable_checkpointing=False)
    layers = [m for m in module.modules() if isinstance(m, PerformerAttention)]

    def accuracy() -> float:
        return trainer.validate(module, datamodule=datamodule, verbose=False)[0]["val/acc"]

    print(f"stored features: {accuracy():.4f}", flush=True)
    for seed in range(draws):
        # the layer's own draw (its settings), from a seeded generator rather than the training stream,
        # so the probe prints the same figures whatever state the checkpoint left that stream in
        g = torch.Generator().manual_seed(1000 + seed)
        for layer in layers:
            layer.features = orthogonal_gaussian(layer.nb_features, layer.head_dim,
                                                 lambda shape, dtype: torch.randn(shape, generator=g, dtype=dtype),
                                                 layer.orthogonal)
        print(f"fresh draw {seed}: {accuracy():.4f}", flush=True)


if __name__ == "__main__":
    main(sys.argv[1], int(sys.argv[2]) if len(sys.argv) > 2 else 4)
