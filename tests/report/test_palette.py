"""The palette rule (issue 65): one colour per variant, fixed in lra/report/palette.py, the same in every
plot and in both panels of a figure; no two variants share a colour; the marker tells families apart."""
from __future__ import annotations

import itertools
import re

import numpy as np
import pytest
from matplotlib import colors as mc
from matplotlib.collections import PathCollection

from lra.report import reference as ref
from lra.report.palette import COLOURS, MARKERS, Palette, colour, family
from tests.conftest import ROOT

VARIANTS = sorted(p.stem for p in (ROOT / "conf" / "attention").glob("*.yaml"))
ABLATIONS = sorted(p.stem for p in (ROOT / "conf" / "ablation").glob("*.yaml"))
MIN_DISTANCE = 10.0  # CIELAB distance between any two listed colours (about what tells two lines apart)


def lab(hex_colour: str) -> np.ndarray:
    """sRGB -> CIELAB (D65), enough to say how far apart two colours look."""
    rgb = np.array(mc.to_rgb(hex_colour))
    lin = np.where(rgb > 0.04045, ((rgb + 0.055) / 1.055) ** 2.4, rgb / 12.92)
    xyz = np.array([[0.4124, 0.3576, 0.1805], [0.2126, 0.7152, 0.0722], [0.0193, 0.1192, 0.9505]]) @ lin
    xyz /= np.array([0.95047, 1.0, 1.08883])
    f = np.where(xyz > 0.008856, np.cbrt(xyz), 7.787 * xyz + 16 / 116)
    return np.array([116 * f[1] - 16, 500 * (f[0] - f[1]), 200 * (f[1] - f[2])])


def test_the_palette_has_a_distinct_colour_for_every_variant_and_ablation():
    """A listed colour per config the palette names, each far from every other, and no two alike. A
    config not listed (a researcher's new variant) still plots, in a spare colour of its own name's
    hash: adding a variant stays one Python file and one YAML, with no other edit."""
    assert len(set(COLOURS.values())) == len(COLOURS)
    unlisted = [v for v in VARIANTS + ABLATIONS if v not in COLOURS]
    assert all(colour(v) not in COLOURS.values() for v in unlisted), unlisted
    close = [(a, b, round(float(np.linalg.norm(lab(COLOURS[a]) - lab(COLOURS[b]))), 1))
             for a, b in itertools.combinations(COLOURS, 2)
             if np.linalg.norm(lab(COLOURS[a]) - lab(COLOURS[b])) < MIN_DISTANCE]
    assert not close, f"colours too close to tell apart: {close}"


def test_an_unlisted_variant_gets_a_fixed_colour_of_its_own_name():
    assert colour("zeta") == colour("zeta") and colour("zeta") not in COLOURS.values()


def _declared_family(path) -> str:
    """The attention module a config builds (``_target_: attention.<module>.X``) or an ablation overrides."""
    text = path.read_text()
    target = re.search(r"^_target_:\s*attention\.(\w+)\.", text, re.M)
    if target:
        return target.group(1)
    base = re.search(r"override /attention:\s*(\w+)", text).group(1)
    return _declared_family(ROOT / "conf" / "attention" / f"{base}.yaml")


@pytest.mark.parametrize("name", [n for n in VARIANTS + ABLATIONS if n in COLOURS])
def test_the_marker_follows_the_family_the_config_declares(name):
    folder = "attention" if name in VARIANTS else "ablation"
    declared = _declared_family(ROOT / "conf" / folder / f"{name}.yaml")
    assert family(name) == declared and declared in MARKERS
    assert Palette().style(name)["marker"] == MARKERS[declared]


def test_one_panel_of_every_variant_has_no_two_lines_of_one_colour():
    from lra.report.plots import curve_figure

    palette = Palette()
    names = VARIANTS + ABLATIONS
    series = {n: (3, [(50, 10.0, 9.0, 11.0), (100, 12.0, 11.0, 13.0)]) for n in names}
    fig = curve_figure(series, "t", {n: palette.style(n) for n in names})
    drawn = [ln.get_color() for ln in fig.axes[0].get_lines()]
    assert len(drawn) == len(names) == len(set(drawn))


def test_a_variant_has_one_colour_in_both_bubble_panels_and_in_every_plot():
    from lra.report.plots import bubble_figure, scaling_figure

    runs = [("softmax", 7.0, None, 37.0), ("adamra", 12.5, None, 37.7), ("linear", 13.0, None, 20.2)]
    published = [(m, s, mb, a) for m, (s, mb, a, _) in ref.ADAMRA_TABLE3.items()]
    fig = bubble_figure(runs, published, "this suite", ref.TABLE3_SOURCE, "accuracy (%)",
                        intervals={"adamra": (35.8, 39.6)}, variants=ref.VARIANT)
    left, right = ([mc.to_hex(c.get_facecolor()[0], keep_alpha=False) for c in ax.collections
                    if isinstance(c, PathCollection)] for ax in fig.axes[:2])
    assert left == [COLOURS["softmax"], COLOURS["adamra"], COLOURS["linear"]]
    assert right == [COLOURS[ref.VARIANT[m]] for m in ref.ADAMRA_TABLE3]  # AdaMRA red on both sides
    assert len(fig.axes[0].containers) == 1  # the one row with an interval has its error bar
    assert "\n" not in fig.axes[0].get_title() and "\n" not in fig._suptitle.get_text()
    fig = scaling_figure({"adamra": [(256, 15.0, 5.0), (1024, 600.0, 50.0)]}, "t", palette=Palette())
    assert fig.axes[0].get_lines()[0].get_color() == fig.axes[1].get_lines()[0].get_color() == COLOURS["adamra"]


def test_the_scaling_legend_lists_a_fit_only_where_one_is_drawn():
    from lra.report.plots import scaling_figure
    from lra.report.stats import fit_power_law

    series = {"softmax": [(256, 1.0, 5.0), (1024, 16.0, 50.0), (4096, 250.0, 500.0)], "linear": [(256, 1.0, None)]}
    fits = {"softmax": (fit_power_law([256, 1024, 4096], [1.0, 16.0, 250.0]), None)}
    fig = scaling_figure(series, "t", fits=fits)
    labels = [t.get_text() for t in fig.legends[0].get_texts()]
    assert labels[0].startswith("softmax (time α=") and "memory" not in labels[0]
    assert labels[1] == "linear" and labels[-1] == "fitted a·N^α"
    assert len(fig.axes[0].get_lines()) == 3  # softmax, its fit, linear's one point
    assert scaling_figure({"linear": [(256, 1.0, None), (1024, 2.0, None)]}, "t").legends[0].get_texts()[-1].get_text() == "linear"
