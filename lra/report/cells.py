"""A cell is one experiment: which training runs the report pools.

The experiment identity is the resume key's: :func:`lra.identity.identity` (one module, imported
by resume and by the report) applied to the record's stored, resolved ``config``, with the seed
taken out: the top-level ``seed`` and the settings that follow it by default
(:data:`lra.identity.SEED_FOLLOWING`: ``task.datamodule.seed`` is ``${seed}``) where they equal the
run's own seed. That is decided per run from its own config: a run that fixes its data seed is
another experiment, and changes nothing for the others. The config hash printed with each cell is
the SHA-1 of that seedless identity.

Rules, written down:

* Runs pool into one cell only when their seedless identities are equal, their test sets are
  (the label/length fingerprint of the prediction files; a run without one joins its identity's
  most common test set), AND their code behaves alike: their behavioural fingerprints agree
  (:func:`lra.identity.behaviour_difference`; runs are taken oldest first, each joins the first
  group whose first run it agrees with; a record from before fingerprints joins the largest). The
  cell lists its seeds, config hash, the commits of every stretch of its runs (a cell mixing
  commits says so) and number of test examples.
* Rows of a table: (attention, protocol-defining command-line overrides) (:mod:`lra.report.protocols`).
* The protocol's reference, per protocol and task, from the runs without protocol-defining
  overrides: the protocol-defining settings (:func:`lra.identity.protocol_settings`: task, model,
  optimiser, trainer) that most variants share (each variant votes once, with its most common;
  ties: softmax's, then the smallest), and the test set most of those runs used. A cell that
  differs from it (a learning rate edited in a YAML, another test set) is a custom row, labelled
  with its config hash and the differences, even when its row holds no other run.
* Of the cells of one row and task that match the reference, the one with the most seeds stays
  (ties: the newest run); each other one becomes a custom row, labelled the same way.
* One seed run twice with one identity: the newest record counts; the older is listed as a
  superseded duplicate.
"""
from __future__ import annotations

import json
from collections import Counter
from dataclasses import dataclass, field
from typing import Any

from lra.identity import behaviour_difference, config_hash, protocol_settings, seed_following, seedless
from lra.report import reference as ref
from lra.report.protocols import protocol_overrides
from lra.report.screening import SUPERSEDED, Ledger, Run
from lra.report.tables import OWN, slug

RowKey = tuple[str, tuple[str, ...]]  # (attention, labels: protocol-defining overrides, then "config <hash>: diffs")
ATTENTION_SECTIONS = ("attention", "attention_name")  # what a variant-vs-baseline comparison may differ in
MAX_DIFFS = 3
CONFIG_LABEL = "config "


def order(name: str) -> tuple[int, str]:
    return (0 if name == "softmax" else 1, name)


def task_order(task: str) -> tuple[int, str]:
    return (ref.LRA_TASKS.index(task), "") if task in ref.LRA_TASKS else (len(ref.LRA_TASKS), task)


def differences(base: dict[str, Any], other: dict[str, Any], skip: tuple[str, ...] = ()) -> list[str]:
    """The settings in which ``other`` differs from ``base`` (``key=value`` of other; ``~key``: absent there)."""
    keys = sorted(k for k in set(base) | set(other) if k.split(".", 1)[0] not in skip and base.get(k, KeyError) != other.get(k, KeyError))
    return [f"~{k}" if k not in other else f"{k}={json.dumps(other[k], default=str)}" for k in keys]


def diff_label(base: dict[str, Any], other: dict[str, Any], own_hash: str, test_set: str | None = None,
               behaviour: str | None = None) -> str:
    """'config <hash>: <differences>' (``test_set``: named when the cell's test set is another one;
    ``behaviour``: how its code's fingerprint differs from the row's)."""
    diffs = (([f"test set {test_set}"] if test_set else [])
             + ([f"code that behaves differently ({behaviour}, the row's)"] if behaviour else [])
             + differences(base, other))
    shown = ", ".join(diffs[:MAX_DIFFS]) + (f" (+{len(diffs) - MAX_DIFFS} more)" if len(diffs) > MAX_DIFFS else "")
    return f"{CONFIG_LABEL}{own_hash}: {shown or 'the same settings'}"


@dataclass
class ExperimentCell:
    """One experiment's runs on one task, the report's unit of pooling: seed -> run (the newest record
    per seed). What a table shows of it is a :class:`lra.report.tables.TableCell`."""
    flat: dict[str, Any]          # the seedless identity, flattened
    runs: dict[int, Run] = field(default_factory=dict)
    test_set: str | None = None   # the label/length fingerprint its runs share (None: no prediction files)
    behaviour: dict[str, Any] | None = None  # the behavioural fingerprint of its first run (None: none recorded)

    @property
    def config_hash(self) -> str:
        return config_hash(self.flat)

    @property
    def seeds(self) -> list[int]:
        return sorted(self.runs)

    @property
    def n(self) -> int:
        return len(self.runs)

    def values(self, metric: str) -> list[float]:
        return [self.runs[s].value(metric) for s in self.seeds]

    @property
    def commits(self) -> list[str]:
        return sorted({c for r in self.runs.values() for c in r.commits})

    @property
    def n_tests(self) -> list[int]:
        return sorted({r.n_test for r in self.runs.values() if r.n_test is not None})

    @property
    def with_predictions(self) -> list[Run]:
        return [self.runs[s] for s in self.seeds if self.runs[s].preds is not None]

    @property
    def newest(self) -> tuple[str, str]:
        return max(r.chrono for r in self.runs.values())


@dataclass
class AccuracyGroup:
    """One accuracy table: row -> task -> cell."""
    protocol: str
    custom: bool
    rows: dict[RowKey, dict[str, ExperimentCell]] = field(default_factory=dict)

    def file_name(self, kind: str) -> str:
        """The stem of one of this group's files: ``<kind>_[custom_]<protocol>``."""
        return f"{kind}_{'custom_' if self.custom else ''}{slug(self.protocol)}"

    @property
    def name(self) -> str:
        return self.file_name("accuracy")

    @property
    def where(self) -> str:
        return f"{'custom runs of ' if self.custom else ''}protocol {self.protocol}"

    @property
    def tasks(self) -> list[str]:
        return sorted({t for per in self.rows.values() for t in per}, key=task_order)

    def row_keys(self) -> list[RowKey]:
        return sorted(self.rows, key=lambda k: (order(k[0]), k[1]))

    def runs(self) -> list[Run]:
        return [r for per in self.rows.values() for c in per.values() for r in c.runs.values()]


def labels_text(labels: tuple[str, ...]) -> str:
    """'task.max_len=128 optim.lr=0.001; config 1a2b3c4d: optim.eps=1e-08': overrides, then config differences."""
    plain = " ".join(x for x in labels if not x.startswith(CONFIG_LABEL))
    return "; ".join(x for x in (plain, *(x for x in labels if x.startswith(CONFIG_LABEL))) if x)


def source_column(custom: bool) -> str:
    """The header of a row's second column: what a custom row differs in, else where the row is from."""
    return "differs in" if custom else "source"


def source_text(key: RowKey, custom: bool) -> str:
    """A row's second column: its labels in a custom table, else :data:`~lra.report.tables.OWN`."""
    return labels_text(key[1]) if custom else OWN


def row_text(key: RowKey) -> str:
    """A row's name in plots and comparisons: the variant, with its labels if any."""
    return key[0] + (f" ({labels_text(key[1])})" if key[1] else "")


def _one_per_seed(runs: list[Run], ledger: Ledger) -> dict[int, Run]:
    """seed -> the newest run; the older ones go to the ledger as superseded duplicates."""
    by_seed: dict[int, Run] = {}
    for run in sorted(runs, key=lambda r: r.chrono, reverse=True):
        if run.seed in by_seed:
            keep = by_seed[run.seed]
            ledger.exclude(run, SUPERSEDED, f"a newer record of the same experiment and seed counts: {keep.run_id}")
        else:
            by_seed[run.seed] = run
    return dict(sorted(by_seed.items()))


def _split_by_test_set(runs: list[Run]) -> dict[str | None, list[Run]]:
    """Runs of one identity by test-set fingerprint; runs without prediction files join the most
    common one (ties: the smallest), since nothing says they ran on another."""
    counts = Counter(r.test_set for r in runs if r.test_set is not None)
    common = min(counts, key=lambda k: (-counts[k], k)) if counts else None
    out: dict[str | None, list[Run]] = {}
    for run in runs:
        out.setdefault(run.test_set if run.test_set is not None else common, []).append(run)
    return out


def _split_by_behaviour(runs: list[Run]) -> dict[int, list[Run]]:
    """Runs of one identity and test set by what their code does (module rules): group 0 is the
    oldest run's."""
    groups: list[list[Run]] = []
    unknown: list[Run] = []
    for run in sorted(runs, key=lambda r: r.chrono):
        if run.behaviour is None:
            unknown.append(run)
            continue
        home = next((g for g in groups if behaviour_difference(run.behaviour, g[0].behaviour) is None), None)
        if home is None:
            groups.append(home := [])
        home.append(run)
    if not groups:
        return {0: unknown}
    largest = max(range(len(groups)), key=lambda i: (len(groups[i]), -i))
    groups[largest].extend(unknown)
    return dict(enumerate(groups))


def _first_behaviour(runs: list[Run]) -> dict[str, Any] | None:
    return next((r.behaviour for r in sorted(runs, key=lambda r: r.chrono) if r.behaviour is not None), None)


def _vote(values: list[str], preferred: str | None) -> str | None:
    """The most common value (ties: ``preferred``, then the smallest)."""
    counts = Counter(values)
    return min(counts, key=lambda k: (-counts[k], k != preferred, k)) if counts else None


def _references(train: list[Run], flats: dict[str, dict[str, Any]], hashes: dict[str, str]
                ) -> dict[tuple[str, str], tuple[str | None, str | None]]:
    """(protocol, task) -> (the protocol settings' JSON, the test set) of the protocol's reference
    runs (module rules): each variant votes once, with its most common settings."""
    per_variant: dict[tuple[str, str], dict[str, list[Run]]] = {}
    for run in train:
        if not protocol_overrides(run.rec):
            key = (str(run.rec["protocol"]), str(run.rec["task"]))
            per_variant.setdefault(key, {}).setdefault(str(run.rec["attention"]), []).append(run)
    out = {}
    for key, variants in per_variant.items():
        settings = {a: _vote([_settings_json(flats[hashes[r.run_id]]) for r in rs], None) for a, rs in variants.items()}
        sets = {a: _vote([r.test_set for r in rs if r.test_set is not None], None) for a, rs in variants.items()}
        out[key] = (_vote(list(settings.values()), settings.get("softmax")),
                    _vote([v for v in sets.values() if v is not None], sets.get("softmax")))
    return out


def _settings_json(flat: dict[str, Any]) -> str:
    return json.dumps(protocol_settings(flat), sort_keys=True, default=str)


def accuracy_groups(runs: list[Run], ledger: Ledger) -> list[AccuracyGroup]:
    """The accuracy tables built from the validated training runs (see the module rules)."""
    train = [r for r in runs if r.rec["mode"] == "train"]
    buckets: dict[tuple, dict[str, list[Run]]] = {}
    flats: dict[str, dict[str, Any]] = {}
    hashes: dict[str, str] = {}
    for run in train:
        flat = seedless(run.ident, seed_following(run.ident))
        h = config_hash(flat)
        flats[h], hashes[run.run_id] = flat, h
        key = (str(run.rec["protocol"]), protocol_overrides(run.rec), str(run.rec["attention"]), str(run.rec["task"]))
        buckets.setdefault(key, {}).setdefault(h, []).append(run)
    references = _references(train, flats, hashes)
    groups: dict[tuple[str, bool], AccuracyGroup] = {}
    for (protocol, overrides, attention, task), by_hash in sorted(buckets.items()):
        cells = {(h, ts, b): ExperimentCell(flats[h], _one_per_seed(brs, ledger), ts, _first_behaviour(brs))
                 for h, hrs in by_hash.items() for ts, rs in _split_by_test_set(hrs).items()
                 for b, brs in _split_by_behaviour(rs).items()}
        ref_settings, ref_set = references.get((protocol, task), (None, None))
        eligible = [k for k, c in cells.items()
                    if overrides or (_settings_json(c.flat) == ref_settings and (ref_set is None or c.test_set in (None, ref_set)))]
        main = max(eligible, key=lambda k: (cells[k].n, cells[k].newest, k[0], k[1] or "", -k[2])) if eligible else None
        base = cells[main].flat if main is not None else (json.loads(ref_settings) if ref_settings else {})
        base_set = cells[main].test_set if main is not None else ref_set
        base_behaviour = cells[main].behaviour if main is not None else None
        for k, cell in sorted(cells.items(), key=lambda kv: (kv[0][0], kv[0][1] or "", kv[0][2])):
            other = cell.flat if main is not None else protocol_settings(cell.flat)
            shown_set = cell.test_set if cell.test_set not in (None, base_set) else None
            behaves = behaviour_difference(cell.behaviour, base_behaviour)
            labels = overrides if k == main else (*overrides, diff_label(base, other, k[0], shown_set, behaves))
            g = groups.setdefault((protocol, bool(labels)), AccuracyGroup(protocol, bool(labels)))
            g.rows.setdefault((attention, labels), {})[task] = cell
    return [groups[k] for k in sorted(groups)]
