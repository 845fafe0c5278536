"""``python run.py --help``: the modes, the presets, the choices of each config group and the three
commands a newcomer needs, read from ``conf/`` (a new preset or variant appears without an edit
here). Hydra's own help stays at ``--hydra-help``."""
from __future__ import annotations

import re
import textwrap
from pathlib import Path

HELP_FLAGS = ("--help", "-h")
MODE_HELP = {  # every mode of lra.checks.config.MODES, in its order (a test keeps them equal)
    "train": "fit, then test the best-validation checkpoint (the default)",
    "test": "evaluate a trained checkpoint: ckpt_path=<checkpoint_dir>/<run id>/best-<step>.ckpt",
    "bench": "speed and peak memory of one training step or block (no data needed)",
    "report": "tables and plots (accuracy, speed/memory, SMAT) from the run records in results/",
    "check": "the attention contract on one variant in seconds: the first command after writing one",
    "fetch": "download, verify and prepare a task's real data: task=text|image|retrieval|listops|pathfinder|all",
}
FIRST_STEPS = (
    ("python run.py experiment=quick attention=adamra task=listops", "a first run: learns in about a minute on a CPU"),
    ("python run.py -m experiment=quick attention=softmax,adamra task=listops", "a sweep: one run per combination"),
    ("python run.py mode=report", "tables and plots of every finished run"),
)
GROUPS = ("attention", "task", "model", "trainer", "logger")
SUMMARY_CHARS = 84


def wants_help(argv: list[str]) -> bool:
    return any(a in HELP_FLAGS for a in argv)


def _preset_summary(path: Path) -> str:
    """The first sentence of the preset file's leading comment."""
    lines = []
    for line in path.read_text().splitlines():
        if not line.startswith("#"):
            break
        if "@package" not in line:
            lines.append(line.lstrip("# ").strip())
    sentence = re.split(r"(?<!\bal)(?<!\beq)(?<!\be\.g)\.\s", " ".join(lines) + " ", maxsplit=1)[0].strip()
    return sentence if len(sentence) <= SUMMARY_CHARS else sentence[:SUMMARY_CHARS].rsplit(" ", 1)[0].rstrip(",;:") + " ..."


def _choices(conf_dir: Path, group: str) -> list[str]:
    return sorted(p.stem for p in (conf_dir / group).glob("*.yaml"))


def _wrapped(label: str, items: list[str], width: int = 100) -> str:
    return textwrap.fill(", ".join(items), width=width, initial_indent=f"  {label:<11}",
                         subsequent_indent=" " * 13)


def usage(conf_dir: Path) -> str:
    out = ["usage: python run.py [-m] [KEY=VALUE ...]",
           "",
           "One run of one attention variant on one LRA task (Hydra: every setting is KEY=VALUE; -m sweeps",
           "over comma-separated values). Mistakes are reported before any work, as one 'error:' line.",
           "",
           "Start here:"]
    width = max(len(cmd) for cmd, _ in FIRST_STEPS)
    out += [f"  {cmd:<{width}}  # {what}" for cmd, what in FIRST_STEPS]
    out += ["", "Modes (mode=...):"]
    out += [f"  {m:<8} {what}" for m, what in MODE_HELP.items()]
    out += ["", "Presets (experiment=...):"]
    presets = sorted((conf_dir / "experiment").glob("*.yaml"))
    pw = max((len(p.stem) for p in presets), default=0)
    out += [f"  {p.stem:<{pw}}  {_preset_summary(p)}" for p in presets]
    out += ["", "Choices:"]
    out += [_wrapped(f"{g}=", _choices(conf_dir, g)) for g in GROUPS if (conf_dir / g).is_dir()]
    if (conf_dir / "pretrain").is_dir():  # an added group: self-pretraining before the fine-tune
        out += [_wrapped("+pretrain=", _choices(conf_dir, "pretrain"))
                + "  (pretrain on the task's training split first: docs/pretraining.md)"]
    out += ["",
            "Settings: any key of the composed config, e.g. trainer.max_steps=20 task.max_len=1000 seed=1",
            "  (python run.py --cfg job prints them all for a command). Folders: data $LRA_DATA_DIR (./data),",
            "  records $LRA_RESULTS_DIR (./results), checkpoints $LRA_CHECKPOINT_DIR (./checkpoints).",
            "More: README.md. Hydra's own options: python run.py --hydra-help."]
    return "\n".join(out)
