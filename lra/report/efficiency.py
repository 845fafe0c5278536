"""Efficiency side of the report: speed/memory tables (AdaMRA Table 2), SMAT (Table 3) and the
bubble chart's points.

Rules, written down:

* A bench group is one measurement setup: bench protocol, device, batch size, task shapes, model
  (every size setting of ``config.model``), threads and the measurement settings (isolation,
  allocator). Runs of different setups never share a table or a ratio. Within a group the newest
  finished record per variant with at least one good length counts; older ones are listed as
  superseded duplicates. A record in which every length failed (oom, timeout) never supersedes a
  good one: it is listed as not used; it counts only when the variant has no good record.
* Ratios are softmax / variant (the paper's "improvement" factors: > 1 = faster or smaller). Time
  and memory are fitted to a N^alpha (alpha with its 95% interval). Bold/underlined = lowest and
  second-lowest measured median: a ranking of single measurements, not a significance claim.
* SMAT (eq. 10, :mod:`lra.report.smat`): at ONE length N, the longest the ``smat`` bench measured
  well for any variant; speed and memory of each variant at exactly N (a variant whose N failed gets
  a row saying so, never another length's figure), accuracy = the Avg of protocol
  ``report.smat_protocol`` (its protocol table: custom runs never feed it). Scored and normalised
  only over the compared set, the variants with all three (memory resolved: a peak under
  MIN_FIT_MB is not ranked; a bench whose attention settings differ from the accuracy runs' is
  another model); fewer than two compared variants: no score (min-max needs two); the title names N, batch, model, task and
  device, and says when that is not the paper's protocol; the accuracy column says "LRA avg" only
  when the Avg covers the five LRA tasks. The suite's SMAT is the exact sum (stored unrounded);
  the published rows use the paper's rounding (components rounded to 2 decimals, then summed), the
  one rule that reproduces Table 3's printed scores.
* The bubble chart without a SMAT bench (:func:`training_points`) draws one device; a row's
  throughput comes from its runs on that device, its accuracy from every seed.
"""
from __future__ import annotations

import hashlib
import json
from collections import Counter, defaultdict
from dataclasses import dataclass, field
from typing import Any

from lra.identity import VARIANT, flatten, identity, setting_class
from lra.report import reference as ref
from lra.report import stats
from lra.report.cells import AccuracyGroup, order
from lra.report.screening import NOT_USED, SUPERSEDED, Ledger, Run
from lra.report.smat import SmatPoint, TradeoffPoint, smat_scores
from lra.report.tables import MISSING, OWN, Table, TableCell, emphasise, slug

MIN_FIT_MB = 1.0  # peaks below this are the CPU method's resolution (reused pages), not a size
MODEL_SIZES = ("n_layers", "d_model", "n_heads", "d_head", "d_ffn", "pool", "dropout")
PAPER_SMAT = {"length": 4096, "batch": 8, "task": "text", "model": "L2 d64 h2 ffn128"}  # AdaMRA Table 3


def device_label(rec: dict[str, Any]) -> str:
    """The device a record's speed figures were measured on: a bench's ``bench.device``; a training
    run's last wall-clock stretch (its throughput sums stretches on one machine only, so a run resumed
    on another machine counts from there), else, in records older than the stretches, the stamp's
    GPU where the trainer could use one. The stamp alone is where the run started."""
    st = rec.get("stamp") or {}
    eff = rec.get("efficiency") or {}
    if "bench" not in eff:
        segments = (eff.get("wall") or {}).get("segments") or []
        last = segments[-1] if segments else {}
        if last.get("device"):
            return str((last.get("cpu") if last["device"] == "cpu" else last["device"]) or "unknown device")
        on_gpu = ((rec.get("config") or {}).get("trainer") or {}).get("accelerator") != "cpu"
    else:
        on_gpu = str(eff["bench"].get("device", "cpu")).startswith("cuda")
    return str(st["gpu"] if on_gpu and st.get("gpu") else st.get("cpu") or "unknown device")


def model_label(rec: dict[str, Any]) -> str:
    """'L2 d64 h2 ffn128' from the record's model settings ('model unknown' without them)."""
    m = (rec.get("config") or {}).get("model") or {}
    if not m:
        return "unknown"
    extra = [f"{k}={m[k]}" for k in ("pool", "d_head") if k in m and not (k == "pool" and m[k] == "mean")
             and not (k == "d_head" and m.get("d_model") and m.get("n_heads") and m[k] == m["d_model"] // m["n_heads"])]
    return " ".join([f"L{m.get('n_layers')} d{m.get('d_model')} h{m.get('n_heads')} ffn{m.get('d_ffn')}", *extra])


@dataclass
class BenchGroup:
    protocol: str
    device: str
    batch: int
    task: str
    model: str
    setup: str                       # threads and measurement settings
    key_hash: str
    members: dict[str, dict[str, Any]] = field(default_factory=dict)  # attention -> bench block
    runs: dict[str, Run] = field(default_factory=dict)                # attention -> its record
    name: str = ""

    @property
    def title(self) -> str:
        return f"bench protocol {self.protocol}, {self.device}, batch {self.batch}, task {self.task}, model {self.model}, {self.setup}"


def bench_groups(runs: list[Run], ledger: Ledger) -> list[BenchGroup]:
    """The bench groups (see the module rules), each with unique table names."""
    groups: dict[tuple, BenchGroup] = {}
    failed: list[tuple[tuple, Run]] = []
    # good records first (newest first), then the all-failed ones: a failed bench never supersedes a good one
    ordered = sorted((r for r in runs if r.rec["mode"] == "bench"), key=lambda r: r.chrono, reverse=True)
    ordered = [r for r in ordered if ok_results(r.rec["efficiency"]["bench"])] + [
        r for r in ordered if not ok_results(r.rec["efficiency"]["bench"])]
    for run in ordered:
        rec, bench = run.rec, run.rec["efficiency"]["bench"]
        shapes = bench.get("task_shapes") or {}
        model = (rec.get("config") or {}).get("model") or {}
        sizes = {k: model.get(k) for k in MODEL_SIZES}
        threads = (rec.get("efficiency") or {}).get("threads")
        setup = ", ".join([f"{threads} thread(s)"] * (threads is not None)
                          + [f"{k}={bench[k]}" for k in ("isolate", "cpu_malloc") if k in bench]
                          + [f"torch.compile{'' if bench.get('compile_mode', 'default') == 'default' else ' ' + bench['compile_mode']}"]
                          * bool(bench.get("compile"))) or "setup unrecorded"
        key = (str(bench.get("protocol")), device_label(rec), int(bench.get("batch_size") or 0), str(rec["task"]),
               model_label(rec), setup)
        digest = hashlib.sha1(json.dumps([key, sizes, shapes], sort_keys=True, default=str).encode()).hexdigest()[:6]
        g = groups.setdefault(key + (digest,), BenchGroup(*key, digest))
        attn = str(rec["attention"])
        if attn in g.members:
            if not ok_results(bench) and ok_results(g.members[attn]):
                ledger.exclude(run, NOT_USED, f"every length failed ({_statuses(bench)}); the valid bench record "
                                              f"{g.runs[attn].run_id} of {attn} with the same setup counts")
            else:
                ledger.exclude(run, SUPERSEDED, f"a newer bench record of {attn} with the same setup counts")
            continue
        g.members[attn], g.runs[attn] = bench, run
    out = [groups[k] for k in sorted(groups)]
    base = defaultdict(int)
    for g in out:
        base[(g.protocol, g.device)] += 1
    for g in out:
        stem = f"{slug(g.protocol)}_{slug(g.device)}"
        g.name = stem if base[(g.protocol, g.device)] == 1 else f"{stem}_{g.key_hash}"
    return out


def ok_results(bench: dict[str, Any]) -> dict[int, dict[str, Any]]:
    return {int(r["length"]): r for r in bench.get("results", []) if r.get("status") == "ok"}


def _statuses(bench: dict[str, Any]) -> str:
    return ", ".join(f"{r['status']} at {r['length']}" for r in bench.get("results", [])) or "no lengths"


def _status_at(bench: dict[str, Any], length: int) -> str:
    """Why a variant has no good figure at ``length``."""
    found = [str(r["status"]) for r in bench.get("results", []) if r["length"] == length]
    return f"{found[-1]} at N={length}" if found else f"not measured at N={length}"


def variant_settings(config: Any) -> dict[str, Any]:
    """The attention variant's settings (:data:`lra.identity.VARIANT` class) of a record's config."""
    if not isinstance(config, dict) or not isinstance(config.get("attention"), dict):
        return {}
    return {p: v for p, v in flatten(identity(config)).items() if setting_class(p) == VARIANT and p != "attention_name"}


def _ratio_cell(value: float | None, base: float | None) -> TableCell:
    if value is None:
        return TableCell(MISSING)
    ratio = f" ({base / value:.2f}x)" if base and value > 0 else ""
    return TableCell(f"{value:.1f}{ratio}", value)


def _memory_cell(value: float | None, base: float | None) -> TableCell:
    """A peak under MIN_FIT_MB is below what the CPU method resolves (an in-process run, say): shown
    as such, never ranked or turned into a ratio."""
    if value is not None and value < MIN_FIT_MB:
        return TableCell(f"<{MIN_FIT_MB:g} (unresolved)")
    return _ratio_cell(value, base if base is None or base >= MIN_FIT_MB else None)


def power_fits(rs: dict[int, dict[str, Any]]) -> tuple[stats.PowerFit | None, stats.PowerFit | None]:
    """Time and memory fitted to a N^alpha over the lengths measured (>= 2 lengths; memory only
    from peaks >= MIN_FIT_MB)."""
    out = []
    for k, floor in (("ms", 0.0), ("peak_mb", MIN_FIT_MB)):
        pts = [(n, r[k]) for n, r in sorted(rs.items()) if r.get(k) and r[k] > floor]
        out.append(stats.fit_power_law([n for n, _ in pts], [v for _, v in pts]) if len(pts) >= 2 else None)
    return out[0], out[1]


def _alpha_cell(fit: stats.PowerFit | None) -> TableCell:
    if fit is None:
        return TableCell(MISSING)
    ci = f" [{fit.low:.2f}, {fit.high:.2f}]" if fit.low is not None else " [—]"
    return TableCell(f"{fit.alpha:.2f}{ci}")


def efficiency_table(g: BenchGroup) -> Table:
    per = {a: ok_results(b) for a, b in g.members.items()}
    lengths = sorted({n for rs in per.values() for n in rs})
    header = (["attention", "source"] + [f"ms @{n}" for n in lengths] + [f"MB @{n}" for n in lengths]
              + ["time α [95% CI]", "memory α [95% CI]"])
    csv_header = (["attention", "source"] + [f"{k}_{n}" for n in lengths for k in ("ms", "ms_ratio", "mb", "mb_ratio", "examples_per_s")]
                  + ["time_alpha", "time_alpha_low", "time_alpha_high", "mem_alpha", "mem_alpha_low", "mem_alpha_high"])
    methods = sorted({b.get("memory_method") or "" for b in g.members.values()} - {""})
    table = Table(f"efficiency_{g.name}", f"Efficiency, {g.title}", header, csv_header=csv_header)
    base = per.get("softmax", {})
    own = []
    for attn in sorted(per, key=order):
        rs = per[attn]
        fits = power_fits(rs)
        cells = [TableCell(attn), TableCell(OWN)]
        cells += [_ratio_cell(rs[n]["ms"] if n in rs else None, base.get(n, {}).get("ms")) for n in lengths]
        cells += [_memory_cell(rs[n]["peak_mb"] if n in rs else None, base.get(n, {}).get("peak_mb")) for n in lengths]
        own.append(cells + [_alpha_cell(f) for f in fits])
        raw: list[Any] = [attn, OWN]
        for n in lengths:
            r, b = rs.get(n), base.get(n)
            raw += [r["ms"] if r else None, b["ms"] / r["ms"] if r and b else None, r["peak_mb"] if r else None,
                    b["peak_mb"] / r["peak_mb"] if r and b and min(r["peak_mb"], b["peak_mb"]) >= MIN_FIT_MB else None,
                    r["examples_per_s"] if r else None]
        for f in fits:
            raw += [f.alpha, f.low, f.high] if f is not None else [None] * 3
        table.csv_rows.append(raw)
    for col in range(2, 2 + 2 * len(lengths)):
        emphasise([r[col] for r in own], higher_is_better=False)
    table.rows += own
    table.notes += [
        f"ms = median time of one {'training step (fwd+bwd+optimiser)' if g.protocol != 'block' else 'block fwd+bwd'}; "
        "MB = peak memory of the step; (x) = softmax / variant (> 1: faster or smaller than softmax).",
        "α = exponent of a·N^α fitted by least squares on log-log (time, memory) over the lengths measured; "
        "95% CI from the slope's t-distribution (n - 2 dof; [—] with two lengths); memory peaks under "
        f"{MIN_FIT_MB:g} MB are left out of the fit. α ≈ 2: quadratic, ≈ 1: linear; "
        "fixed costs (weights, activations outside attention) pull α down at short lengths.",
        f"Memory method: {', '.join(methods) or 'unknown'} (see lra/bench/harness.py). Bold = lowest, underlined = "
        "second lowest measured median: a ranking of single measurements, not a significance claim.",
        "Only runs of this exact setup (model, batch, task shapes, threads, measurement settings) share this table. "
        "Published figures were measured on other hardware: they are in their own table, never in this one.",
    ]
    return table


def efficiency_reference_table() -> Table:
    """AdaMRA Table 2 as published (T4 GPU): its own table, since the report never mixes devices."""
    lengths = list(ref.TABLE2_LENGTHS)
    header = ["model", "source"] + [f"ms @{n}" for n in lengths] + [f"MB @{n}" for n in lengths]
    table = Table("efficiency_reference_table2", f"Efficiency, published: {ref.TABLE2_SOURCE}, batch 16, task text", header,
                  csv_header=["model", "source"] + [f"{k}_{n}" for n in lengths for k in ("ms", "ms_ratio", "mb", "mb_ratio")])
    t_ref, m_ref = ref.ADAMRA_TABLE2["Transformer"]
    for model, (ms, mb) in ref.ADAMRA_TABLE2.items():
        table.rows.append([TableCell(ref.label(model)), TableCell(ref.TABLE2_SOURCE)]
                          + [_ratio_cell(float(ms[i]), float(t_ref[i])) for i in range(len(lengths))]
                          + [_ratio_cell(float(mb[i]), float(m_ref[i])) for i in range(len(lengths))])
        table.csv_rows.append([ref.label(model), ref.TABLE2_SOURCE]
                              + [x for i in range(len(lengths)) for x in (float(ms[i]), t_ref[i] / ms[i], float(mb[i]), m_ref[i] / mb[i])])
    table.notes.append("(x) = Transformer / model, as in the paper's improvement factors. Shown because this report has "
                       "table2 bench runs; compare ratios, not absolute figures, with them.")
    return table


# ---------------------------------------------------------------------------------------------
# SMAT
# ---------------------------------------------------------------------------------------------
def accuracy_label(tasks: list[str], protocol: str) -> str:
    """What an Avg is: the LRA average only over the five LRA tasks."""
    if list(tasks) == list(ref.LRA_TASKS):
        return f"LRA average accuracy (5 tasks, protocol {protocol})"
    return f"mean accuracy over {', '.join(tasks) or 'no task'} (protocol {protocol}; not the LRA average)"


def smat_rows(points: list[SmatPoint], source: str, round_to: int | None, why: dict[str, str] | None = None
              ) -> tuple[list[list[TableCell]], list[list[Any]], list[str]]:
    """Rows with the normalised components in brackets, the CSV rows, and the compared set: the
    points with all three figures and no reason in ``why``. Eq. 10 normalises over the compared
    models; with fewer than two, min-max has no range and nothing is scored."""
    why = dict(why or {})
    compared = [p for p in points if p[0] not in why and None not in p[1:]]
    if len(compared) < 2:
        for p in compared:
            why[p[0]] = "the only variant with speed, resolved memory and accuracy: min-max needs two"
        compared = []
    columns = [list(c) for c in zip(*[p[1:] for p in compared])] if compared else []
    names = [p[0] for p in compared]
    scores = dict(zip(names, smat_scores(*columns, round_to=round_to) if compared else []))
    exact = dict(zip(names, smat_scores(*columns, round_to=None) if compared else []))
    rows, raw = [], []
    for name, speed, mem, acc in points:
        s = scores.get(name)
        norm = (lambda v, k: MISSING if v is None else f"{v:.1f} ({s[k]:.2f})" if s else f"{v:.1f}")  # noqa: E731
        smat = TableCell(f"{s['smat']:.2f}", s["smat"]) if s else TableCell(f"{MISSING} ({why[name]})" if name in why else MISSING)
        rows.append([TableCell(name), TableCell(source), TableCell(norm(speed, "s_norm")), TableCell(norm(mem, "m_norm")),
                     TableCell((f"{acc:.2f} ({s['acc_norm']:.2f})" if s else f"{acc:.2f}") if acc is not None else MISSING), smat])
        raw.append([name, source, speed, s["s_norm"] if s else None, mem, s["m_norm"] if s else None, acc,
                    s["acc_norm"] if s else None, s["smat"] if s else None, exact[name]["smat"] if s else None,
                    why.get(name)])
    return rows, raw, names


SMAT_CSV = ["attention", "source", "speed", "s_norm", "peak_mb", "m_norm", "accuracy", "acc_norm", "smat", "smat_exact",
            "not_scored"]


def smat_table(g: BenchGroup, averages: dict[str, tuple[float, list[str]]], protocol: str,
               accuracy_variants: dict[str, set[str]] | None = None,
               accuracy_models: dict[str, list[dict[str, Any]]] | None = None,
               complete_elsewhere: dict[str, list[str]] | None = None) -> tuple[Table, list[TradeoffPoint], str]:
    """The table at one N, the compared set's points (for the bubble chart) and the accuracy's label.
    ``accuracy_variants``: attention -> the JSON of the variant settings of its accuracy runs (the
    identity check: a bench of other attention settings is another model); ``accuracy_models``:
    attention -> the backbones of its accuracy runs (speed from one backbone is never combined with
    accuracy from another: :func:`backbone_conflict`); ``complete_elsewhere``: attention -> the other
    protocols with a complete accuracy row for it (named in the reason, with the setting to use one)."""
    length = max((n for b in g.members.values() for n in ok_results(b)), default=0)
    points: list[SmatPoint] = []
    why: dict[str, str] = {}
    for attn in sorted(g.members, key=order):
        r = ok_results(g.members[attn]).get(length)
        avg = averages.get(attn)
        points.append((attn, float(r["examples_per_s"]) if r else None, float(r["peak_mb"]) if r else None,
                       avg[0] if avg else None))
        bench_variant = json.dumps(variant_settings((g.runs[attn].rec if attn in g.runs else {}).get("config")),
                                   sort_keys=True, default=str)
        known = (accuracy_variants or {}).get(attn)
        if r is None:
            why[attn] = _status_at(g.members[attn], length)
        elif r["peak_mb"] < MIN_FIT_MB:
            why[attn] = f"memory unresolved (<{MIN_FIT_MB:g} MB): not ranked"
        elif avg is None:
            others = (complete_elsewhere or {}).get(attn) or []
            why[attn] = f"no complete accuracy row in protocol {protocol}" + (
                f"; protocol {', '.join(others)} has one: report.smat_protocol={others[0]}" if others else "")
        elif known and bench_variant != "{}" and bench_variant not in known:
            why[attn] = "the bench measured other attention settings than the accuracy runs"
        elif (conflict := backbone_conflict(model_sizes(g.runs[attn].rec) if attn in g.runs else {},
                                            (accuracy_models or {}).get(attn))) is not None:
            why[attn] = conflict
    tasks = next(iter(averages.values()))[1] if averages else []
    acc_label = accuracy_label(tasks, protocol)
    lra_avg = list(tasks) == list(ref.LRA_TASKS)
    header = ["attention", "source", "Speed (ex/s)", "Peak MB", "LRA avg" if lra_avg else f"Avg {'+'.join(tasks) or '—'}", "SMAT"]
    table = Table(f"smat_{g.name.removeprefix('smat_')}", f"SMAT (eq. 10), N={length}, {g.title}; accuracy = {acc_label}", header, csv_header=SMAT_CSV)
    own, raw, compared = smat_rows(points, OWN, round_to=None, why=why)
    emphasise([r[-1] for r in own])
    table.rows += own
    table.csv_rows += raw
    paper = (length == PAPER_SMAT["length"] and g.batch == PAPER_SMAT["batch"] and g.task == PAPER_SMAT["task"]
             and g.model == PAPER_SMAT["model"])
    table.notes += [
        f"SMAT = S_norm + (1 - M_norm) + Acc_norm (eq. 10), min-max normalised (in brackets) over the compared set: the "
        f"{len(compared)} variant(s) with speed and resolved memory at N={length} and accuracy ({', '.join(compared) or 'none'}); "
        f"every figure is from N={length}, never another length; accuracy = {acc_label}.",
        "The score is the exact sum, stored unrounded in the CSV (smat = smat_exact); shown to 2 decimals. "
        "(The paper rounds the components before summing; only its own rows are computed that way.)",
        f"{MISSING} (reason): not scored (the bench failed or did not measure N, memory below {MIN_FIT_MB:g} MB is the "
        "CPU method's resolution, no complete accuracy row, another model than the accuracy runs, or fewer than two "
        "variants to normalise over). Bold = highest, underlined = second: a ranking of single measurements, not a "
        "significance claim.",
    ]
    if not paper:
        table.notes.append(f"Not AdaMRA Table 3's protocol (task text at N={PAPER_SMAT['length']}, batch "
                           f"{PAPER_SMAT['batch']}, model {PAPER_SMAT['model']}, T4 GPU): compare rankings within this table only.")
    if not lra_avg:
        table.notes.append("The accuracy term is not the LRA average (it needs all five tasks), so this is not the paper's SMAT.")
    return table, [p for p in points if p[0] in compared], acc_label  # type: ignore[misc]


def model_sizes(rec: dict[str, Any]) -> dict[str, Any]:
    """The backbone settings (:data:`MODEL_SIZES`) a record states."""
    m = (rec.get("config") or {}).get("model") or {}
    return {k: m[k] for k in MODEL_SIZES if k in m}


def backbone_conflict(bench: dict[str, Any], accuracy: list[dict[str, Any]] | None) -> str | None:
    """Why SMAT refuses to combine a bench on backbone ``bench`` with accuracy runs on ``accuracy``
    (:func:`model_sizes` of each), or None when every setting both state agrees (or none is stated)."""
    other = [m for m in accuracy or [] if any(k in bench and bench[k] != v for k, v in m.items())]
    if not bench or not other:
        return None
    label = lambda m: model_label({"config": {"model": m}})  # noqa: E731
    differ = sorted({k for m in other for k, v in m.items() if k in bench and bench[k] != v})
    return (f"another backbone: speed measured on model {label(bench)} (smat bench), accuracy on model "
            f"{' / '.join(sorted({label(m) for m in other}))} (accuracy runs; {', '.join('model.' + k for k in differ)} "
            f"differ); not combined: run the smat bench with the accuracy runs' model settings")


def accuracy_models(group: AccuracyGroup | None) -> dict[str, list[dict[str, Any]]]:
    """attention -> the backbones (:func:`model_sizes`) of its protocol row's runs (SMAT's backbone check)."""
    out: dict[str, list[dict[str, Any]]] = {}
    for (attn, labels), per in (group.rows.items() if group is not None else []):
        if not labels:
            out[attn] = [model_sizes(r.rec) for c in per.values() for r in c.runs.values()]
    return out


def accuracy_variants(group: AccuracyGroup | None) -> dict[str, set[str]]:
    """attention -> the JSON of the variant settings of its protocol row's cells (SMAT's identity check)."""
    out: dict[str, set[str]] = {}
    for (attn, labels), per in (group.rows.items() if group is not None else []):
        if not labels:
            out[attn] = {json.dumps({p: v for p, v in c.flat.items() if setting_class(p) == VARIANT and p != "attention_name"},
                                    sort_keys=True, default=str) for c in per.values()}
    return out


def smat_reference_table() -> Table:
    """AdaMRA Table 3 as published (T4 GPU), in its own table: the report never mixes devices."""
    header = ["model", "source", "Speed (ex/s)", "Peak MB", "LRA avg", "SMAT"]
    table = Table("smat_reference_table3", f"SMAT (eq. 10), published: {ref.TABLE3_SOURCE}, text at N=4096, batch 8",
                  header, csv_header=SMAT_CSV)
    refs: list[SmatPoint] = [(ref.label(m), s, mb, acc) for m, (s, mb, acc, _) in ref.ADAMRA_TABLE3.items()]
    table.rows, table.csv_rows, _ = smat_rows(refs, ref.TABLE3_SOURCE, round_to=2)
    table.notes.append("Normalised (in brackets) among the published models; recomputed from the printed inputs with the "
                       "paper's rounding (components to 2 decimals, then summed), which reproduces its printed scores; "
                       "smat_exact in the CSV is the unrounded sum.")
    return table


def figures(rec: dict, monitor: str) -> dict:
    """A record's ``efficiency.<monitor>`` block (``throughput``, ``peak_memory``), empty when absent."""
    return (rec.get("efficiency") or {}).get(monitor) or {}


def covered_from_step(rec: dict, monitor: str) -> int | None:
    """Step from which a record's ``throughput`` or ``peak_memory`` counts (0: the whole run; None:
    resumed, start unknown).

    Records written before ``<monitor>.from_step`` existed (2026-11-29) kept only the stretch after
    their last resume: its start is the last wall-clock segment's ``from_step``."""
    if "from_step" in figures(rec, monitor):
        return int(figures(rec, monitor)["from_step"])
    if not rec.get("resume_count"):
        return 0
    segments = figures(rec, "wall").get("segments") or []
    return int(segments[-1].get("from_step", 0)) if segments else None


def training_points(group: AccuracyGroup, averages: dict[str, tuple[float, list[str]]]) -> tuple[list[TradeoffPoint], str | None]:
    """Bubble-chart points from the accuracy runs themselves (no smat bench needed): training
    examples/s with the row's Avg, on one device only: the one most rows were measured on entirely
    (:func:`device_label`). A row's throughput is the mean over its runs on that device (a seed
    resumed or run elsewhere does not take the row off the chart; accuracy does not depend on the
    device, so the Avg stays the row's); rows with no run there are named. Circle size = peak
    training memory only where it separates variants (CUDA's allocator peak); a CPU figure is the
    whole process's resident peak, about the same for every variant, and is not drawn."""
    def speed(rec: dict) -> float | None:
        value = figures(rec, "throughput").get("train", {}).get("examples_per_s")
        return value if isinstance(value, (int, float)) and value > 0 else None

    rows = []
    for attn, (avg, _) in sorted(averages.items(), key=lambda kv: order(kv[0])):
        runs = [r.rec for c in group.rows.get((attn, ()), {}).values() for r in c.runs.values()]
        if runs and all(speed(r) is not None for r in runs):
            rows.append((attn, avg, runs, sorted({device_label(r) for r in runs})))
    # one device per chart: the one most rows were measured on entirely; the others are named
    counts = Counter(devs[0] for *_, devs in rows if len(devs) == 1)
    if not counts:
        return [], None
    device = min(counts, key=lambda d: (-counts[d], d))
    points: list[TradeoffPoint] = []
    methods, left_out, in_part = set(), [], []
    used = partial = partial_mem = 0
    for attn, avg, every, devs in rows:
        runs = [r for r in every if device_label(r) == device]
        if not runs:
            left_out.append(f"{attn} ({', '.join(devs)})")
            continue
        if len(runs) < len(every):
            others = ", ".join(d for d in devs if d != device)
            in_part.append(f"{attn} ({len(runs)} of {len(every)} runs; the rest on {others})")
        mem = [figures(r, "peak_memory").get("train_mb") for r in runs]
        shown = max(mem) if all(isinstance(v, (int, float)) and v > 0 for v in mem) else None
        points.append((attn, sum(speed(r) for r in runs) / len(runs), shown, avg))
        methods |= {str(figures(r, "peak_memory").get("method")) for r in runs}
        used += len(runs)
        partial += sum(covered_from_step(r, "throughput") != 0 for r in runs)
        partial_mem += sum(covered_from_step(r, "peak_memory") != 0 for r in runs)
    memory = all(m.startswith("cuda") for m in methods) and all(p[2] is not None for p in points)
    if not memory:
        points = [(n, s, None, a) for n, s, _, a in points]
    tasks = next(iter(averages.values()))[1]

    def resumed(count: int, what: str, monitor: str) -> str:
        return (f"; {what} of {count} of {used} runs covers only their steps after a resume "
                f"(earlier stretches not kept: {monitor}.from_step)" if count else "")

    return points, (f"this suite: training throughput of the protocol {group.protocol} runs on {device}; "
                    f"accuracy = {accuracy_label(tasks, group.protocol)}"
                    + ("" if memory else "; circle size: not memory (a CPU run's peak is the whole process's, "
                                         "about the same for every variant)")
                    + resumed(partial, "throughput", "throughput")
                    + resumed(partial_mem if memory else 0, "peak memory", "peak_memory")
                    + (f"; throughput from the runs on {device} only: {'; '.join(in_part)}" if in_part else "")
                    + (f"; left out, throughput measured on another device: {'; '.join(left_out)}" if left_out else ""))
