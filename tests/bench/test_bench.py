"""Efficiency harness: protocol plans, honest per-measurement memory, failure isolation, the CLI."""
from __future__ import annotations

import re

import pytest
import torch
import torch._inductor.config

from attention.base import Mixer
from attention.softmax import SoftmaxAttention
from lra.bench import harness as bench
from lra import footprint
from lra.records import load_records
from tests.graph_safe import SCALAR_CPP

BALLAST_MB = 96


class BallastMixer(Mixer):
    """Softmax that also allocates (and touches) ``mb`` MiB in forward: a known extra peak."""

    def __init__(self, n_heads, head_dim, max_len, layer_idx=0, mb: int = 0, fail_above: int = 0):
        super().__init__(n_heads, head_dim, max_len, layer_idx)
        self.mb, self.fail_above = mb, fail_above
        self.inner = SoftmaxAttention(n_heads, head_dim, max_len, layer_idx)

    def forward(self, q, k, v, mask, x):
        if self.fail_above and q.shape[2] > self.fail_above:
            raise RuntimeError(f"deliberate failure at N={q.shape[2]}")
        out = self.inner(q, k, v, mask, x)
        if self.mb:
            out = out + 0.0 * torch.ones(self.mb * 2**18).sum()
        return out


def compose(*overrides: str):
    from hydra import compose as hydra_compose, initialize_config_dir

    with initialize_config_dir(config_dir=str(bench.CONF_DIR), version_base="1.3"):
        return hydra_compose("config", overrides=["mode=bench", "bench.task=listops", "bench.min_time_s=0", *overrides])


def block_spec(attention: dict, n: int, **kw) -> dict:
    return {"kind": "block", "attention": attention, "batch_size": 2, "repeats": 2, "warmup": 1, "device": "cpu",
            "seed": 0, "threads": 1, "length": n, "d_model": 16, "n_heads": 2, "d_ffn": 32, **kw}


def test_protocol_plans_follow_the_papers():
    meta, specs = bench.plan(compose("attention.dropout=0.3"), "softmax")
    assert meta["kind"] == "train_step" and meta["batch_size"] == 16 and meta["lengths"] == [1024, 2048, 4096]
    assert meta["attention_dropout_forced_to_0"] == ["dropout"]
    assert all(s["attention"]["dropout"] == 0.0 for s in specs)
    assert [s["model"]["max_len"] for s in specs] == [1024, 2048, 4096]
    assert specs[0]["model"]["vocab_size"] == 17 and specs[0]["model"]["num_classes"] == 10  # listops shapes
    assert specs[0]["model"]["d_model"] == 64 and specs[0]["model"]["n_layers"] == 2        # Xiong backbone
    meta, specs = bench.plan(compose("bench.protocol=smat"), "softmax")
    assert (meta["batch_size"], meta["lengths"]) == (8, [4096])
    meta, specs = bench.plan(compose("bench.protocol=block", "bench.lengths=[64,128]", "bench.batch_size=3"), "softmax")
    assert meta["kind"] == "block" and meta["lengths"] == [64, 128] and specs[0]["batch_size"] == 3
    assert (specs[0]["d_model"], specs[0]["n_heads"]) == (64, 2)
    with pytest.raises(ValueError, match="valid: table2, smat, block"):
        bench.plan(compose("bench.protocol=nope"), "softmax")
    with pytest.raises(ValueError, match="no conf/task/nope.yaml"):
        bench.plan(compose("bench.task=nope"), "softmax")


def test_train_step_measurement_in_process():
    _, specs = bench.plan(compose("model=tiny", "bench.lengths=[32]", "bench.repeats=3", "bench.warmup=1",
                                  "bench.threads=1"), "softmax")
    r = bench.measure(specs[0])
    assert r["status"] == "ok", r
    assert len(r["ms_all"]) == 3 and min(r["ms_all"]) == r["ms_min"] <= r["ms"] <= max(r["ms_all"])
    assert r["examples_per_s"] == pytest.approx(16 / (r["ms"] / 1000))
    assert r["tokens_per_s"] == pytest.approx(16 * 32 / (r["ms"] / 1000))
    assert r["parameters"]["attention"] == 4 * (32 * 32 + 32)  # tiny: d 32, 1 layer, softmax has no own params


@pytest.mark.slow
def test_isolated_memory_is_per_measurement_and_honest():
    """A mixer that allocates 96 MiB more must show ~96 MiB more peak; each in a fresh process."""
    target = f"{__name__}.BallastMixer"
    plain = bench.measure_isolated(block_spec({"_target_": target, "_partial_": True, "mb": 0}, 16), timeout_s=240)
    heavy = bench.measure_isolated(block_spec({"_target_": target, "_partial_": True, "mb": BALLAST_MB}, 16), timeout_s=240)
    assert plain["status"] == heavy["status"] == "ok", (plain, heavy)
    assert plain["isolated"] and heavy["isolated"]
    if heavy["memory_method"] != footprint.CPU_RESET:
        pytest.skip(f"peak memory not resettable here ({heavy['memory_method']})")
    extra = heavy["peak_mb"] - plain["peak_mb"]
    assert BALLAST_MB - 8 <= extra <= BALLAST_MB + 16, (plain["peak_mb"], heavy["peak_mb"])
    assert plain["peak_mb"] < 40  # a 16-token block needs little: the interpreter is not counted


def test_failed_length_is_recorded_and_others_go_on():
    attn = {"_target_": f"{__name__}.BallastMixer", "_partial_": True, "fail_above": 16}
    ok, failed = bench.run_specs([block_spec(attn, 16), block_spec(attn, 32)], isolate=False)
    assert ok["status"] == "ok"
    assert failed["status"] == "failed" and "deliberate failure at N=32" in failed["error"]


def test_min_time_extends_the_timed_steps():
    spec = block_spec({"_target_": "attention.softmax.SoftmaxAttention", "_partial_": True}, 16, min_time_s=0.2)
    r = bench.measure(spec)
    assert r["status"] == "ok" and len(r["ms_all"]) > spec["repeats"] and sum(r["ms_all"]) >= 200


def test_rounds_pool_the_steps_and_keep_the_largest_peak():
    def result(steps, peak):
        ms = sorted(steps)[len(steps) // 2]
        return {"status": "ok", "length": 8, "ms": ms, "ms_min": min(steps), "ms_all": steps, "peak_mb": peak,
                "peak_process_mb": peak + 100, "baseline_mb": 100, "examples_per_s": 8000 / ms, "tokens_per_s": 64000 / ms}

    pooled = bench.pool_rounds([result([1.0, 2.0, 9.0], 10.0), result([3.0, 4.0], 12.0)])
    assert pooled["ms"] == 3.0 and pooled["ms_min"] == 1.0 and pooled["ms_all"] == [1.0, 2.0, 9.0, 3.0, 4.0]
    assert pooled["ms_rounds"] == [2.0, 4.0] and pooled["rounds"] == 2
    assert pooled["examples_per_s"] == pytest.approx(8000 / 3.0) and pooled["tokens_per_s"] == pytest.approx(64000 / 3.0)
    assert (pooled["peak_mb"], pooled["peak_process_mb"], pooled["peak_mb_rounds"]) == (12.0, 112.0, [10.0, 12.0])
    failed = bench.pool_rounds([result([1.0], 1.0), {"status": "timeout", "length": 8, "error": "slow"}])
    assert failed["status"] == "timeout" and failed["round"] == 1
    with pytest.raises(ValueError, match="rounds"):
        bench.plan(compose("bench.rounds=0"), "softmax")


def test_ratio_table_is_softmax_over_variant():
    res = {("softmax", 64): {"status": "ok", "ms": 100.0, "peak_mb": 40.0},
           ("linear", 64): {"status": "ok", "ms": 25.0, "peak_mb": 80.0},
           ("softmax", 128): {"status": "ok", "ms": 300.0, "peak_mb": 90.0},
           ("linear", 128): {"status": "oom"}}
    text = bench.ratio_table(["softmax", "linear"], [64, 128], res)
    linear = next(line for line in text.splitlines() if line.startswith("linear"))
    assert "25.0 (4.00x)" in linear and "80.0 (0.50x)" in linear and "oom" in linear


@pytest.mark.slow
def test_cli_side_by_side_writes_records(tmp_path, capsys):
    rc = bench.main(["--protocol", "block", "--variants", "softmax", "--lengths", "16", "32", "--repeats", "1",
                     "--warmup", "0", "--min-time", "0", "--rounds", "2", "--model", "tiny", "--no-isolate", "--threads", "1", "--results-dir", str(tmp_path)])
    out = capsys.readouterr().out
    assert rc == 0
    lines = out.splitlines()
    table = lines[next(i for i, line in enumerate(lines) if line.startswith("variant")):]
    cells = next(line for line in table if line.startswith("softmax")).split()
    assert cells[0] == "softmax" and cells[2:5:2] == ["(1.00x)", "(1.00x)"]  # ms at both lengths, against itself
    records, problems = load_records(tmp_path)
    assert not problems and len(records) == 1
    rec = records[0]
    assert (rec["mode"], rec["attention"], rec["status"], rec["protocol"]) == ("bench", "softmax", "finished", "block")
    assert [r["length"] for r in rec["efficiency"]["bench"]["results"]] == [16, 32]
    assert all(r["rounds"] == 2 and len(r["ms_all"]) == 2 for r in rec["efficiency"]["bench"]["results"])
    assert rec["stamp"]["torch"] == torch.__version__


@pytest.mark.slow
def test_against_eager_times_both_and_prints_the_ratio(tmp_path, capsys):
    """``--against-eager``: each variant compiled (Inductor, the first step untimed and reported) and
    eager, side by side; the records say which is which."""
    with torch._inductor.config.patch(SCALAR_CPP):  # the records and the table are tested, not the kernels
        rc = bench.main(["--protocol", "block", "--variants", "local", "--lengths", "32", "--repeats", "1",
                         "--warmup", "1", "--min-time", "0", "--model", "tiny", "--no-isolate", "--threads", "1",
                         "--against-eager", "--results-dir", str(tmp_path)])
    out = capsys.readouterr().out
    assert rc == 0
    table = out[out.index("compiled / eager step time"):].splitlines()
    rows = {line.split("|")[1].strip(): line for line in table if line.startswith("| ") and "variant" not in line}
    assert set(rows) == {"softmax", "local"}
    assert all(re.search(r"\d\.\d\dx \(\d+/\d+ ms; \d+ s\)", row) for row in rows.values()), rows
    records, problems = load_records(tmp_path)
    assert not problems
    modes = sorted((rec["attention"], rec["efficiency"]["bench"]["compile"], r["compile"])
                   for rec in records for r in rec["efficiency"]["bench"]["results"])
    assert modes == [("local", False, False), ("local", True, True), ("softmax", False, False), ("softmax", True, True)]


@pytest.mark.parametrize("overrides,needle", [
    (["bench.lengths=[0]"], "bench.lengths=[0] is invalid"),
    (["bench.lengths=[1024,abc]"], "bench.lengths=[1024, 'abc'] is invalid"),
    (["bench.protocol=tabel2"], "did you mean bench.protocol=table2"),
    (["bench.batch_size=-1"], "bench.batch_size=-1 is invalid"),
    (["bench.warmup=-1"], "bench.warmup=-1 is invalid"),
    (["bench.device=tpu"], "unknown bench.device='tpu'"),
    (["bench.cpu_malloc=fast"], "unknown bench.cpu_malloc='fast'"),
    (["bench.task=txt"], "bench.task='txt' has no conf/task/txt.yaml"),
    (["bench.compile=true", "bench.warmup=0"], "bench.compile=true needs bench.warmup >= 1"),
])
def test_bad_bench_settings_are_user_errors(overrides, needle):
    """Each wrong bench setting is a ConfigError (run.py: one paragraph, exit 2), found in plan() before
    any measurement."""
    from lra.badinput import ConfigError

    with pytest.raises(ConfigError) as info:
        bench.plan(compose(*overrides), "softmax")
    assert needle in str(info.value)


def test_cli_refuses_bad_arguments_in_argparse_words(capsys):
    for argv, needle in ((["--lengths", "0"], "bench.lengths=[0] is invalid"), (["--variants", "softmaxx"], "softmaxx")):
        with pytest.raises(SystemExit) as info:
            bench.main(argv)
        assert info.value.code == 2 and needle in capsys.readouterr().err


@pytest.mark.slow
def test_dispatch_counts_are_recorded_and_tell_launch_bound_variants_apart(monkeypatch):
    """One profiled step after the timed ones counts the operators a step dispatches: a count, the
    same on every measurement, and AdaMRA's eager step dispatches more than softmax's (several times
    as many before issue 62 stacked its heads: what its flat step time on the H200 pointed to,
    results/efficiency-h200/README.md). A profiler that fails costs the diagnostic, not the measurement."""
    counts = {}
    for name in ("softmax", "adamra_t2a", "adamra_t2a"):
        _, specs = bench.plan(compose("model=tiny", "bench.lengths=[32]", "bench.repeats=1", "bench.warmup=1",
                                      "bench.threads=1", f"attention={name}"), name)
        r = bench.measure(specs[0])
        assert r["status"] == "ok", r
        assert set(r["dispatches"]) == {"outermost_aten_ops", "counted"}  # CPU: no kernel launches to count
        assert "accelerator path" in r["dispatches"]["counted"] and f"batch {specs[0]['batch_size']}," in r["dispatches"]["counted"]
        assert f"{r['dispatches']['outermost_aten_ops']} outermost aten ops" in bench._line(name, r)
        counts.setdefault(name, []).append(r["dispatches"]["outermost_aten_ops"])
    assert counts["adamra_t2a"][0] == counts["adamra_t2a"][1]
    assert counts["adamra_t2a"][0] > counts["softmax"][0] > 0, counts

    def broken(step, device, batch, model):
        raise RuntimeError("no profiler here")

    monkeypatch.setattr(bench, "count_dispatches", broken)
    r = bench.measure(specs[0])
    assert r["status"] == "ok" and r["dispatches"] == {"error": "RuntimeError: no profiler here"}
    assert "aten ops" not in bench._line("adamra_t2a", r) and "ms/step" in bench._line("adamra_t2a", r)
