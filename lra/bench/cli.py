"""``python -m lra.bench``: the side-by-side measurements of :mod:`lra.bench.harness`, or, with
``--protocol peers``, the race against the public implementations (:mod:`lra.bench.peers`), or, with
``--protocol approximation``, the approximation map (:mod:`lra.bench.approximation`), or, with
``--protocol dispatches``, what each variant's step would launch on a GPU (:mod:`lra.bench.dispatches`). The
dispatch lives here so that the imports point one way: peers uses the harness, never the reverse."""
from __future__ import annotations

import sys
from typing import Any


def run_bench(cfg: Any) -> dict[str, Any]:
    """``run.py mode=bench``: the approximation map (its own records) or the harness's measurements."""
    if cfg.bench.get("protocol") == "approximation":
        from lra.bench.approximation import run_from_config

        return run_from_config(cfg)
    from lra.bench.harness import run_bench as measure_lengths

    return measure_lengths(cfg)


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else list(argv)
    if "--protocol=approximation" in argv or any(a == "--protocol" and b == "approximation" for a, b in zip(argv, argv[1:])):
        from lra.bench.approximation import main as approximation_map

        return approximation_map(argv)
    if "--protocol=dispatches" in argv or any(a == "--protocol" and b == "dispatches" for a, b in zip(argv, argv[1:])):
        from lra.bench.dispatches import main as count_dispatches

        return count_dispatches(argv)
    if "--protocol=peers" in argv or any(a == "--protocol" and b == "peers" for a, b in zip(argv, argv[1:])):
        from lra.bench.peers import main as race_peers

        return race_peers(argv)
    from lra.bench.harness import main as measure

    return measure(argv)
