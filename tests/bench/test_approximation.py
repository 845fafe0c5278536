"""The approximation map (issue 37): the closed-form checks, each able to fail, and the protocol's
record. Small N, float64, fixed seeds: deterministic and fast.

Where an exactness claim does NOT hold for a variant as configured, a test pins down that it does
not, and its docstring says why."""
from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from attention.registry import variant_names
from lra.bench import approximation as ap

N = 64


def _inputs(padded: bool) -> ap.Inputs:
    """Gaussian q, k, v (tau = 1); ``padded``: the last 12 of the 64 positions are padding (not block-aligned, so a block holds both)."""
    x = ap.make_inputs("gauss-medium", N, None)
    if padded:
        x = ap.Inputs("gauss-medium-padded", x.q, x.k, x.v, torch.arange(N)[None] < N - 12, x.x)
    return x


@pytest.fixture(scope="module", params=[False, True], ids=["full", "padded"])
def inp(request) -> ap.Inputs:
    return _inputs(request.param)


@pytest.fixture(scope="module")
def refs() -> ap.References:
    return ap.References()


def _point(name: str, overrides: dict, inp: ap.Inputs, refs: ap.References, draws: int = 1) -> dict:
    return ap.measure_point(name, overrides, inp, refs, draws, tv_draws=1)


def _exact(r: dict) -> None:
    assert r["rel_error"]["max"] < 1e-10, r["rel_error"]
    assert r["tv_max"]["max"] < 1e-10, r["tv_max"]


def test_reference_is_softmax_attention(inp, refs):
    """P and Y* of the protocol agree with the suite's softmax mixer (SDPA), padding included."""
    from attention.registry import build_mixer

    mixer = build_mixer("softmax")(n_heads=ap.HEADS, head_dim=ap.HEAD_DIM, max_len=N).double().eval()
    padded = ap.captured_inputs({"layers": [{"q": inp.q, "k": inp.k, "v": inp.v, "x": inp.x,
                                             "mask": torch.arange(N)[None] < 40}], "meta": {}}, 0, N)
    for case in (inp, padded):
        p = ap.softmax_matrix(case.q, case.k, case.mask)
        y = mixer(case.q, case.k, case.v, case.mask, case.x)
        assert ap.relative_error(p @ case.v, y, case.mask) < 1e-12
    assert torch.all(ap.softmax_matrix(padded.q, padded.k, padded.mask)[..., 40:] == 0)


def test_nystrom_exact_with_n_landmarks(inp, refs):
    """Xiong et al. eq. 14 with m = N: the landmarks are the tokens, S S^+ S = S."""
    _exact(_point("nystromformer", {"num_landmarks": N, "conv_kernel": None, "pinv_iterations": 50}, inp, refs))


def test_nystrom_default_pinv_is_not_exact(inp, refs):
    """Not exact with the configured 6 iterations of the iterative pseudo-inverse (Xiong et al. eq. 16):
    Newton-Schulz converges quadratically only once the iterate is close, and 6 steps are not enough for
    an N x N softmax kernel; the error is the pseudo-inverse's, not the landmarks'."""
    r = _point("nystromformer", {"num_landmarks": N, "conv_kernel": None}, inp, refs)
    assert r["rel_error"]["mean"] > 1e-3


@pytest.mark.parametrize("name, overrides", [
    ("local", {"block_size": 16, "window": 3}),         # 4 blocks, 3 neighbours per side: all of N
    ("longformer", {"window": 2 * N}),                  # window // 2 >= N - 1 per side
    ("bigbird", {"block_size": 16, "window_blocks": 7}),  # 3 window blocks per side cover the 4 blocks
])
def test_windows_exact_when_covering_n(name, overrides, inp, refs):
    _exact(_point(name, overrides, inp, refs))


@pytest.mark.parametrize("name, overrides", [("local", {}), ("longformer", {}),
                                             ("bigbird", {"block_size": 32, "window_blocks": 1, "num_random_blocks": 1})])
def test_windows_not_exact_when_short(name, overrides, refs):
    """The converse: a window shorter than N drops keys. (BigBird's defaults cover all of N = 256:
    3 window blocks of 64, the first and last block global and 3 random blocks reach all 4 blocks.)"""
    x = ap.make_inputs("gauss-peaked", 256, None)
    assert _point(name, overrides, x, refs)["rel_error"]["mean"] > 1e-3


@pytest.mark.parametrize("name", ["clustered", "i_clustered"])
def test_clustered_exact_with_n_clusters(name, inp, refs):
    """Vyas et al. eqs. 3-6: with C = N clusters every query is its own centroid (the 63-bit hashes
    of distinct Gaussian queries are distinct, so K-means separates them all)."""
    _exact(_point(name, {"clusters": N}, inp, refs, draws=3))


def test_linformer_exact_with_identity_projections(refs):
    """Wang et al. eq. 7 with k = N and E = F = I: E^T K = K, F^T V = V (without padding: see below)."""
    inp = _inputs(False)
    mixer = ap.build("linformer", {"k": N}, N, 0)
    with torch.no_grad():
        mixer.proj_k.copy_(torch.eye(N))
        mixer.proj_v.copy_(torch.eye(N))
        p, ref, _ = refs.get(inp, False)
        y = mixer(inp.q, inp.k, inp.v, inp.mask, inp.x)
        a, how = ap.mixing_matrix(mixer, inp, inp.k, y)
    assert ap.relative_error(y, ref, inp.mask) < 1e-12
    assert a is not None and float(ap.tv_rows(a, p, inp.mask).max()) < 1e-12


def test_linformer_identity_not_exact_with_padding(refs):
    """With padding it is not exact: padded keys are zeroed before the projection, not masked after
    it (the projected slots are mixtures, so no mask applies there, as in LRA's Linformer), so each
    padded slot stays a key of logit 0 that takes softmax weight."""
    inp = _inputs(True)
    mixer = ap.build("linformer", {"k": N}, N, 0)
    with torch.no_grad():
        mixer.proj_k.copy_(torch.eye(N))
        mixer.proj_v.copy_(torch.eye(N))
        _, ref, _ = refs.get(inp, False)
        assert ap.relative_error(mixer(inp.q, inp.k, inp.v, inp.mask, inp.x), ref, inp.mask) > 0.05


def test_linformer_k_equal_n_alone_is_not_exact(inp, refs):
    """k = N alone is not enough: the configured E, F are random N(0, 1/N) maps, so the softmax runs
    over N random mixtures of keys instead of the keys (the projections are learned in training)."""
    assert _point("linformer", {"k": N}, inp, refs)["rel_error"]["mean"] > 0.1


def test_performer_error_falls_as_inverse_sqrt_features(refs):
    """FAVOR+ (Choromanski et al., Lemma 1/Theorem 1): the estimator's sd falls as 1/sqrt(m). Fit
    log(mean rel. error over 8 draws) against log(m), m = 32..1024, iid and orthogonal features.
    Measured slopes: -0.43 (iid), -0.38 (orthogonal); the output is a ratio of two estimates, so at
    errors of 0.1-0.6 the slope is a little shallower than its asymptote -0.5."""
    x = ap.gaussian(64, 0.25)
    x.kind = "performer-slope"
    ms = [32, 64, 128, 256, 512, 1024]
    for orthogonal in (False, True):
        errs = [ap.measure_point("performer", {"nb_features": m, "orthogonal": orthogonal}, x, refs, 8)["rel_error"]["mean"]
                for m in ms]
        slope = float(np.polyfit(np.log(ms), np.log(errs), 1)[0])
        assert -0.65 < slope < -0.3, (orthogonal, slope, errs)


def test_adamra_softmax_exact_at_full_resolution(inp, refs):
    """AdaMRA eqs. 6-9 with c_h = 1 (m_h = n: every segment one token) and the softmax ablation of
    Table 5: each head attends over all keys with softmax; the per-head maps start at the identity
    (eq. 9 as initialised here), so whichever head the router picks, the output is exact."""
    _exact(_point("adamra_softmax", {"rates": [1.0]}, inp, refs))
    _exact(_point("adamra_softmax", {"rates": [1.0, 1.0, 1.0]}, inp, refs, draws=2))


def test_adamra_relu_not_exact_at_full_resolution(inp, refs):
    """The configured AdaMRA is not exact even uncompressed: eq. 7 is kernel attention with
    phi = ReLU (the paper substitutes the kernel for softmax; it claims no equivalence), so at c_h = 1
    it is ReLU linear attention over all tokens, another attention, not an approximation of softmax."""
    assert _point("adamra", {"rates": [1.0]}, inp, refs)["rel_error"]["mean"] > 0.1


def test_mixing_matrix_refuses_value_dependent_output(inp):
    """TV is reported only when Y = A V holds for the matrix read at V = I."""
    class Squares(torch.nn.Module):
        def forward(self, q, k, v, mask, x):  # noqa: ANN001
            return v * v.abs()

    y = Squares()(inp.q, inp.k, inp.v, inp.mask, inp.x)
    a, how = ap.mixing_matrix(Squares(), inp, inp.k, y)
    assert a is None and "not A V" in how


@pytest.mark.parametrize("name", variant_names())
def test_every_config_has_knobs_or_is_excluded(name):
    """Each config's spec gives the map its budget axes (or why it is excluded); the default point
    comes first, once, and a config with a knob sweeps at least 4 budgets."""
    if ap.spec(name).excluded:
        return
    points = ap.budget_points(name)
    assert points[0]["default"] and sum(p["default"] for p in points) == 1
    if ap.knobs_of(name):
        assert len(points) >= 4, name


def test_inputs_temperatures_order_entropy(refs):
    ents = []
    for kind in ("gauss-flat", "gauss-medium", "gauss-peaked"):
        x = ap.make_inputs(kind, 128, None)
        ents.append(refs.get(x, False)[2]["entropy"])
    assert ents[0] > ents[1] > ents[2] and ents[0] < math.log(128)
    loc = ap.make_inputs("local", 256, None)
    assert refs.get(loc, False)[2]["mass_within_16"] > 0.9


@pytest.mark.slow
def test_protocol_writes_admitted_record(tmp_path, monkeypatch):
    """A small sweep writes one mode=approximation record; the report's module admits it and builds
    the table and both plots from it. (Two budget points keep it fast.)"""
    from lra.report.approximation import approximation_section, screen_records

    monkeypatch.setattr(ap, "knobs_of", lambda name: (ap.Knob("nb_features", (16,)),))
    settings = ap.Settings(lengths=(64, 128), inputs=("gauss-medium",), draws=2, draws_long=2, tv_max_len=64,
                           tv_draws=1, time_steps=True)
    paths = ap.run(["performer_32"], settings, tmp_path, None)
    assert len(paths) == 1
    import json

    rec = json.loads(paths[0].read_text())
    assert rec["mode"] == ap.MODE and rec["status"] == "finished"
    pts = rec["approximation"]["points"]
    assert {p["n"] for p in pts} == {64, 128} and all(p["status"] == "ok" for p in pts)
    assert all(p["draws"] == 2 for p in pts) and all("tv_mean" in p for p in pts if p["n"] == 64)
    assert all(p["time"]["status"] == "ok" for p in pts)
    runs, excluded = screen_records(tmp_path)
    assert len(runs) == 1 and not excluded
    tables, plots, files = approximation_section(runs)
    assert "tables/approximation_sweep.csv" in files
    assert tables and set(plots) >= {"plots/approximation_error_vs_n_gauss-medium.png",
                                     "plots/approximation_pareto_gauss-medium_n128.png"}


def test_a_config_without_a_complete_spec_stops_the_map_with_one_line(monkeypatch, capsys):
    """No raw KeyError: the map (and run.py mode=bench, through ConfigError) says which field of which
    file is missing, before any point runs."""
    from attention.spec import SpecError
    from lra.badinput import ConfigError

    line = "attention/cosine.py: CosineAttention.spec lacks 'knobs' (the approximation map's budget axes; () for none)"

    def incomplete(name):
        raise SpecError(line)

    monkeypatch.setattr(ap, "spec_of", incomplete)
    with pytest.raises(ConfigError) as e:
        ap.run(["linear"], ap.Settings(lengths=(64,), inputs=("gauss-medium",)), None, None)
    assert str(e.value) == line
    with pytest.raises(SystemExit):
        ap.main(["--variants", "linear", "--no-time", "--inputs", "gauss-medium"])
    assert line in capsys.readouterr().err


def test_listops_capture_from_a_checkpoint_and_its_record(tmp_path):
    """The map's ListOps inputs come from a trained checkpoint: its model is built from the run
    record named by the checkpoint's folder (an old record's retired settings dropped), and every
    layer's q, k, v, bool mask and input are captured in float64."""
    import json

    from hydra.utils import instantiate
    from omegaconf import OmegaConf

    from lra.identity import drop_retired
    from tests.training.test_run_identity import composed

    config = OmegaConf.to_container(composed("experiment=quick", "task=listops", "attention=softmax"), resolve=True)
    config["model"]["graph_safe"] = False  # written before issue 62 retired the setting
    run_id = "20260101T000000-train-listops-softmax-s0-abcdef"
    (tmp_path / "runs").mkdir()
    (tmp_path / "runs" / f"{run_id}.json").write_text(json.dumps({"config": config, "metrics": {"test_acc": 0.5}}))
    torch.manual_seed(0)
    net = instantiate(drop_retired(config)["model"], mixer=instantiate(config["attention"]))
    ckpt = tmp_path / "checkpoints" / run_id / "best-1.ckpt"
    ckpt.parent.mkdir(parents=True)
    torch.save({"state_dict": {f"network.{k}": v for k, v in net.state_dict().items()}}, ckpt)
    cap = ap.listops_capture(ckpt, tmp_path / "cache")
    assert len(cap["layers"]) == len(net.encoder.blocks) and cap["meta"]["checkpoint_test_acc"] == 0.5
    for layer in cap["layers"]:
        assert layer["mask"].dtype == torch.bool
        assert layer["mask"].sum(1).tolist() == cap["meta"]["sequence_lengths"]
        assert layer["q"].dtype == layer["x"].dtype == torch.float64
