"""Bad input as a user meets it: ``python run.py ...`` exits non-zero with one paragraph that names
the problem and the fix, and no traceback; found before any data is prepared.

Most cases run through ``tests/bad_inputs_runner.py`` (one interpreter, a forked child per case, so
torch and Lightning are imported once); a few run as real ``python run.py`` subprocesses.
"""
from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.conftest import ROOT, TINY_LISTOPS, run_cli

pytestmark = pytest.mark.slow
TINY = [*TINY_LISTOPS, "trainer.max_steps=2"]  # should a case wrongly pass, it trains for seconds only
BASE = ["logger=none", "model=tiny", "trainer.max_steps=2"]
USER_ERROR = 2


def case(id_: str, args: list[str], *expect: str, rc: int = USER_ERROR, **extra) -> dict:
    return {"id": id_, "args": args, "expect": list(expect), "rc": rc, **extra}


# Files the cases point at; created under the shared working folder before the runner starts.
BLOCKER, GARBAGE_CKPT, CKPT_FOLDER = "blocker", "garbage.ckpt", "run-checkpoints"
# W&B online against 127.0.0.1 only: a port that is bound but never listened on refuses at once; HOME and
# the W&B settings folder are the (empty) working folder, so no real login is read.
CLOSED_PORT = "{closed_port}"
WANDB_ONLINE = {"WANDB_MODE": "online", "WANDB_BASE_URL": f"http://127.0.0.1:{CLOSED_PORT}", "HOME": "{work}",
                "WANDB_CONFIG_DIR": "{work}/wandb-config", "NETRC": "{work}/no-netrc"}

CASES = [
    # -- values of the wrong type or out of range (stage 2: no torch needed) -------------------------
    case("seed-text", [*TINY, "seed=abc"], "seed='abc'", "whole number", "seed=0"),
    case("seed-negative", [*TINY, "seed=-1"], "seed=-1", ">= 0"),
    case("lr-text", [*TINY, "optim.lr=abc"], "optim.lr='abc'", "must be a number > 0", "optim.lr=1e-4"),
    case("lr-negative", [*TINY, "optim.lr=-1"], "optim.lr=-1", "> 0"),
    case("lr-zero", [*TINY, "optim.lr=0"], "optim.lr=0", "> 0"),
    case("weight-decay-negative", [*TINY, "optim.weight_decay=-0.1"], "optim.weight_decay=-0.1", ">= 0"),
    case("betas-out-of-range", [*TINY, "optim.betas=[0.9,1.5]"], "optim.betas=[0.9, 1.5]", "[0, 1)"),
    case("schedule-unknown", [*TINY, "optim.schedule=cosin"], "optim.schedule='cosin'", "did you mean optim.schedule=cosine"),
    case("warmup-negative", [*TINY, "optim.warmup_steps=-5"], "optim.warmup_steps=-5", ">= 0"),
    case("max-steps-zero", [*TINY, "trainer.max_steps=0"], "trainer.max_steps=0", "untrained model", "trainer.max_steps=5000"),
    case("max-steps-unlimited", [*TINY, "trainer.max_steps=-1"], "trainer.max_steps=-1", "without an end"),
    case("max-steps-fraction", [*TINY, "trainer.max_steps=2.5"], "trainer.max_steps=2.5", "whole number"),
    case("checkpoint-every-zero", [*TINY, "checkpointing.every_n_steps=0"], "checkpointing.every_n_steps=0",
         "cannot resume", "null"),
    case("checkpoint-minutes-negative", [*TINY, "checkpointing.every_minutes=-1"], "checkpointing.every_minutes=-1", "> 0"),
    case("dropout-above-one", [*TINY, "model.dropout=1.5"], "model.dropout=1.5", "[0, 1)"),
    case("dropout-negative", [*TINY, "model.dropout=-0.1"], "model.dropout=-0.1", "[0, 1)"),
    case("attention-dropout", [*TINY, "attention.dropout=2"], "attention.dropout=2", "[0, 1)"),
    # -- an attention variant's own settings, typed by its class's signature (lra/checks/variant_settings.py)
    case("attention-eps-text", [*TINY, "attention=linear", "attention.eps=tiny"], "attention.eps='tiny'",
         "must be a number", "attention.eps=1e-06"),
    case("adamra-rates-scalar", [*TINY, "attention=adamra", "attention.rates=0.5"], "attention.rates=0.5",
         "must be a list of numbers", "attention.rates=[0.5,0.125,0.03125]"),
    case("variant-check-setting", ["mode=check", "attention=sparse", "attention.stride=x"], "attention.stride='x'",
         "whole number or null"),
    case("d-model-zero", [*TINY, "model.d_model=0"], "model.d_model=0", ">= 1"),
    case("max-len-zero", [*TINY, "task.max_len=0"], "task.max_len=0", ">= 1"),
    case("batch-size-negative", [*TINY, "task.batch_size=-4"], "task.batch_size=-4", ">= 1"),
    case("two-problems-at-once", [*TINY, "seed=abc", "optim.lr=abc"], "seed='abc'", "optim.lr='abc'"),
    case("resume-invalid", [*TINY, "resume=maybe"], "resume='maybe'", "resume=auto"),
    case("test-without-checkpoint", [*TINY, "mode=test"], "mode=test", "ckpt_path="),
    case("bench-repeats-zero", ["mode=bench", "bench.repeats=0"], "bench.repeats=0", ">= 1"),
    # -- self-pretraining (+pretrain=mlm|causal; lra/training/pretrain.py) ----------------------------
    case("pretrain-preset-unknown", [*TINY, "+pretrain=mlmm"], "unknown +pretrain=mlmm", "did you mean +pretrain=mlm"),
    case("pretrain-mask-ratio-one", [*TINY, "+pretrain=mlm", "pretrain.mask_ratio=1"], "pretrain.mask_ratio=1 is invalid",
         "(0, 1)", "pretrain.mask_ratio=0.5"),
    case("pretrain-mask-ratio-zero", [*TINY, "+pretrain=mlm", "pretrain.mask_ratio=0"], "pretrain.mask_ratio=0 is invalid"),
    case("pretrain-steps-negative", [*TINY, "+pretrain=mlm", "pretrain.max_steps=-5"], "pretrain.max_steps=-5 is invalid",
         ">= 1"),
    case("pretrain-objective-unknown", [*TINY, "+pretrain=mlm", "pretrain.objective=bert"],
         "unknown pretrain.objective='bert'", "+pretrain=causal"),
    case("pretrain-causal-bidirectional", [*TINY, "+pretrain=causal", "attention=adamra"], "pretrain.objective=causal",
         "attention=adamra", "+pretrain=mlm"),
    case("pretrain-key-typo", [*TINY, "+pretrain=mlm", "pretrain.mask_rato=0.3"], "unknown setting pretrain.mask_rato",
         "did you mean pretrain.mask_ratio"),
    case("ablation-of-another-attention", [*TINY, "attention=softmax", "+ablation=linear_unnormalised"],
         "ablation=linear_unnormalised is an ablation of attention=linear", "drop attention=softmax"),
    case("preset-ablation-of-another-attention", [*TINY, "experiment=adamra_ablation", "attention=linear"],
         "ablation=adamra_t4_id3 is an ablation of attention=adamra", "drop attention=linear"),
    # -- unknown names (stage 1, before Hydra composes) --------------------------------------------------
    case("typo-setting", [*TINY, "trainer.max_step=5"], "trainer.max_step", "did you mean trainer.max_steps", "+trainer.max_step=5"),
    case("typo-optim", [*TINY, "optim.lrr=1e-3"], "optim.lrr", "did you mean optim.lr?"),
    case("typo-top-level", [*TINY, "sed=1"], "unknown setting sed", "did you mean seed?"),
    case("typo-task", [*BASE, "task=txt"], "task=txt", "did you mean task=text"),
    case("typo-attention", [*TINY, "attention=softmaxx"], "'attention/softmaxx'", "Available options", "did you mean attention=softmax"),
    case("typo-mode", [*TINY, "mode=tran"], "mode='tran'", "did you mean mode=train"),
    case("typo-in-sweep", ["-m", *TINY, "task=listops,listop"], "task=listop", "did you mean task=listops"),
    # -- keys added with '+' (stage 3: compared with what is built) ------------------------------------
    case("appended-trainer-typo", [*TINY, "+trainer.max_step=5"], "trainer.max_step", "did you mean trainer.max_steps"),
    case("appended-optim-typo", [*TINY, "+optim.lrr=1e-3"], "optim.lrr", "did you mean optim.lr"),
    # -- values only the built objects can judge (stage 3) ------------------------------------------------
    case("heads-do-not-divide", [*TINY, "model.n_heads=3"], "model.n_heads=3", "divisors"),
    case("pool-unknown", [*TINY, "model.pool=max"], "model.pool='max'", "mean"),
    case("source-unknown", [*TINY, "task.datamodule.source=generat"], "task.datamodule.source='generat'", "generate, official"),
    case("image-max-len", [*BASE, "task=image", "task.max_len=100"], "task.max_len=100", "1024"),
    case("pathfinder-resolution", [*BASE, "task=pathfinder", "task.resolution=48"], "task.resolution=48", "32, 64, 128, 256"),
    # -- missing data, checkpoints, folders --------------------------------------------------------------
    case("text-missing", [*BASE, "task=text"], "'imdb_reviews'", "does not exist", "tfds build imdb_reviews", "aclImdb_v1.tar.gz"),
    case("image-missing", [*BASE, "task=image"], "'cifar10'", "does not exist", "tfds build cifar10", "cifar-10-python.tar.gz"),
    case("retrieval-missing", [*BASE, "task=retrieval"], "AAN retrieval files missing", "new_aan_pairs.train.tsv", "lra_release"),
    case("listops-official-missing", [*TINY, "task.datamodule.source=official"], "ListOps official files missing",
         "basic_train.tsv", "task.datamodule.source=generate"),
    case("pathfinder-official-missing", [*BASE, "task=pathfinder", "task.datamodule.source=official"],
         "Pathfinder release folder missing", "official_dir"),
    case("checkpoint-missing", [*TINY, "mode=test", "ckpt_path=nowhere.ckpt"], "ckpt_path=nowhere.ckpt", "does not exist"),
    case("checkpoint-garbage", [*TINY, "mode=test", f"ckpt_path={GARBAGE_CKPT}"], GARBAGE_CKPT,
         "not a readable Lightning checkpoint"),
    case("results-dir-unwritable", [*TINY, f"paths.results_dir={BLOCKER}/results"], "results dir", "cannot be created",
         "LRA_RESULTS_DIR"),
    case("checkpoint-dir-unwritable", [*TINY, f"paths.checkpoint_dir={BLOCKER}/ckpt"], "checkpoint dir", "LRA_CHECKPOINT_DIR"),
    case("report-dir-unwritable", ["mode=report", f"report.out_dir={BLOCKER}/report"], "report out dir", "report.out_dir"),
    # -- sweeps -----------------------------------------------------------------------------------------
    case("sweep-unwritable-results", ["-m", *TINY, "seed=0,1", f"paths.results_dir={BLOCKER}/results"],
         "results dir", "cannot be created"),
    case("sweep-all-jobs-fail", ["-m", *TINY, "optim.lr=-1,abc"], "[sweep] 2 jobs: 0 finished, 2 failed",
         "failed: job 0", "optim.lr=-1", "failed: job 1", rc=1),
    # -- a newcomer's second day (issue 28): devices, settings that mean nothing, bench, report, W&B ------
    case("threads-zero", [*TINY, "threads=0"], "threads=0", "whole number >= 1 or null", "threads=1"),
    case("devices-without-ddp", [*TINY, "trainer.devices=4"], "trainer.devices=4 starts 4 ranks", "trainer=ddp",
         "python run.py trainer=ddp trainer.devices=4"),
    case("gpu-without-gpu", [*TINY, "trainer.accelerator=gpu"], "trainer.accelerator=gpu", "torch.cuda.is_available()",
         "trainer.accelerator=cpu"),
    case("fp16-on-cpu", [*TINY, "trainer.precision=16"], "trainer.precision=16", "bf16-mixed", "does not run on CPU"),
    case("val-every-zero", [*TINY, "task.val_every=0"], "task.val_every=0 is invalid", "it sets trainer.val_check_interval",
         "task.val_every=50"),
    case("accumulate-without-plus", [*TINY, "trainer.accumulate_grad_batches=2"],
         "Lightning Trainer setting", "+trainer.accumulate_grad_batches=2"),
    case("accumulate-zero", [*TINY, "+trainer.accumulate_grad_batches=0"], "trainer.accumulate_grad_batches=0", ">= 1"),
    case("gradient-clip-negative", [*TINY, "trainer.gradient_clip_val=-1"], "trainer.gradient_clip_val=-1",
         "would do nothing", "null"),
    case("batch-larger-than-train-set", [*TINY, "task.batch_size=512"], "task.batch_size=512",
         "larger than the training set (200 examples"),
    case("longformer-window-zero", [*TINY, "attention=longformer", "attention.window=0"], "attention.window=0",
         "no sliding window", "attention.window=128"),
    case("checkpoint-is-a-folder", [*TINY, "mode=test", f"ckpt_path={CKPT_FOLDER}"], f"ckpt_path={CKPT_FOLDER} is a folder",
         "last.ckpt"),
    case("report-compare-one-name", ["mode=report", "report.compare=[adamra]"], "report.compare=['adamra']",
         "two different variants", "report.compare=[adamra,linear]"),
    case("bench-length-zero", ["mode=bench", "bench.lengths=[0]"], "bench.lengths=[0]", "bench.lengths=[1024,2048,4096]"),
    case("bench-protocol-typo", ["mode=bench", "bench.protocol=tabel2"], "bench.protocol='tabel2'",
         "did you mean bench.protocol=table2"),
    case("bench-batch-negative", ["mode=bench", "bench.batch_size=-1"], "bench.batch_size=-1", ">= 1"),
    case("bench-cuda-without-gpu", ["mode=bench", "bench.device=cuda"], "bench.device=cuda", "bench.device=auto"),
    case("wandb-online-without-key", [*TINY, "logger=wandb"], "no W&B API key", "WANDB_MODE=offline",
         env={**WANDB_ONLINE, "WANDB_API_KEY": ""}),
    case("wandb-online-without-network", [*TINY, "logger=wandb"], "cannot reach the W&B server http://127.0.0.1:",
         "Connection refused", "WANDB_MODE=offline", env={**WANDB_ONLINE, "WANDB_API_KEY": "k" * 40}),
    # -- the traceback stays available, and bugs keep theirs ----------------------------------------------
    case("full-error-shows-trace", [*TINY, "seed=abc"], "Traceback", "ConfigError", rc=1, env={"HYDRA_FULL_ERROR": "1"},
         traceback=True),
    case("unexpected-error-keeps-trace", [*TINY], "Traceback", "RuntimeError: an injected bug", rc=1, inject_bug=True,
         traceback=True),
]


@pytest.fixture(scope="module")
def outcomes(tmp_path_factory) -> dict[str, dict]:
    work = tmp_path_factory.mktemp("bad_inputs")
    (work / BLOCKER).write_text("a file where a folder is expected")
    (work / GARBAGE_CKPT).write_bytes(b"not a checkpoint")
    (work / CKPT_FOLDER).mkdir()
    (work / CKPT_FOLDER / "last.ckpt").write_bytes(b"")
    closed = socket.socket()  # bound, never listening: a connection to it is refused (held open until the end)
    closed.bind(("127.0.0.1", 0))
    fill = {"closed_port": str(closed.getsockname()[1]), "work": str(work)}
    base_env = {"LRA_DATA_DIR": str(work / "data"), "LRA_RESULTS_DIR": str(work / "results"),
                "LRA_CHECKPOINT_DIR": str(work / "checkpoints"), "TFDS_DATA_DIR": str(work / "no_tfds")}
    cases = [{"id": c["id"], "args": c["args"], "cwd": str(work),
              "env": {**base_env, **{k: v.format(**fill) for k, v in c.get("env", {}).items()}},
              "inject_bug": c.get("inject_bug", False)} for c in CASES]
    (work / "cases.json").write_text(json.dumps(cases))
    env = {**os.environ, "WANDB_MODE": "offline", "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1"}
    env.pop("HYDRA_FULL_ERROR", None)
    start = time.perf_counter()
    proc = subprocess.run([sys.executable, "-m", "tests.bad_inputs_runner", str(work / "cases.json"), str(work / "results.json")],
                          cwd=ROOT, env=env, capture_output=True, text=True, timeout=600)
    closed.close()
    assert proc.returncode == 0, proc.stderr[-4000:]
    results = {r["id"]: r for r in json.loads((work / "results.json").read_text())}
    print(f"{len(results)} cases in {time.perf_counter() - start:.1f}s")
    results["_work"] = {"path": str(work)}
    return results


@pytest.mark.parametrize("spec", CASES, ids=[c["id"] for c in CASES])
def test_bad_input_gets_one_clear_paragraph(outcomes, spec):
    got = outcomes[spec["id"]]
    text = got["stderr"] + got["stdout"]
    assert got["rc"] == spec["rc"], (got["rc"], text[-3000:])
    for needle in spec["expect"]:
        assert needle in text, (needle, text[-3000:])
    if not spec.get("traceback"):
        assert "Traceback" not in text and "Error executing job" not in text, text[-3000:]
    if spec["rc"] == USER_ERROR:
        (line,) = [ln for ln in got["stderr"].splitlines() if ln.startswith("error: ")]
        paragraph = got["stderr"][got["stderr"].index(line):].rstrip("\n")
        assert "\n\n" not in paragraph  # one paragraph


def test_no_data_was_prepared(outcomes):
    """Every case failed before any data work: nothing was generated or cached."""
    work = Path(outcomes["_work"]["path"])
    assert (work / "results.json").is_file()
    assert not list(work.rglob("cache-*")) and not list(work.rglob("generated-*")) and not list(work.rglob("*.tsv"))


def test_enough_cases():
    assert len(CASES) >= 30


# -- real subprocesses: the entry point itself ------------------------------------------------------------
def _user_error(proc: subprocess.CompletedProcess) -> str:
    assert proc.returncode == USER_ERROR, (proc.returncode, proc.stderr[-3000:])
    assert "Traceback" not in proc.stderr + proc.stdout
    return proc.stderr


def test_real_run_bad_value_fails_before_heavy_imports(cli):
    """``seed=abc`` is refused by stage 2, before torch is imported (checked with -X importtime)."""
    proc = run_cli(["seed=abc"], cli.cwd, env={"PYTHONPROFILEIMPORTTIME": "1"}, check=False)
    err = _user_error(proc)
    assert "error: seed='abc'" in err
    imported = {line.rsplit("|", 1)[-1].strip() for line in err.splitlines() if line.startswith("import time:")}
    assert "omegaconf" in imported and "torch" not in imported


def test_real_run_missing_text_data(cli):
    proc = run_cli(["task=text", "model=tiny", "logger=none"], cli.cwd, env={"TFDS_DATA_DIR": str(cli.cwd / "tfds")},
                   check=False)
    err = _user_error(proc)
    assert err.startswith("error: tensorflow-datasets dataset 'imdb_reviews'") and "already prepared" not in err
    assert not (cli.cwd / "data" / "text").exists() or not list((cli.cwd / "data" / "text").rglob("cache-*"))


def test_real_sweep_with_unwritable_results_stops_at_once(cli):
    blocker = cli.cwd / "blocker"
    blocker.write_text("")
    proc = run_cli(["-m", *TINY, "seed=0,1", f"paths.results_dir={blocker}/r"], cli.cwd, check=False)
    err = _user_error(proc)
    assert f"{blocker}/r" in err and not list(cli.cwd.glob("multirun/*/*/job_status.json"))
