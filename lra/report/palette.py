"""One colour per variant and one marker per family, fixed here for every plot of every report.

A reader who learns that AdaMRA is red in one figure finds it red in every other figure, in both panels
of a figure and in every results folder, whatever else the folder holds: the colour is the variant's,
not its position in a plot's legend. Every name of ``conf/attention/`` and ``conf/ablation/`` has its
own colour (``tests/report/test_palette.py`` checks that no two share it); the
colours were picked greedily for distance in CIELAB from matplotlib's qualitative maps (tab10 first,
for the variants of AdaMRA Table 1, which appear together most), light tints left out so that lines
show on white. The marker tells the families apart (one attention module, ``attention/<family>.py``,
with its configs and ablations); the line style tells a variant's rows apart (custom settings).

A name that is not listed (a variant added since) gets a fixed colour of its own from its name's hash,
until it is listed here (optional: adding a variant needs no edit here).
"""
from __future__ import annotations

import hashlib
from typing import Any

from lra.report.cells import SPT

# variant -> colour, in the order the colours were picked (the first ten: tab10)
COLOURS: dict[str, str] = {
    "softmax": "#1f77b4",
    "performer_32": "#2ca02c",
    "reformer": "#ff7f0e",
    "adamra": "#d62728",
    "bigbird": "#9467bd",
    "linformer": "#8c564b",
    "abc_rd": "#e377c2",
    "linear": "#7f7f7f",
    "abc_mlp": "#bcbd22",
    "nystromformer": "#17becf",
    "clustered": "#a6761d",
    "i_clustered": "#f0027f",
    "routing": "#637939",
    "memformer": "#393b79",
    "linear_unnormalised": "#ff9896",
    "performer_port": "#1b9e77",
    "performer": "#cab2d6",
    "nystromformer_64": "#e6ab02",
    "adamra_t2a": "#fdae6b",
    "adamra_t2b": "#7fc97f",
    "adamra_elu": "#bf5b17",
    "adamra_softmax": "#7b4173",
    "adamra_random_router": "#6baed6",
    "local": "#c49c94",
    "longformer": "#ad494a",
    "sparse": "#e7ba52",
    "sparse_strided": "#9c9ede",
    "sinkhorn": "#bdbdbd",
    "synthesizer_dense": "#fc8d62",
    "synthesizer_random": "#de9ed6",
    "adamra_t4_id1": "#e6550d",
    "adamra_t4_id2": "#31a354",
    "adamra_t4_id3": "#66c2a5",
    "adamra_t4_id4": "#7570b3",
    "adamra_t4_id5": "#6a3d9a",
    "adamra_t4_id6": "#8ca252",
    "adamra_t4_id7": "#8c6d31",
    "adamra_t4_id8": "#66a61e",
    "adamra_t4_id9": "#6b6ecf",
    "adamra_t4_id10": "#a55194",
    "adamra_t5_elu": "#a65628",
    "adamra_t5_rand": "#fd8d3c",
    "adamra_t5_relu": "#5254a3",
    "adamra_t5_softmax": "#8da0cb",
}

# family (the attention module) -> marker; a variant's family is the longest family name it starts with
MARKERS: dict[str, str] = {
    "softmax": "o", "adamra": "s", "abc": "^", "memformer": "v", "clustered": "D",
    "routing": "P", "linear": "X", "performer": "<", "linformer": ">", "nystromformer": "p", "reformer": "h",
    "bigbird": "*", "local": "d", "longformer": "H", "sparse": "8", "sinkhorn": "x", "synthesizer": "+",
}
OTHER_NAMES = {"i_clustered": "clustered"}  # a family whose module holds a variant of another name
LINESTYLES = ("-", "--", ":", "-.")
SPARE = ("#000000", "#4d4d4d", "#b15928", "#fb9a99", "#33a02c", "#e31a1c", "#ff7f00", "#6a51a3")  # unlisted names


def family(variant: str) -> str:
    """The attention family a variant belongs to (``adamra_t4_id3`` -> ``adamra``, ``i_clustered`` -> ``clustered``)."""
    variant = OTHER_NAMES.get(variant, variant)
    known = [f for f in MARKERS if variant == f or variant.startswith(f + "_")]
    return max(known, key=len) if known else variant.split("_", 1)[0]


def colour(variant: str) -> str:
    """The variant's colour: listed, else a spare picked by the name's hash (stable across runs and machines)."""
    if variant in COLOURS:
        return COLOURS[variant]
    return SPARE[int(hashlib.sha256(variant.encode()).hexdigest(), 16) % len(SPARE)]


class Palette:
    """The style of a variant's series: its colour, its family's marker, and a line style per kind
    (``kind`` > 0: another row of the same variant, with other settings)."""

    def style(self, variant: str, kind: int = 0) -> dict[str, Any]:
        """A self-pretrained row (``adamra +SPT(mlm)``) keeps its variant's colour and marker, drawn
        hollow and two line styles on, so it stands beside its from-scratch row and is told apart."""
        base, spt, _ = variant.partition(SPT)
        style = {"color": colour(base), "marker": MARKERS.get(family(base), "o"),
                 "linestyle": LINESTYLES[(kind + (2 if spt else 0)) % len(LINESTYLES)]}
        return style | ({"markerfacecolor": "white"} if spt else {})
