"""Bugs of the race against the public implementations (lra/bench/peers.py). Only mutants whose
tests need no optional peer package (torch's own SDPA is the peer they use), so the check holds on
a machine without the peers extra."""
from tests.mutants import Mutant

PEERS = "tests/bench/test_bench_peers.py"
MUTANTS = [
    Mutant("peers-ratio-inverted", "lra/bench/peers.py",
           '"time_ratio": statistics.median(pair(ours_s, peer_s))', '"time_ratio": statistics.median(pair(peer_s, ours_s))',
           "the table reports peer / ours: every slower layer reads as faster", (f"{PEERS}::test_race_ratios_and_table",)),
    Mutant("peers-missing-peer-measured", "lra/bench/peers.py",
           "        importlib.import_module(peer.module)\n    except Exception as e:",
           "        pass\n    except Exception as e:",
           "a peer that is not installed is raced anyway (a crash or a row of failures, no skip naming the package)",
           (f"{PEERS}::test_missing_peer_is_a_clean_skip_naming_the_package",)),
    Mutant("peers-memory-under-timing-malloc", "lra/bench/peers.py",
           '"side": side}, memory_env(env))', '"side": side}, {**env, **EXACT_MALLOC})',
           "memory workers inherit MALLOC_MMAP_MAX_=0: freed heap blocks count in the peak, ratios drift toward 1",
           (f"{PEERS}::test_memory_workers_get_exact_malloc_and_no_timing_setting",)),
    Mutant("peers-align-skips-out-projection", "lra/bench/peers.py",
           "(v, ours.v_proj), (out, ours.out_proj)):", "(v, ours.v_proj)):",
           "the agreement check leaves a projection uncopied: outputs differ for a reason that is not the mechanism",
           (f"{PEERS}::test_outputs_agree_where_claimed",)),
]
