"""The three exports of a table (Markdown, LaTeX, CSV) parsed back and compared cell by cell with the
table model they render (issue 34, case 7): the LaTeX cell is the Markdown cell's text, escaped; the
CSV holds, in the columns a cell names, the unrounded figures of which every number the cell shows
is a rounding. Used on every results folder the report tests build (tests/report/conftest.py)."""
from __future__ import annotations

import csv
import io
import re
from typing import Any

from lra.report.tables import Table, TableCell, csv_field, latex_escape

DECIMAL = re.compile(r"(?<![\w.])[-+]?\d+\.\d+(?![\w.])")


def _md_cells(line: str) -> list[str]:
    return [c.strip().replace("\\|", "|") for c in re.split(r"(?<!\\)\|", line.strip()[1:-1])]


def _unemph(text: str) -> tuple[str, int]:
    if text.startswith("**") and text.endswith("**"):
        return text[2:-2], 1
    if text.startswith("<u>") and text.endswith("</u>"):
        return text[3:-4], 2
    return text, 0


def _tex_rows(tex: str) -> list[list[str]]:
    body = tex[tex.index("\\begin{tabular}"):tex.index("\\end{tabular}")].splitlines()
    rows = [ln.removesuffix(" \\\\") for ln in body if ln.endswith(" \\\\")]
    return [re.split(r"(?<!\\) & ", r) for r in rows[1:]]  # the first is the header


def _numbers(data: dict[str, Any]) -> tuple[list[float], list[str]]:
    nums, strings = [], []
    for v in data.values():
        if isinstance(v, bool) or v is None:
            continue
        if isinstance(v, (int, float)):
            nums.append(float(v))
        else:
            strings.append(str(v))
            for part in str(v).split(";"):
                try:
                    nums.append(float(part))
                except ValueError:
                    pass
    return nums, strings


def _shown_figures_agree(name: str, cell: TableCell) -> None:
    nums, strings = _numbers(cell.data or {})
    for token in DECIMAL.findall(cell.text):
        places = len(token.split(".")[1])
        ok = any(abs(v - float(token)) <= 0.5 * 10 ** -places + 1e-9 for v in nums) or any(token in s for s in strings)
        assert ok, f"{name}: {token!r} in cell {cell.text!r} is no rounding of its CSV figures {cell.data}"
    for n in re.findall(r"\bn=(\d+)", cell.text):
        assert any((k == "n" or k.endswith("_n")) and v == int(n) for k, v in (cell.data or {}).items()), (name, cell)
    for k in re.findall(r"\((\d+) commits\)", cell.text):
        commits = [v for key, v in (cell.data or {}).items() if key.endswith("commits")]
        assert commits and len(str(commits[0]).split(";")) == int(k), (name, cell)


def check_exports(table: Table) -> None:
    """Raise AssertionError where the Markdown, LaTeX or CSV of ``table`` says something its cells do not."""
    md = table.markdown().splitlines()
    assert _md_cells(md[0]) == table.header, table.name
    md_rows = [_md_cells(ln) for ln in md[2:]]
    tex = table.latex()
    assert f"\\caption{{{latex_escape(table.caption)}}}" in tex, table.name
    assert all(rule in tex for rule in ("\\toprule", "\\midrule", "\\bottomrule")) and "\\hline" not in tex, table.name
    notes = table.latex_notes()  # the notes, apart: the table pastes into a paper as it is
    assert all(latex_escape(n) not in tex for n in table.notes), table.name
    assert (notes is None) == (not table.notes) and all(latex_escape(n) in notes for n in table.notes), table.name
    tex_rows = _tex_rows(tex)
    assert len(md_rows) == len(tex_rows) == len(table.rows), table.name
    for i, row in enumerate(table.rows):
        assert len(md_rows[i]) == len(tex_rows[i]) == len(row) == len(table.header), (table.name, i)
        for j, cell in enumerate(row):
            assert _unemph(md_rows[i][j]) == (cell.text, cell.emph), (table.name, i, j, md_rows[i][j], cell)
            t = latex_escape(cell.text)
            assert tex_rows[i][j] == (f"\\textbf{{{t}}}" if cell.emph == 1 else f"\\underline{{{t}}}" if cell.emph == 2 else t), \
                (table.name, i, j, tex_rows[i][j], cell.text)
    parsed = list(csv.reader(io.StringIO(table.csv())))
    if table.csv_header:  # a table with separate CSV rows (efficiency, SMAT): one CSV row per displayed row
        assert len(parsed) - 1 == len(table.rows), table.name
        return
    header, csv_rows = parsed[0], parsed[1:]
    assert len(csv_rows) == len(table.rows), table.name
    for i, row in enumerate(table.rows):
        fields = dict(zip(header, csv_rows[i]))
        for cell in row:
            assert cell.data, (table.name, i, cell)  # every displayed cell names its CSV columns
            for key, value in cell.data.items():
                assert fields[key] == str(csv_field(value)), (table.name, i, key, fields[key], value)
            _shown_figures_agree(table.name, cell)
