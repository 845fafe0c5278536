"""Memformer's Memory Replay Back-Propagation against full BPTT: peak memory and time of one
training step (forward, loss, backward, AdamW step) over segment counts, as the paper's Table 3.

    python -m lra.bench.mrbp --segments 2 4 8 16 32 --rounds 3 --threads 1

Every measurement runs in a fresh subprocess through :func:`lra.bench.harness.measure_isolated` (peak
RSS reset per phase, the pre-model baseline subtracted, see :mod:`lra.footprint`); rounds are
interleaved (BPTT, MRBP, BPTT, MRBP, ... for each length), and the table gives the median step
time over all rounds and the largest peak. ``--cpu-time`` adds a second table: both models in this
process, steps interleaved, timed by ``time.process_time`` (one thread: the CPU time of the step,
which other processes on a loaded machine do not inflate the way they inflate wall time).

The sequence is ``segments x segment_len`` tokens, all real; the model defaults to the LRA text
backbone (4 layers, d 256, 4 heads, FFN 1024; the report's figures used ``--d-model 128 --d-ffn
512``, the retrieval backbone), CLS pooling, dropout 0.1.
"""
from __future__ import annotations

import argparse
import statistics
import sys
import time
from typing import Any

from lra.bench.harness import measure_isolated, pool_rounds


def spec(segments: int, mrbp: bool, args: argparse.Namespace) -> dict[str, Any]:
    n = segments * args.segment_len
    attention = {"_target_": "attention.memformer.MemformerAttention", "_partial_": True,
                 "memory_slots": args.slots, "segment_len": args.segment_len, "memory": args.memory, "mrbp": mrbp}
    model = {"_target_": "models.network.LRAClassifier", "d_model": args.d_model, "n_layers": args.layers,
             "n_heads": args.heads, "d_ffn": args.d_ffn, "d_head": args.d_ffn, "dropout": 0.1, "pool": "cls",
             "vocab_size": 256, "num_classes": 2, "max_len": n, "dual": False}
    return {"kind": "train_step", "attention": attention, "model": model, "batch_size": args.batch_size,
            "length": n, "repeats": args.repeats, "warmup": 1, "min_time_s": 0.0, "device": "cpu", "seed": 0,
            "threads": args.threads, "cpu_malloc": "default", "lr": 1e-4}


def cpu_time_ratios(args: argparse.Namespace) -> None:
    """Median CPU time of a training step (forward + backward), BPTT and MRBP interleaved in one process."""
    import torch
    import torch.nn.functional as F
    from hydra.utils import instantiate

    torch.set_num_threads(args.threads)
    print("\n| segments | N | BPTT CPU ms | MRBP CPU ms | CPU time MRBP/BPTT |\n|---|---|---|---|---|")
    for t in args.segments:
        nets = {}
        for mrbp in (False, True):
            s = spec(t, mrbp, args)
            torch.manual_seed(0)
            nets[mrbp] = instantiate(s["model"], mixer=instantiate(s["attention"])).train()
        n, b = t * args.segment_len, args.batch_size
        ids, mask = torch.randint(1, 256, (b, n)), torch.ones(b, n, dtype=torch.bool)
        labels = torch.randint(0, 2, (b,))
        times: dict[bool, list[float]] = {False: [], True: []}
        for _ in range(args.repeats * args.rounds + 1):
            for mrbp, net in nets.items():
                net.zero_grad(set_to_none=True)
                start = time.process_time()
                F.cross_entropy(net(ids, mask), labels).backward()
                times[mrbp].append(time.process_time() - start)
        bptt, mrbp = (1000 * statistics.median(times[k][1:]) for k in (False, True))  # first step: warm-up
        print(f"| {t} | {n} | {bptt:.0f} | {mrbp:.0f} | {mrbp / bptt:.2f} |", flush=True)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m lra.bench.mrbp", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--segments", type=int, nargs="+", default=[2, 4, 8, 16, 32])
    p.add_argument("--segment-len", type=int, default=32)
    p.add_argument("--slots", type=int, default=32)
    p.add_argument("--memory", default="unified", choices=["unified", "per_layer"])
    p.add_argument("--batch-size", type=int, default=8)
    p.add_argument("--d-model", type=int, default=256)
    p.add_argument("--layers", type=int, default=4)
    p.add_argument("--heads", type=int, default=4)
    p.add_argument("--d-ffn", type=int, default=1024)
    p.add_argument("--repeats", type=int, default=3, help="timed steps per subprocess")
    p.add_argument("--rounds", type=int, default=3, help="subprocesses per measurement, interleaved")
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--cpu-time", action="store_true", help="also the in-process CPU-time table")
    p.add_argument("--no-memory", action="store_true", help="skip the subprocess peak-memory/wall-time table")
    args = p.parse_args(argv)
    if args.no_memory:
        cpu_time_ratios(args)
        return 0

    rounds: dict[tuple[int, bool], list[dict[str, Any]]] = {}
    for _ in range(args.rounds):
        for t in args.segments:
            for mrbp in (False, True):
                rounds.setdefault((t, mrbp), []).append(measure_isolated(spec(t, mrbp, args)))
    print(f"memory={args.memory} batch={args.batch_size} d={args.d_model} layers={args.layers} heads={args.heads} "
          f"ffn={args.d_ffn} slots={args.slots} segment_len={args.segment_len} threads={args.threads} "
          f"rounds={args.rounds}x{args.repeats} steps; CPU peak RSS above the pre-model baseline")
    print("| segments | N | BPTT ms | MRBP ms | time MRBP/BPTT | BPTT MB | MRBP MB | memory MRBP/BPTT |")
    print("|---|---|---|---|---|---|---|---|")
    worst = 0
    for t in args.segments:
        bptt, mrbp = pool_rounds(rounds[(t, False)]), pool_rounds(rounds[(t, True)])
        if bptt.get("status") != "ok" or mrbp.get("status") != "ok":
            print(f"| {t} | {t * args.segment_len} | {bptt.get('status')} {bptt.get('error', '')[:200]} | "
                  f"{mrbp.get('status')} {mrbp.get('error', '')[:200]} | | | | |")
            worst = 1
            continue
        print(f"| {t} | {t * args.segment_len} | {bptt['ms']:.0f} | {mrbp['ms']:.0f} | {mrbp['ms'] / bptt['ms']:.2f} | "
              f"{bptt['peak_mb']:.0f} | {mrbp['peak_mb']:.0f} | {mrbp['peak_mb'] / bptt['peak_mb']:.2f} |", flush=True)
    if args.cpu_time:
        cpu_time_ratios(args)
    return worst


if __name__ == "__main__":
    sys.exit(main())
