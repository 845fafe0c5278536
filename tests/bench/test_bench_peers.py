"""The race against the public implementations (lra/bench/peers.py): adapters at tiny sizes, tested
only where the peer package is installed (each test skips naming the package otherwise), the
agreement check (which is what catches a wrong hyperparameter mapping), and the clean skip of a
missing peer."""
from __future__ import annotations

import argparse
import dataclasses

import pytest
import torch

from lra.bench import peers as bp

D, H, N, B = 32, 2, 64, 2
# Sizes the tiny N needs (the conf's 100 clusters / top-32 keys would exceed N = 64; local blocks of
# 64 would make one block, where a wrong window could not show), on both sides.
TINY = {"clustered": {"clusters": 8, "topk": 8}, "i_clustered": {"clusters": 8, "topk": 8}, "local": {"block_size": 16}}


def job(peer: bp.Peer, heads: int = H) -> dict:
    return {"peer": peer.key, "d_model": D, "n_heads": heads, "length": N, "batch_size": B, "threads": 1,
            "seed": 0, "warmup": 0, "min_time_s": 0.0, "overrides": TINY.get(peer.variant, {})}


def installed(peer: bp.Peer) -> None:
    pytest.importorskip(peer.module, reason=f"peer package {peer.package} not installed")


@pytest.mark.parametrize("peer", bp.PEERS, ids=lambda p: p.key)
def test_adapter_shape_and_backward(peer):
    installed(peer)
    layer = bp.build_side(job(peer), "peer").train()
    x = torch.randn(B, N, D, requires_grad=True)
    out, aux = layer(x)
    assert out.shape == (B, N, D)
    loss = out.pow(2).mean() + (0 if aux is None else aux.reshape(()))
    loss.backward()
    assert x.grad is not None and torch.isfinite(x.grad).all() and x.grad.abs().sum() > 0
    assert torch.isfinite(out).all()


@pytest.mark.parametrize("peer", bp.PEERS, ids=lambda p: p.key)
def test_time_job_alternates_both_sides(peer):
    installed(peer)
    t = bp.time_job(job(peer))
    assert len(t["ours_s"]) >= bp.MIN_STEPS and len(t["peer_s"]) == len(t["ours_s"])
    assert min(t["ours_s"] + t["peer_s"]) > 0


COMPARED = [p for p in bp.PEERS if p.align is not None]


@pytest.mark.parametrize("peer", COMPARED, ids=lambda p: p.key)
def test_outputs_agree_where_claimed(peer):
    installed(peer)
    # One head and batch 1: the Nystromformer peer's batch-and-heads pinv start then equals ours,
    # so every compared peer must agree to round-off here.
    r = bp.agree_job(job(peer, heads=1 if peer.variant == "nystromformer" else H))
    assert r["agree"] < 1e-9, (peer.key, r)


def _wrong(peer_key: str, **conf) -> bp.Peer:
    peer = bp.find_peer(peer_key)
    return dataclasses.replace(peer, build=lambda c, d, h, n: peer.build({**c, **conf}, d, h, n))


@pytest.mark.parametrize("peer_key,wrong", [
    ("local:local-attention", {"window": 2}),
    ("nystromformer:nystrom-attention", {"pinv_iterations": 5}),
    ("linear:pytorch-fast-transformers", {"eps": 1e-1}),
])
def test_a_wrong_mapping_is_caught(peer_key, wrong):
    peer = bp.find_peer(peer_key)
    installed(peer)
    bad = _wrong(peer_key, **wrong)
    r = bp.agree_job(job(bad, heads=1), peers=(bad,))
    assert r["agree"] > 1e-6, r


def test_random_peers_say_why_not():
    for peer in bp.PEERS:
        if peer.align is None:
            assert peer.why_not, peer.key
            assert bp.agree_job(job(peer), peers=(peer,)) == {"agree": None, "why_not": peer.why_not}


def test_memory_job_measures_one_side():
    peer = bp.find_peer("softmax:torch")
    r = bp.memory_job({**job(peer), "side": "ours"})
    assert r["peak_mb"] >= 0 and r["memory_method"]


# ---------------------------------------------------------------------------------------------
# A missing peer, the table, the CLI
# ---------------------------------------------------------------------------------------------
MISSING = bp.Peer("local", "nowhere LocalAttention", "no-such-peer-pkg", "lra_no_such_peer_module",
                  "window 64", bp.peer_local)


def args(**kw) -> argparse.Namespace:
    return bp.parser().parse_args([]) if not kw else argparse.Namespace(**{**vars(bp.parser().parse_args([])), **kw})


def test_missing_peer_is_a_clean_skip_naming_the_package(capsys):
    def never(job, env):
        raise AssertionError("a missing peer must not be measured")

    rows = bp.race([MISSING], [(D, H, N)], args(), {}, never)
    line = capsys.readouterr().out
    assert "skipped" in line and "pip install no-such-peer-pkg" in line
    assert rows[0]["skip"].startswith("skipped: no-such-peer-pkg not installed")
    text = bp.table(rows, [(D, H, N)])
    assert "pip install no-such-peer-pkg" in text


def test_fast_transformers_skip_points_to_the_cpu_build():
    ft = dataclasses.replace(bp.find_peer("linear:pytorch-fast-transformers"), module="lra_no_such_peer_module")
    assert "docs/race.md" in bp.availability(ft) and "pip install pytorch-fast-transformers" in bp.availability(ft)


def fake_run(job, env):
    if job["kind"] == "time":
        return {"status": "ok", "ours_s": [0.2, 0.2, 0.2], "peer_s": [0.1, 0.1, 0.1]}
    if job["kind"] == "memory":
        return {"status": "ok", "peak_mb": 30.0 if job["side"] == "ours" else 40.0}
    return {"status": "ok", "agree": 3e-16, "agree_tol": 1e-9}


def test_race_ratios_and_table():
    peer = bp.find_peer("softmax:torch")
    rows = bp.race([peer, MISSING], [(64, 2, 1024)], args(rounds=2), {}, fake_run)
    r = rows[0]["points"]["64/2/1024"]
    assert r["time_ratio"] == pytest.approx(2.0) and r["time_ratio_rounds"] == pytest.approx([2.0, 2.0])
    assert r["mem_ratio"] == pytest.approx(0.75) and r["steps"] == [6, 6]
    text = bp.table(rows, [(64, 2, 1024)])
    assert "d64/2h 1K time" in text and "2.00" in text and "0.75" in text and "yes 3e-16" in text
    stamp = bp.machine_stamp(1, "tuned") | {"loadavg_end": [0.0, 0.0, 0.0]}
    rep = bp.report(rows, [(64, 2, 1024)], stamp, "python -m lra.bench --protocol peers")
    assert "command: python -m lra.bench --protocol peers" in rep and "1 thread(s)" in rep and "load average" in rep


def test_memory_workers_get_exact_malloc_and_no_timing_setting():
    """The timing workers' ``tuned`` glibc setting (no mmap at all) must not reach the memory workers:
    it defeats the exact setting, and the peak then counts freed heap blocks (sinkhorn read 1.06x
    for a true 1.3x)."""
    seen = []
    timing_env = bp.worker_env(1, "tuned")
    assert timing_env["MALLOC_MMAP_MAX_"] == "0"

    def run(job, env):
        seen.append((job["kind"], env))
        return fake_run(job, env)

    bp.race([bp.find_peer("softmax:torch")], [(64, 2, 1024)], args(), timing_env, run)
    mem_envs = [env for kind, env in seen if kind == "memory"]
    assert len(mem_envs) == 2
    for env in mem_envs:
        assert {k: v for k, v in env.items() if k.startswith("MALLOC_")} == bp.EXACT_MALLOC
        assert env["OMP_NUM_THREADS"] == "1"
    assert all(env is timing_env for kind, env in seen if kind == "time")


def test_ours_drops_the_biases_the_peer_has_not():
    """Bias adds are not the mechanism: ours is raced with the peer's projection biases only."""
    peer = dataclasses.replace(bp.find_peer("softmax:torch"), biases=(False, True))
    ours = bp.build_side(job(peer), "ours", (peer,))
    assert all(p.bias is None for p in (ours.q_proj, ours.k_proj, ours.v_proj)) and ours.out_proj.bias is not None
    x = torch.randn(B, N, D)
    out, _ = bp.ours_forward(ours, x)
    assert out.shape == x.shape
    full = bp.build_side(job(bp.find_peer("softmax:torch")), "ours")
    assert all(p.bias is not None for p in (full.q_proj, full.k_proj, full.v_proj, full.out_proj))
    no_bias = {p.key: p.biases for p in bp.PEERS if p.biases != (True, True)}
    assert no_bias["linformer:linformer"] == (False, True) and no_bias["routing:routing-transformer"] == (True, False)


def test_a_failed_worker_is_a_row_not_a_crash():
    peer = bp.find_peer("softmax:torch")
    rows = bp.race([peer], [(64, 2, 1024)], args(), {}, lambda j, e: {"status": "failed", "error": "boom"})
    assert rows[0]["points"]["64/2/1024"] == {"status": "failed", "error": "boom"}
    assert "failed" in bp.table(rows, [(64, 2, 1024)])


def test_bench_cli_dispatches_to_the_race():
    from lra.bench.cli import main

    with pytest.raises(SystemExit, match="no peer for nosuch"):
        main(["--protocol", "peers", "--variants", "nosuch"])


def test_existing_results_are_never_overwritten(tmp_path):
    out = tmp_path / "race.json"
    out.write_text("{}")
    with pytest.raises(SystemExit, match="never overwritten"):
        bp.main(["--protocol", "peers", "--out", str(out)])
    assert out.read_text() == "{}"


def test_shapes_parse():
    assert bp.parse_shapes(["64/2", "d256/4"]) == [(64, 2), (256, 4)]
    with pytest.raises(SystemExit):
        bp.parse_shapes(["64x2"])


def test_select_by_variant_or_by_peer():
    assert [p.package for p in bp.select("reformer")] == ["pytorch-fast-transformers", "reformer-pytorch"]
    assert [p.key for p in bp.select("reformer:reformer-pytorch,local")] == ["local:local-attention",   # configs' order
                                                                               "reformer:reformer-pytorch"]
    assert len(bp.select(None)) == len(bp.PEERS)


@pytest.mark.slow
def test_worker_process_round_trip():
    """The race's real path: a job in a fresh ``--worker`` process, its result read back."""
    peer = bp.find_peer("softmax:torch")
    r = bp.run_worker({**job(peer), "kind": "agree"}, bp.worker_env(1, "tuned"), timeout_s=120)
    assert r == {"status": "ok", "agree": 0.0, "agree_tol": bp.AGREE_TOL} or (r["status"] == "ok" and r["agree"] < 1e-12)


def test_worker_reports_a_failing_job(monkeypatch, capsys):
    import io
    import json

    monkeypatch.setattr("sys.stdin", io.StringIO(json.dumps({"kind": "agree", "peer": "nosuch:pkg", "threads": 1})))
    assert bp.worker_main() == 0
    line = capsys.readouterr().out.strip().splitlines()[-1]
    r = json.loads(line[len(bp.RESULT_TAG):])
    assert r["status"] == "failed" and "nosuch:pkg" in r["error"]
