"""A newcomer's second day (issue 28): what the first pass missed. In-process checks of the new
guards (fast), then the user-facing ones through ``run.py`` (slow): ``--help``, warnings for legal
settings that mean less than they seem, a dry run kept out of the report, files that follow the
umask, and W&B failing when its run starts (a local server that refuses the key).

The mistakes that exit 2 before any work are cases of tests/training/test_user_errors.py; the
Ctrl-C and resumable-generation cases are in tests/data/test_generation_stops.py.
"""
from __future__ import annotations

import http.server
import json
import os
import re
import socket
import stat
import threading
from pathlib import Path

import pytest

from lra.badinput import ConfigError
from lra.files import write_json
from lra.training.devices import check_devices
from lra.training.hydra_callbacks import STATUS_FILE, summarize
from lra.training.usage import usage
from lra.checks.build import _check_batch_fits, check_build
from lra.checks.config import check_config
from lra.checks.overrides import check_overrides, suggest
from lra.training.wandb_check import check_wandb, explain
from tests.conftest import ROOT, TINY_LISTOPS, run_cli
from tests.training.test_config import compose_run

CPU = {"cuda": 0, "mps": False, "cuda_build": False, "cores": 2, "bf16": False}
TWO_GPUS = {"cuda": 2, "mps": False, "cuda_build": True, "cores": 16, "bf16": True}
TRAINER = {"accelerator": "auto", "devices": 1, "precision": "32-true"}
DDP = {**TRAINER, "strategy": "ddp", "use_distributed_sampler": False}


# ----------------------------------------------------------------------------- devices (fake hardware)
@pytest.mark.parametrize("settings,hw,needle", [
    ({"accelerator": "gpu"}, CPU, "trainer.accelerator=gpu but this torch is a CPU-only build"),
    ({"accelerator": "cuda"}, {**CPU, "cuda_build": True}, "no CUDA GPU is visible"),
    ({"accelerator": "gpuu"}, CPU, "did you mean trainer.accelerator=gpu"),
    ({"devices": 4}, CPU, "trainer.devices=4 starts 4 ranks, which needs trainer=ddp"),
    ({"devices": 2, "strategy": "ddp"}, CPU, "use_distributed_sampler=false"),  # ddp by hand, sampler left on
    ({**DDP, "devices": 2, "num_nodes": 2, "strategy": "fsdp"}, TWO_GPUS, "x trainer.num_nodes=2 starts 4 ranks"),
    ({"accelerator": "gpu", "devices": 4}, TWO_GPUS, "this machine has 2 GPU(s)"),
    ({"accelerator": "gpu", "devices": [0, 3]}, TWO_GPUS, "names GPU 3"),
    ({"devices": 0}, CPU, "trainer.devices=0 is invalid"),
    ({"precision": 16}, CPU, "trainer.precision=16 asks for float16 mixed precision, which does not run on CPU"),
    ({"precision": "16-mixed", "accelerator": "cpu"}, TWO_GPUS, "bf16-mixed on CPU"),
    ({"precision": "17"}, CPU, "unknown trainer.precision='17'"),
])
def test_device_settings_this_machine_cannot_run(settings, hw, needle):
    with pytest.raises(ConfigError) as info:
        check_devices({**TRAINER, **settings}, hw)
    assert needle in str(info.value)


def test_device_settings_that_run():
    assert check_devices(TRAINER, CPU) == []
    assert check_devices({**TRAINER, "precision": "bf16-mixed"}, CPU) == []
    assert check_devices({**TRAINER, "precision": 16}, TWO_GPUS) == []  # fp16 AMP on the GPU ("auto")
    assert check_devices({**DDP, "accelerator": "gpu", "devices": 2}, TWO_GPUS) == []
    assert check_devices({**DDP, "devices": 2}, CPU) == []
    (warning,) = check_devices({**DDP, "devices": 4}, CPU)
    assert "4 ranks on 2 CPU cores" in warning


# ----------------------------------------------------------------------------- names and values
def test_a_bad_value_is_named_as_the_user_wrote_it(tmp_path):
    with pytest.raises(ConfigError) as info:
        check_config(compose_run("task.val_every=0", f"paths.results_dir={tmp_path}/r", f"paths.checkpoint_dir={tmp_path}/c"))
    text = str(info.value)
    assert text.startswith("task.val_every=0 is invalid") and "it sets trainer.val_check_interval" in text
    assert "e.g. task.val_every=50" in text and "trainer.val_check_interval=0" not in text


def test_threads_zero_is_refused_once_in_every_mode(tmp_path):
    for mode in ("train", "bench"):
        with pytest.raises(ConfigError) as info:
            check_config(compose_run(f"mode={mode}", "threads=0", f"paths.results_dir={tmp_path}/r",
                                     f"paths.checkpoint_dir={tmp_path}/c"))
        assert str(info.value).count("threads=0 is invalid") == 1  # bench.threads=${threads} is not a second problem


def test_suggestions_compare_the_last_part_of_a_name():
    keys = ["trainer.limit_val_batches", "trainer.max_steps", "optim.lr", "seed", "task.max_len"]
    assert suggest("trainer.accumulate_grad_batches", keys) is None  # was: trainer.limit_val_batches
    assert suggest("trainer.max_step", keys) == "trainer.max_steps"
    assert suggest("model.max_len", keys) == "task.max_len"
    assert suggest("sed", keys) == "seed"


@pytest.mark.parametrize("overrides,needle", [
    (["trainer.gradient_clip_val=-1"], "would do nothing"),
    (["trainer.gradient_clip_val=0"], "would do nothing"),
    (["+trainer.accumulate_grad_batches=0"], "trainer.accumulate_grad_batches=0 is invalid"),
])
def test_settings_that_mean_nothing_are_refused(overrides, needle, tmp_path):
    with pytest.raises(ConfigError, match=re.escape(needle)):
        check_config(compose_run(*overrides, f"paths.results_dir={tmp_path}/r", f"paths.checkpoint_dir={tmp_path}/c"))


def test_variant_settings_that_mean_nothing_are_refused(tmp_path):
    """The variant's own word (Mixer.setting_problems), said by the build stage."""
    with pytest.raises(ConfigError, match=re.escape("no sliding window")):
        check_build(compose_run("attention=longformer", "attention.window=1", f"paths.data_dir={tmp_path}"))


@pytest.mark.parametrize("compare", ["[adamra]", "[adamra,adamra]"])
def test_report_settings_that_mean_nothing_are_refused(compare, tmp_path):
    from lra.report.arguments import check_report_config

    with pytest.raises(ConfigError, match=re.escape("two different variants")):
        check_report_config(compose_run("mode=report", f"report.compare={compare}", f"paths.results_dir={tmp_path}/r"))


@pytest.mark.parametrize("overrides,needle", [
    (["attention=reformer", "attention.bucket_size=4096"], "attention.bucket_size=4096 >= task.max_len=2000"),
    (["attention=local", "attention.block_size=2048"], "one block holds every token"),
    (["attention=local", "attention.window=0"], "block-diagonal"),
    (["attention=longformer", "task.max_len=64"], "longformer is full attention here"),
    (["trainer.fast_dev_run=true"], "mode=dry_run"),
])
def test_legal_settings_that_turn_a_run_into_another_are_warned(overrides, needle, tmp_path):
    """The variants' warnings (Mixer.setting_warnings) come from the build stage, the others from the config stage."""
    cfg = compose_run(*overrides, "trainer.max_steps=5000", f"paths.results_dir={tmp_path}/r",
                      f"paths.checkpoint_dir={tmp_path}/c", f"paths.data_dir={tmp_path}/d")
    found = check_config(cfg) + (check_build(cfg) if overrides[0].startswith("attention=") else [])
    assert any(needle in w for w in found), found


def test_a_lightning_trainer_setting_gets_the_plus_not_a_wrong_name():
    with pytest.raises(ConfigError) as info:
        check_overrides(["trainer.accumulate_grad_batches=2"], ROOT / "conf")
    assert "is a Lightning Trainer setting" in str(info.value) and "+trainer.accumulate_grad_batches=2" in str(info.value)
    assert "did you mean" not in str(info.value)


def test_batch_larger_than_the_training_set(tmp_path):
    from hydra.utils import instantiate

    cfg = compose_run(*TINY_LISTOPS, "task.batch_size=201", f"paths.data_dir={tmp_path}")
    with pytest.raises(ConfigError, match=r"task.batch_size=201 is larger than the training set \(200 examples"):
        _check_batch_fits(cfg, instantiate(cfg.task.datamodule))
    cfg = compose_run(*TINY_LISTOPS, "task.batch_size=200", f"paths.data_dir={tmp_path}")
    _check_batch_fits(cfg, instantiate(cfg.task.datamodule))  # the whole set per step: legal


def _wandb_cfg():
    return compose_run("logger=wandb")


@pytest.fixture
def wandb_online(tmp_path, monkeypatch):
    """W&B online, pointed at 127.0.0.1 only, with no login of the machine's user visible."""
    for key in ("WANDB_API_KEY", "WANDB_IDENTITY_TOKEN_FILE", "HTTP_PROXY", "http_proxy", "ALL_PROXY", "all_proxy"):
        monkeypatch.delenv(key, raising=False)
    closed = socket.socket()  # bound, never listening: refused at once
    closed.bind(("127.0.0.1", 0))
    monkeypatch.setenv("WANDB_MODE", "online")
    monkeypatch.setenv("WANDB_BASE_URL", f"http://127.0.0.1:{closed.getsockname()[1]}")
    monkeypatch.setenv("HOME", str(tmp_path))
    monkeypatch.setenv("WANDB_CONFIG_DIR", str(tmp_path / "wandb-config"))
    monkeypatch.setenv("NETRC", str(tmp_path / "netrc"))
    yield tmp_path
    closed.close()


@pytest.mark.slow
def test_wandb_online_needs_a_key_and_a_server(wandb_online, monkeypatch):
    with pytest.raises(ConfigError, match="no W&B API key is set.*WANDB_MODE=offline"):
        check_wandb(_wandb_cfg())
    netloc = os.environ["WANDB_BASE_URL"].split("//", 1)[1]  # W&B's netrc machine is the URL's host:port
    (wandb_online / "netrc").write_text(f"machine {netloc} login user password {'k' * 40}\n")
    with pytest.raises(ConfigError, match="cannot reach the W&B server http://127.0.0.1:.*Connection refused.*WANDB_MODE=offline"):
        check_wandb(_wandb_cfg())
    monkeypatch.setenv("WANDB_MODE", "offline")
    check_wandb(_wandb_cfg())  # offline: nothing to reach
    monkeypatch.setenv("WANDB_MODE", "online")
    check_wandb(compose_run("logger=csv"))


def test_ckpt_path_folder_lists_its_checkpoints(tmp_path):
    (tmp_path / "run").mkdir()
    for name in ("best-100.ckpt", "last.ckpt"):
        (tmp_path / "run" / name).write_bytes(b"")
    with pytest.raises(ConfigError) as info:
        check_config(compose_run("mode=test", f"ckpt_path={tmp_path}/run", f"paths.results_dir={tmp_path}/r",
                                 f"paths.checkpoint_dir={tmp_path}/c"))
    assert "is a folder" in str(info.value) and f"ckpt_path={tmp_path}/run/last.ckpt" in str(info.value)


def test_sweep_summary_counts_skipped_jobs_apart(tmp_path):
    for num, status in enumerate(("finished", "skipped", "skipped")):
        (tmp_path / f"{num}" / ".hydra").mkdir(parents=True)
        write_json(tmp_path / f"{num}" / STATUS_FILE, {"num": num, "status": status, "error": None, "overrides": []})
    jobs, text = summarize(tmp_path)
    assert text.splitlines()[0].startswith("[sweep] 3 jobs: 1 finished, 2 skipped (already finished), 0 failed")


def test_help_lists_modes_presets_choices_and_first_commands():
    text = usage(ROOT / "conf")
    for needle in ("mode=...", "train ", "test ", "bench ", "report ", "experiment=...", "quick ", "xiong2021 ",
                   "python run.py experiment=quick attention=adamra task=listops", "python run.py mode=report",
                   "attention= ", "adamra", "task= ", "pathfinder", "+pretrain= causal, mlm", "--hydra-help"):
        assert needle in text, needle


def test_wandb_errors_become_one_paragraph_with_the_offline_hint():
    wandb_error = type("CommError", (Exception,), {"__module__": "wandb.errors.errors"})
    got = explain(wandb_error("returned error 401: invalid api key\nmore"))
    assert got is not None and "CommError: returned error 401" in str(got) and "WANDB_MODE=offline" in str(got)
    assert explain(RuntimeError("a bug")) is None


# ----------------------------------------------------------------------------- files and the umask
@pytest.mark.parametrize("mask", [0o022, 0o027, 0o077])
def test_atomic_writes_follow_the_umask(tmp_path, mask):
    old = os.umask(mask)
    try:
        write_json(tmp_path / "record.json", {"a": 1})
        (tmp_path / "plain").write_text("")  # what open() gives
    finally:
        os.umask(old)
    assert stat.S_IMODE((tmp_path / "record.json").stat().st_mode) == stat.S_IMODE((tmp_path / "plain").stat().st_mode) == 0o666 & ~mask


# ----------------------------------------------------------------------------- through run.py
def _records(cwd: Path) -> list[dict]:
    return [json.loads(p.read_text()) for p in sorted((cwd / "results" / "runs").glob("*.json"))]


@pytest.mark.slow
def test_help_through_run_py(cli):
    proc = cli("--help")
    assert proc.stdout.startswith("usage: python run.py") and "Presets (experiment=...)" in proc.stdout
    assert "== Config ==" not in proc.stdout  # not Hydra's generic help


@pytest.mark.slow
def test_warnings_dry_run_and_group_readable_files(cli):
    """Under umask 027 every file the suite writes is 0640 (group-readable, as checkpoints always
    were), a dry run warns and stays out of the report, legal-but-degenerate settings are warned."""
    old = os.umask(0o027)
    try:
        cli(*TINY_LISTOPS, "trainer.max_steps=2")
        dry = cli(*TINY_LISTOPS, "trainer.max_steps=2", "trainer.fast_dev_run=true", "attention=local",
                  "attention.window=0")
        cli("mode=report")
    finally:
        os.umask(old)
    said = dry.stdout + dry.stderr
    assert "trainer.fast_dev_run is on: a dry run" in said and "attention.window=0: local attention without overlap" in said
    assert "attention.block_size=64 >= task.max_len=64" in said
    (run,) = [r for r in _records(cli.cwd) if r["mode"] == "train"]
    (dry_run,) = [r for r in _records(cli.cwd) if r["mode"] == "dry_run"]
    assert run["status"] == dry_run["status"] == "finished"
    from lra.report.cells import accuracy_groups
    from lra.report.screening import screen

    runs, ledger = screen(cli.cwd / "results", "test_acc")
    used = [r.rec["run_id"] for g in accuracy_groups(runs, ledger) for per in g.rows.values()
            for cell in per.values() for r in cell.runs.values()]
    assert used == [run["run_id"]]
    assert [e.reason for e in ledger.excluded if dry_run["run_id"] in e.file][0].startswith("mode=dry_run")
    written = [p for folder in ("results", "data") for p in (cli.cwd / folder).rglob("*")
               if p.is_file() and not p.name.endswith(".lock")]
    modes = {str(p.relative_to(cli.cwd)): oct(stat.S_IMODE(p.stat().st_mode)) for p in written}
    for kind in ("runs/", ".preds.npz", "report.md", "plots/", "tables/", "basic_train.tsv", "train_ids.npy"):
        assert any(kind in name for name in modes), (kind, sorted(modes))
    assert set(modes.values()) == {"0o640"}, modes


class _RefusesEveryKey(http.server.BaseHTTPRequestHandler):
    def _refuse(self) -> None:
        self.rfile.read(int(self.headers.get("Content-Length") or 0))
        body = b'{"errors":[{"message":"invalid api key"}]}'
        self.send_response(401)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    do_GET = do_POST = do_PUT = _refuse

    def log_message(self, *args) -> None:
        pass


@pytest.mark.slow
def test_wandb_rejecting_the_key_gives_one_paragraph(cli):
    """W&B's own failure when its run starts (after data preparation): a server on 127.0.0.1 that
    answers 401 to everything stands in for a rejected key."""
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _RefusesEveryKey)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        proc = cli(*TINY_LISTOPS, "trainer.max_steps=2", "logger=wandb", check=False,
                   env={"WANDB_MODE": "online", "WANDB_BASE_URL": f"http://127.0.0.1:{server.server_address[1]}",
                        "WANDB_API_KEY": "k" * 40, "HOME": str(cli.cwd), "WANDB_CONFIG_DIR": str(cli.cwd / "wandb-config"),
                        "NETRC": str(cli.cwd / "no-netrc"), "WANDB_INIT_TIMEOUT": "60"})
    finally:
        server.shutdown()
    assert proc.returncode == 2, proc.stderr[-3000:]
    assert "Traceback" not in proc.stderr
    (line,) = [ln for ln in proc.stderr.splitlines() if ln.startswith("error: ")]
    assert line.startswith("error: W&B could not start the run (") and "401" in line and "WANDB_MODE=offline" in line
    (rec,) = _records(cli.cwd)
    assert rec["status"] == "failed"
