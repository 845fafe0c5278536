"""ListOps (Nangia & Bowman 2018, LRA version): generator, official-format TSV, tokeniser, DataModule.

Generator: faithful to LRA's ``listops.py`` (facts in ``shared/lra-facts.md``): at depth < 10 a node
is an operator with probability 0.25 (k ~ U{2..10} children, operator uniform over MIN/MAX/MED/SM),
otherwise (and always at the maximum depth) a digit; the root is at depth 1. Token length counts
operators, digits and ``]`` (2 + children per operator node) and is kept when strictly between 500
and 2000. Choices the original leaves open, made here:

* seeded: draw ``i`` of chunk ``c`` uses ``random.Random(f"{seed}:{c}")``; chunks are processed in
  order (on all cores) and de-duplicated keeping first occurrence, so the output does not depend
  on the number of workers. The first 96k/2k/2k unique expressions are train/val/test. A small
  request (<= 2000 expressions) reads the stream lazily and stops at its last expression (a 400-row
  request draws hundreds of trees, not 80k); its rows are the same prefix a larger request gets.
* a draw stops as soon as it exceeds the length bound (rejection sampling stays exact: such a tree
  is rejected whatever the rest of it would have been), which makes generation ~2x faster.
* resumable: every drawn chunk is kept in ``.generated-<key>.chunks/`` next to the output until the
  TSVs are complete, so an interrupted generation (Ctrl-C, a kill) redraws only the chunks it had not
  finished; the result is the one an uninterrupted generation gives.

TSV: header ``Source<TAB>Target``; sources keep the binarisation parentheses of the original
(``( ( ( [MAX 4 ) 3 ) ] )``), so one reader serves generated and official release files.

Tokeniser (LRA input pipeline): drop ``(``/``)``, map ``]`` to ``X``, split on whitespace, truncate
and pad (0) to ``max_len``. ``tokenization="paper"`` is the paper-era variant that drops all
brackets (``[MAX`` -> ``MAX``, ``]`` removed). The vocabulary is fixed (not learnt from data):
0 pad, 1 unknown, then the 15 symbols.
"""
from __future__ import annotations

import csv
import gzip
import json
import os
import random
import shutil
import time
from pathlib import Path
from typing import Any, Callable, Iterable, Iterator

import numpy as np

from lra.files import write_bytes, write_text
from lra.badinput import BadInputError, ConfigError, DataMissingError
from lra.data import layout
from lra.data.cache import build_once, save_split, settings_key
from lra.data.datamodule import CachedDataModule
from lra.data.progress import Progress
from lra.data.workers import WorkerPool

OPERATORS = ("[MIN", "[MAX", "[MED", "[SM")
END = "]"
VALUE_P = 0.25
SYMBOLS = [str(d) for d in range(10)] + ["[MIN", "[MAX", "[MED", "[SM", "X"]
PAD, UNK = 0, 1
VOCAB = {s: i + 2 for i, s in enumerate(SYMBOLS)}
for _op in OPERATORS:  # paper-era tokens share the ids of their bracketed forms
    VOCAB[_op[1:]] = VOCAB[_op]
VOCAB_SIZE = len(SYMBOLS) + 2  # 17
CHUNK_DRAWS = 20000  # draws per chunk of the seeded stream (part of what defines the stream)


# ----------------------------------------------------------------------------- semantics
def apply_op(op: str, values: list[int]) -> int:
    """Value of an operator node. MED truncates the median (even count: mean of the two middle
    values, then ``int``); SM is the sum mod 10."""
    if op == "[MIN":
        return min(values)
    if op == "[MAX":
        return max(values)
    if op == "[MED":
        return int(np.median(values))
    if op == "[SM":
        return sum(values) % 10
    raise ValueError(f"unknown ListOps operator {op!r}")


def evaluate(source: str) -> int:
    """Evaluate an expression in either TSV form (with or without parentheses)."""
    stack: list[list] = []
    result = None
    for tok in source.replace("(", " ").replace(")", " ").split():
        if tok in OPERATORS:
            stack.append([tok])
        elif tok == END:
            op, *values = stack.pop()
            val = apply_op(op, values)
            if stack:
                stack[-1].append(val)
            else:
                result = val
        elif tok.isdigit() and len(tok) == 1:
            if stack:
                stack[-1].append(int(tok))
            else:
                result = int(tok)
        else:
            raise ValueError(f"unexpected ListOps token {tok!r}")
    if stack or result is None:
        raise ValueError("unbalanced ListOps expression")
    return result


def outer_operator(source: str) -> str:
    """The root's operator without its bracket (``MAX``, ``MED``, ``MIN``, ``SM``): the first operator in
    reading order, since every other one sits inside its brackets. A bare digit has none: ``ValueError``."""
    for tok in source.replace("(", " ").replace(")", " ").split():
        if tok in OPERATORS:
            return tok[1:]
        if tok.isdigit():
            break
    raise ValueError(f"no outermost operator in ListOps expression {source[:60]!r}")


def operator_depth(source: str) -> int:
    """Operators on the longest root-to-leaf path (``[MAX 1 2 ]``: 1; a bare digit: 0). The generator puts
    operators at depth < ``max_depth`` only, so at its default (10) this is at most 9."""
    depth = deepest = 0
    for tok in source.replace("(", " ").replace(")", " ").split():
        if tok in OPERATORS:
            depth += 1
            deepest = max(deepest, depth)
        elif tok == END:
            depth -= 1
    return deepest


# ----------------------------------------------------------------------------- generator
class _TooLong(Exception):
    pass


def _draw(rng: random.Random, depth: int, max_depth: int, max_args: int, parts: list[str], count: list[int], limit: int) -> int:
    """Append the parenthesised string of one (sub)tree to ``parts``; return its value."""
    if depth < max_depth and rng.random() <= VALUE_P:
        # original: r > VALUE_P -> leaf; so an operator node when r <= VALUE_P
        k = rng.randint(2, max_args)
        op = rng.choice(OPERATORS)
        count[0] += 2
        if count[0] >= limit:
            raise _TooLong
        parts.append("( " * (k + 1) + op)
        values = []
        for _ in range(k):
            parts.append(" ")
            values.append(_draw(rng, depth + 1, max_depth, max_args, parts, count, limit))
            parts.append(" )")
        parts.append(" ] )")
        return apply_op(op, values)
    value = rng.randrange(10)
    count[0] += 1
    if count[0] >= limit:
        raise _TooLong
    parts.append(str(value))
    return value


def generate_one(rng: random.Random, max_depth: int = 10, max_args: int = 10, max_length: int = 2000) -> tuple[str, int, int] | None:
    """One draw: ``(source, label, token_length)``, or None if it reached ``max_length`` tokens."""
    parts: list[str] = []
    count = [0]
    try:
        value = _draw(rng, 1, max_depth, max_args, parts, count, max_length)
    except _TooLong:
        return None
    return "".join(parts), value, count[0]


def _accepted(args: tuple) -> Iterator[tuple[str, int]]:
    """The kept expressions of chunk ``index``, in draw order (lazily: a caller may stop early)."""
    seed, index, draws, min_length, max_length, max_depth, max_args = args
    rng = random.Random(f"{seed}:{index}")
    for _ in range(draws):
        ex = generate_one(rng, max_depth, max_args, max_length)
        if ex is not None and ex[2] > min_length:
            yield ex[0], ex[1]


def _chunk(args: tuple) -> list[tuple[str, int]]:
    return list(_accepted(args))


class ChunkStore:
    """Drawn chunks kept on disk (``chunk-<index>.tsv.gz``, each written atomically), so an interrupted
    generation resumes where it stopped: a chunk is a pure function of its index and the settings,
    which ``settings.json`` pins (a store written with other settings is emptied). gzip level 1:
    a full chunk is 10.7 MB of text, 2.3 MB compressed in 0.15 s (the whole stream: ~150 MB, not 680)."""

    def __init__(self, folder: Path, settings: dict[str, Any]) -> None:
        self.folder = Path(folder)
        self.settings = settings
        marker = self.folder / "settings.json"
        if self.folder.is_dir() and (not marker.is_file() or json.loads(marker.read_text()) != settings):
            shutil.rmtree(self.folder)
        if not marker.is_file():
            write_text(marker, json.dumps(settings, sort_keys=True) + "\n")
        self.found = len(list(self.folder.glob("chunk-*.tsv.gz")))  # kept by an earlier, interrupted run

    def _path(self, index: int) -> Path:
        return self.folder / f"chunk-{index}.tsv.gz"

    def has(self, index: int) -> bool:
        return self._path(index).is_file()

    def load(self, index: int) -> list[tuple[str, int]]:
        rows = []
        for line in gzip.decompress(self._path(index).read_bytes()).decode("utf-8").splitlines():
            source, label = line.rsplit("\t", 1)
            rows.append((source, int(label)))
        return rows

    def save(self, index: int, rows: list[tuple[str, int]]) -> None:
        text = "".join(f"{source}\t{label}\n" for source, label in rows)
        write_bytes(self._path(index), gzip.compress(text.encode("utf-8"), compresslevel=1))


def _lazy(args: tuple, store: ChunkStore | None) -> Iterator[tuple[str, int]]:
    """A chunk read lazily; stored once it was drawn to its end (a reader that stops early leaves
    it unstored: it is cheap to redraw the part it read)."""
    index = args[1]
    if store is not None and store.has(index):
        yield from store.load(index)
        return
    rows = []
    for row in _accepted(args):
        rows.append(row)
        yield row
    if store is not None:
        store.save(index, rows)


def generate(
    n_total: int,
    seed: int = 0,
    min_length: int = 500,
    max_length: int = 2000,
    max_depth: int = 10,
    max_args: int = 10,
    workers: int | None = None,
    chunk_draws: int | None = None,
    progress: Callable[[int], None] | None = None,
    store: Path | None = None,
) -> list[tuple[str, int]]:
    """The first ``n_total`` unique expressions of the seeded stream (independent of ``workers``).

    The stream is chunk 0, 1, 2, ... in order, each chunk ``chunk_draws`` draws of its own RNG. A
    small request (serial) reads it lazily and stops at the ``n_total``-th unique expression; a
    large one (parallel) draws whole chunks, ``2 x workers`` at a time, and keeps the same prefix.
    ``progress(done)`` is called after each chunk. ``store``: a folder that keeps every drawn chunk,
    so that a generation interrupted by Ctrl-C or a kill resumes from the chunks it had (the output
    is the same as an uninterrupted generation's).
    """
    if not 0 <= min_length < max_length:
        raise ValueError(f"ListOps length bounds must satisfy 0 <= min_length < max_length, got {min_length}, {max_length}")
    workers = workers or os.cpu_count() or 1
    chunk_draws = chunk_draws or CHUNK_DRAWS
    settings = (min_length, max_length, max_depth, max_args)
    chunks = None if store is None else ChunkStore(store, {"seed": seed, "chunk_draws": chunk_draws, "min_length": min_length,
                                                          "max_length": max_length, "max_depth": max_depth, "max_args": max_args})
    if chunks is not None and chunks.found:
        print(f"[listops] resuming an interrupted generation: {chunks.found} chunks of {chunk_draws} draws already "
              f"drawn ({store})", flush=True)
    seen: set[str] = set()
    data: list[tuple[str, int]] = []
    index = 0
    parallel = workers > 1 and n_total > 2000
    with WorkerPool(workers if parallel else 1) as pool:  # Ctrl-C: workers killed at once, drawn chunks kept
        while len(data) < n_total:
            batch = [(seed, index + i, chunk_draws, *settings) for i in range(2 * workers if parallel else 1)]
            index += len(batch)
            todo = [args for args in batch if chunks is None or not chunks.has(args[1])]
            drawn = iter(pool.map(_chunk, todo)) if parallel else None
            for args in batch:
                if not parallel:
                    chunk: Iterable = _lazy(args, chunks)
                elif chunks is not None and chunks.has(args[1]):
                    chunk = chunks.load(args[1])
                else:
                    chunk = next(drawn)
                    if chunks is not None:
                        chunks.save(args[1], chunk)
                for source, label in chunk:
                    if source not in seen:
                        seen.add(source)
                        data.append((source, label))
                        if len(data) == n_total:
                            break
                if progress is not None:
                    progress(len(data))
                if len(data) == n_total:
                    break
            if index > 10_000 and not data:
                raise RuntimeError(f"ListOps generator produced nothing in {index} chunks: the length bounds ({min_length}, {max_length}) cannot be met at max_depth={max_depth}")
    return data


def write_tsv(path: Path, rows: Iterable[tuple[str, int]]) -> None:
    """Official release format: header ``Source<TAB>Target``; written atomically."""
    lines = ["Source\tTarget"] + [f"{s}\t{t}" for s, t in rows]
    write_text(path, "\n".join(lines) + "\n")


def read_tsv(path: Path) -> Iterator[tuple[str, int]]:
    """Rows of a ListOps TSV (generated or official, LF or CRLF). Malformed rows raise with the line."""
    with open(path, newline="", encoding="utf-8") as f:
        reader = csv.reader(f, delimiter="\t")
        header = next(reader, None)
        if header is None or [h.strip() for h in header[:2]] != ["Source", "Target"]:
            raise BadInputError(f"{path}: expected the header 'Source<TAB>Target', got {header!r}")
        for row in reader:
            if not row or (len(row) == 1 and not row[0].strip()):
                continue
            if len(row) != 2 or not row[1].strip().lstrip("-").isdigit():
                raise BadInputError(f"{path}:{reader.line_num}: malformed row {row!r} (expected 'Source<TAB>Target' with an integer target)")
            yield row[0].strip(), int(row[1].strip())


# ----------------------------------------------------------------------------- tokeniser
def tokenize(source: str, mode: str = "lra") -> list[str]:
    """``lra``: drop parentheses, ``]`` -> ``X``. ``paper``: drop every bracket."""
    text = source.replace("(", " ").replace(")", " ")
    if mode == "lra":
        text = text.replace("]", "X")
    elif mode == "paper":
        text = text.replace("]", " ").replace("[", "")
    else:
        raise ConfigError(f"unknown task.tokenization={mode!r}; valid: lra, paper")
    return text.split()


def encode(sources: list[str], max_len: int, mode: str = "lra",
           progress: Callable[[int], None] | None = None) -> tuple[np.ndarray, np.ndarray]:
    ids = np.zeros((len(sources), max_len), dtype=np.uint8)
    lengths = np.zeros(len(sources), dtype=np.int32)
    for i, s in enumerate(sources):
        if progress is not None and i % 1000 == 0:
            progress(i)
        toks = [VOCAB.get(t, UNK) for t in tokenize(s, mode)[:max_len]]
        ids[i, : len(toks)] = toks
        lengths[i] = len(toks)
    return ids, lengths


# ----------------------------------------------------------------------------- DataModule
class ListOpsDataModule(CachedDataModule):
    task_name = "listops"

    def __init__(
        self,
        data_dir: str,
        max_len: int = 2000,
        batch_size: int = 32,
        source: str = "generate",
        tokenization: str = "lra",
        official_dir: str | None = None,
        generator: dict[str, Any] | None = None,
        **kwargs: Any,
    ) -> None:
        super().__init__(data_dir, max_len, batch_size, **kwargs)
        if source not in ("generate", "official"):
            raise ConfigError(f"unknown task.datamodule.source={source!r}; valid: generate, official")
        tokenize("", tokenization)  # validates the mode early
        self.source = source
        self.tokenization = tokenization
        self.official_dir = layout.LISTOPS.at(self.data_dir, official_dir)
        gen = {"seed": 0, "n_train": 96000, "n_val": 2000, "n_test": 2000, "min_length": 500,
               "max_length": 2000, "max_depth": 10, "max_args": 10}
        gen.update(dict(generator or {}))
        for key in ("n_train", "n_val", "n_test"):
            if int(gen[key]) <= 0:
                raise ConfigError(f"task.datamodule.generator.{key}={gen[key]} must be positive")
        self.gen = gen

    def tsv_dir(self) -> Path:
        if self.source == "official":
            return self.official_dir
        return self.data_dir.resolve() / "listops" / f"generated-{settings_key(self.gen)}"

    def chunk_dir(self) -> Path:
        """Where an unfinished generation keeps its drawn chunks (removed once the TSVs are complete)."""
        tsv_dir = self.tsv_dir()
        return tsv_dir.with_name(f".{tsv_dir.name}.chunks")

    def settings(self) -> dict[str, Any]:
        src = {"official": str(self.official_dir.resolve())} if self.source == "official" else {"generated": self.gen}
        return {"format": 1, "max_len": self.max_len, "tokenization": self.tokenization, **src}

    def _generate_tsvs(self, directory: Path) -> None:
        g = self.gen
        total = g["n_train"] + g["n_val"] + g["n_test"]
        start = time.perf_counter()
        shown = Progress("[listops] generating", total, "expressions")
        rows = generate(total, seed=g["seed"], min_length=g["min_length"], max_length=g["max_length"],
                        max_depth=g["max_depth"], max_args=g["max_args"], progress=shown.update,
                        store=self.chunk_dir())
        splits = {"train": rows[: g["n_train"]], "val": rows[g["n_train"]: g["n_train"] + g["n_val"]],
                  "test": rows[g["n_train"] + g["n_val"]:]}
        for split, part in splits.items():
            write_tsv(directory / layout.LISTOPS_FILES[split], part)
        print(f"[listops] generated {total} expressions in {time.perf_counter() - start:.1f}s -> {self.tsv_dir()}")

    def check_sources(self) -> None:
        if self.source == "generate":
            return
        tsv_dir = self.tsv_dir()
        missing = [f for f in layout.LISTOPS.files if not (tsv_dir / f).exists()]
        if missing:
            raise DataMissingError(
                f"ListOps official files missing in {tsv_dir}: {', '.join(missing)}. Get them with: python run.py "
                "mode=fetch task=listops (reads the LRA release lra_release.gz as it downloads and keeps only "
                "listops-1000/). Or download lra_release.gz from the Long Range Arena GitHub release, unpack it and point "
                "task.datamodule.official_dir at its 'listops-1000' folder (or use task.datamodule.source=generate)"
            )

    def build(self, directory: Path) -> None:
        tsv_dir = self.tsv_dir()
        if self.source == "generate":
            build_once(tsv_dir, self._generate_tsvs, self.gen)
            shutil.rmtree(self.chunk_dir(), ignore_errors=True)
        else:
            self.check_sources()
        for split, name in layout.LISTOPS_FILES.items():
            rows = list(read_tsv(tsv_dir / name))
            shown = Progress(f"[listops] caching {split}", len(rows), "rows")
            ids, lengths = encode([s for s, _ in rows], self.max_len, self.tokenization, progress=shown.update)
            save_split(directory, split, ids, lengths, np.array([t for _, t in rows], dtype=np.int64))
