"""Behavioural fingerprints for records written before fingerprints existed, measured on the code
their stretches ran on.

    python -m lra.training.backfill results/xiong2021-listops-cpu results/xiong2021-listops-h200

For every training record of the folders without a ``fingerprint``, every commit its stretches ran
on (``efficiency.wall.segments[].git_commit``; a record without segments: its start's) is checked
out in a temporary worktree, and a fresh interpreter there builds the record's model with THAT
commit's code (its ``lra.training.train.build_module`` on the record's stored config) and measures
it with today's :func:`lra.training.fingerprint.measure` (loaded from this file's tree, so every
commit is measured the same way). The record then gets:

* ``fingerprint``: the measurement at its last stretch's commit, with ``backfilled``: the commits
  measured and, per commit, ``agrees`` or how it differs from the last one;
* per stretch, ``source_sha1`` of its commit's model source (:func:`lra.stamp.source_sha1`).

Commits that cannot be checked out (a stretch without a commit) are listed as ``unknown``. Nothing
else in the record changes; records that already carry a fingerprint are left as they are.
"""
from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

from lra.files import write_json
from lra.identity import behaviour_difference
from lra.records import record_files
from lra.stamp import ROOT, source_sha1

CHILD = r"""
import importlib.util, json, sys
sys.path.insert(0, ".")
spec = importlib.util.spec_from_file_location("_fingerprint_now", sys.argv[1])
fp = importlib.util.module_from_spec(spec); spec.loader.exec_module(fp)
from omegaconf import OmegaConf
from lra.training.train import build_module
configs = json.load(sys.stdin)
out = {key: fp.behavioural_fingerprint(OmegaConf.create(cfg), build_module) for key, cfg in configs.items()}
print("FINGERPRINTS " + json.dumps(out))
"""


def segments(rec: dict[str, Any]) -> list[dict[str, Any]]:
    return ((rec.get("efficiency") or {}).get("wall") or {}).get("segments") or []


def stretch_commits(rec: dict[str, Any]) -> list[str | None]:
    """The commit of each stretch, in order (a record without segments: its start's)."""
    return [s.get("git_commit") for s in segments(rec)] or [(rec.get("stamp") or {}).get("git_commit")]


def measure_at(commit: str, configs: dict[str, dict[str, Any]]) -> tuple[dict[str, Any], str]:
    """Fingerprints of ``configs`` (key -> resolved config) built by ``commit``'s code, and that
    commit's model-source hash."""
    with tempfile.TemporaryDirectory(prefix="lra-backfill-") as tmp:
        tree = Path(tmp) / "tree"
        subprocess.run(["git", "worktree", "add", "--detach", "--quiet", str(tree), commit], cwd=ROOT, check=True)
        try:
            proc = subprocess.run([sys.executable, "-c", CHILD, str(Path(__file__).with_name("fingerprint.py"))],
                                  cwd=tree, input=json.dumps(configs), capture_output=True, text=True, check=False)
            line = next((x for x in proc.stdout.splitlines() if x.startswith("FINGERPRINTS ")), None)
            if line is None:
                raise RuntimeError(f"commit {commit}: the fingerprint failed:\n{proc.stderr[-3000:]}")
            return json.loads(line.split(" ", 1)[1]), source_sha1(tree)
        finally:
            subprocess.run(["git", "worktree", "remove", "--force", str(tree)], cwd=ROOT, check=False)


def backfill(folders: list[Path]) -> list[str]:
    """Fingerprint every record of ``folders`` that has none; returns one line per record."""
    todo = {}
    for folder in folders:
        for path in record_files(folder):
            rec = json.loads(path.read_text())
            if rec.get("mode") == "train" and not rec.get("fingerprint"):
                todo[str(path)] = rec
    by_commit: dict[str, dict[str, dict[str, Any]]] = {}
    for key, rec in todo.items():
        for commit in {c for c in stretch_commits(rec) if c}:
            by_commit.setdefault(commit, {})[key] = rec["config"]
    measured: dict[tuple[str, str], dict[str, Any]] = {}
    sources: dict[str, str] = {}
    for i, (commit, configs) in enumerate(sorted(by_commit.items()), 1):
        print(f"[backfill] {i}/{len(by_commit)} commit {commit[:10]}: {len(configs)} record(s)", flush=True)
        found, sources[commit] = measure_at(commit, configs)
        measured.update({(key, commit): fp for key, fp in found.items()})
    lines = []
    for key, rec in sorted(todo.items()):
        commits = stretch_commits(rec)
        known = [c for c in commits if c]
        last = known[-1]
        ref = measured[(key, last)]
        per = {c[:10] if c else "unknown": (behaviour_difference(measured[(key, c)], ref) or "agrees") if c else "unknown"
               for c in commits}
        rec["fingerprint"] = {**ref, "backfilled": {
            "how": "python -m lra.training.backfill: each stretch's commit checked out, the record's config built by "
                   "its code, measured by lra.training.fingerprint; this is the last stretch's", "commits": per}}
        for seg in segments(rec):
            if seg.get("git_commit"):
                seg["source_sha1"] = sources[seg["git_commit"]]
        write_json(Path(key), rec)
        lines.append(f"{Path(key).name}: {', '.join(f'{c} {v}' for c, v in per.items())}")
    return lines


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("folders", nargs="+", type=Path, help="results folders (each holding runs/)")
    for line in backfill(parser.parse_args(argv).folders):
        print(line)


if __name__ == "__main__":
    main()
