"""One table model rendered three ways: Markdown (report.md), CSV (raw numbers) and LaTeX.

The three are renderings of the same cells, so they cannot say different things: the LaTeX cell is
the Markdown cell's text, escaped (no second, compact form that could drop a flag or name another
interval); the caption is the title, and the notes go in a file of their own (``<name>.notes.tex``) so
that the table pastes into a paper as it is (booktabs rules). A cell's ``data`` are the unrounded
figures it displays (its CSV columns, named); a table whose cells carry data writes its CSV from
them, so each CSV field belongs to one displayed cell. Tables built the older way (``csv_header``
and ``csv_rows`` given apart: efficiency and SMAT, lra/report/efficiency.py) keep that path.

Display cells carry an emphasis rank: 1 = bold, 2 = underlined, as in the AdaMRA tables (what earns
a rank is each table builder's rule, stated in its notes).
"""
from __future__ import annotations

import csv
import io
import math
import re
from dataclasses import dataclass, field
from typing import Any

MISSING = "—"
OWN = "run"  # the source column of this suite's own rows (published rows name their paper)


@dataclass
class TableCell:
    """One displayed cell (not an accuracy cell of pooled runs: that is lra.report.cells.ExperimentCell)."""
    text: str
    value: float | None = None   # what ranking compares
    emph: int = 0                # 1 bold, 2 underlined
    data: dict[str, Any] | None = None  # CSV column -> the unrounded figure this cell displays




@dataclass
class Table:
    name: str                    # file stem under tables/
    title: str
    header: list[str]
    rows: list[list[TableCell]] = field(default_factory=list)
    csv_header: list[str] = field(default_factory=list)
    csv_rows: list[list[Any]] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)

    def markdown(self) -> str:
        def fmt(c: TableCell) -> str:
            t = c.text.replace("|", "\\|")
            return f"**{t}**" if c.emph == 1 else f"<u>{t}</u>" if c.emph == 2 else t

        lines = ["| " + " | ".join(self.header) + " |", "|" + "|".join("---" for _ in self.header) + "|"]
        lines += ["| " + " | ".join(fmt(c) for c in row) + " |" for row in self.rows]
        return "\n".join(lines)

    @property
    def caption(self) -> str:
        """The title as one sentence (a caption ends with a full stop)."""
        return self.title if self.title.endswith(".") else self.title + "."

    def latex(self) -> str:
        """The table as it pastes into a paper: booktabs rules, the title as its caption, no notes
        (they are :meth:`latex_notes`, a file of their own, so a paper takes the table alone)."""
        def fmt(c: TableCell) -> str:
            t = latex_escape(c.text)
            return f"\\textbf{{{t}}}" if c.emph == 1 else f"\\underline{{{t}}}" if c.emph == 2 else t

        spec = "l" * 2 + "r" * (len(self.header) - 2)
        out = [f"% needs \\usepackage{{booktabs}}; the notes: {self.name}.notes.tex" if self.notes
               else "% needs \\usepackage{booktabs}",
               "\\begin{table}[t]", "\\centering", "\\small", f"\\caption{{{latex_escape(self.caption)}}}",
               f"\\label{{tab:{self.name}}}", f"\\begin{{tabular}}{{{spec}}}", "\\toprule",
               " & ".join(latex_escape(h) for h in self.header) + " \\\\", "\\midrule"]
        out += [" & ".join(fmt(c) for c in row) + " \\\\" for row in self.rows]
        out += ["\\bottomrule", "\\end{tabular}", "\\end{table}"]
        return "\n".join(out) + "\n"

    def latex_notes(self) -> str | None:
        """The table's notes as a LaTeX list (``<name>.notes.tex``), or None when it has none."""
        if not self.notes:
            return None
        items = [f"  \\item {latex_escape(n)}" for n in self.notes]
        return "\n".join([f"% notes of table tab:{self.name} ({self.name}.tex)", "\\begin{itemize}", *items,
                          "\\end{itemize}"]) + "\n"

    def csv_table(self) -> tuple[list[str], list[list[Any]]]:
        """(header, rows) of the CSV: the cells' data where the table has no separate CSV rows."""
        if self.csv_header:
            return self.csv_header, self.csv_rows
        header = [k for c in self.rows[0] for k in (c.data or {})] if self.rows else []
        rows = []
        for row in self.rows:
            keys = [k for c in row for k in (c.data or {})]
            if keys != header:
                raise ValueError(f"table {self.name}: a row's cells carry other CSV columns ({keys} != {header})")
            rows.append([v for c in row for v in (c.data or {}).values()])
        return header, rows

    def csv(self) -> str:
        header, rows = self.csv_table()
        buf = io.StringIO()
        w = csv.writer(buf, lineterminator="\n")
        w.writerow(header)
        for row in rows:
            w.writerow([csv_field(v) for v in row])
        return buf.getvalue()


def csv_field(v: Any) -> Any:
    """A CSV field: raw, unrounded (floats as repr), None empty."""
    return "" if v is None else repr(float(v)) if isinstance(v, float) else v


def slug(text: str) -> str:
    """A file-name-safe form of a protocol, device or task name."""
    return re.sub(r"[^a-z0-9]+", "-", str(text).lower()).strip("-")[:40] or "unknown"


_LATEX = {"\\": r"\textbackslash{}", "&": r"\&", "%": r"\%", "$": r"\$", "#": r"\#", "_": r"\_", "{": r"\{",
          "}": r"\}", "~": r"\textasciitilde{}", "^": r"\textasciicircum{}", "ö": r"\"{o}", "±": r"$\pm$",
          "—": "--", "×": r"$\times$", "†": r"$^\dagger$", "α": r"$\alpha$", "≥": r"$\geq$", "≈": r"$\approx$",
          "≤": r"$\leq$", "−": "-", "–": "--", "<": r"$<$", ">": r"$>$", "·": r"$\cdot$", "⏎": " ",
          "√": r"$\surd$"}


def latex_escape(text: str) -> str:
    return "".join(_LATEX.get(ch, ch) for ch in text)


def emphasise(cells: list[TableCell], higher_is_better: bool = True) -> None:
    """Bold the best value of a column and underline the second best (ties share the rank): for
    tables of single measurements (efficiency, SMAT), whose notes say it is a ranking, not a test.
    Fewer than two different values (one model, or all tied) rank nothing: no mark."""
    values = sorted({c.value for c in cells if c.value is not None and math.isfinite(c.value)},
                    reverse=higher_is_better)
    if len(values) < 2:
        return
    for c in cells:
        if c.value is not None and values:
            c.emph = 1 if c.value == values[0] else 2 if len(values) > 1 and c.value == values[1] else 0
