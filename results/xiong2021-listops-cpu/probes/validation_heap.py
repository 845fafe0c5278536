"""Is a CPU run's validation peak the validation's own memory, or heap that training left behind?

    python results/xiong2021-listops-cpu/probes/validation_heap.py {plain|trim} [run.py overrides]

Runs ``run.py`` (default: ``experiment=xiong2021 task=listops attention=adamra``, 300 steps, no
logger; results and checkpoints go where ``LRA_RESULTS_DIR``/``LRA_CHECKPOINT_DIR`` say, so point
them at a scratch folder) with two lines logged at every validation: the resident set just before
the validation's high-water mark is reset, and that validation's own peak (``VmHWM`` at its end,
before the run's monitor folds it into the stretch's maximum). With ``trim``, glibc's free heap is
returned to the kernel (``malloc_trim(0)``) just before the reset, so the peak then counts what the
validation itself touches. A diagnostic for this folder's README, not part of the suite: the suite
never trims (that would change the process it measures).
"""
import ctypes
import logging
import runpy
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[3]
sys.path.insert(0, str(ROOT))

from lra.footprint import PeakMemory  # noqa: E402
from lra.training import profiling  # noqa: E402

DEFAULTS = ["experiment=xiong2021", "task=listops", "attention=adamra", "seed=0", "threads=1",
            "trainer.max_steps=300", "logger=none"]
log = logging.getLogger("validation_heap")


def main() -> None:
    mode, overrides = sys.argv[1], sys.argv[2:]
    if mode not in ("plain", "trim"):
        raise SystemExit("usage: validation_heap.py {plain|trim} [run.py overrides]")
    libc = ctypes.CDLL("libc.so.6")
    rss = PeakMemory("cpu")
    start, end = profiling.PeakMemoryMonitor.on_validation_start, profiling.PeakMemoryMonitor.on_validation_end

    def on_start(self, trainer, pl_module):
        if not trainer.sanity_checking:
            before = rss.current_mb()
            if mode == "trim":
                libc.malloc_trim(0)
            log.info("step %d: resident %.1f MB before the validation, %.1f MB at its reset (%s)",
                     trainer.global_step, before, rss.current_mb(), mode)
        start(self, trainer, pl_module)

    def on_end(self, trainer, pl_module):
        if not trainer.sanity_checking and self.meter is not None:
            log.info("step %d: this validation's peak %.1f MB", trainer.global_step, self.meter.peak_mb())
        end(self, trainer, pl_module)

    profiling.PeakMemoryMonitor.on_validation_start = on_start
    profiling.PeakMemoryMonitor.on_validation_end = on_end
    sys.argv = [str(ROOT / "run.py"), *DEFAULTS, *overrides]
    runpy.run_path(sys.argv[0], run_name="__main__")


if __name__ == "__main__":
    main()
