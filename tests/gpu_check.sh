#!/bin/bash
# The CUDA checks of a GPU session in one command (docs/testing.md, "On a GPU"). CI never runs this.
#   bash tests/gpu_check.sh [modes] [bench] [tests] [devruns] [compile] [listops]   (no argument: the first four)
# Logs, JUnit XML and a tarball of the run records and run logs go to $OUT (default $RES/out). Stages:
#   modes    first (issue 62): Table 2's step eager, compiled (torch.compile default) and compiled with
#            CUDA graphs (mode=reduce-overhead), interleaved in one process, N 1K and 4K, with the
#            ratios to eager; $MODE_VARIANTS (default: softmax and the launch-bound variants) and
#            $MODE_LENGTHS choose the rows (each compile costs tens of seconds)
#   bench    AdaMRA Table 2 alone on the GPU (in-process: the CUDA peak is reset per measurement)
#   tests    the float64 reference and contract tests on CUDA; -v names each result as it comes, so a
#            run cut by its timeout still names its failures (grep FAILED cuda_tests.log)
#   devruns  a fast_dev_run of every variant, float32 and bf16-mixed, side by side
#   compile  Table 2 at 4K with bench.compile=true for softmax and the launch-bound variants
#   listops  resumes the interrupted runs of results/xiong2021-listops-h200 (and starts any of $RUNS
#            not there), in parallel, for at most $LISTOPS_S seconds; SIGTERM then leaves last.ckpt
# Measured on an H200 (2026-11-28): bench 46 s; the tests did not finish in 170 s at -n 4 beside eight
# training runs; devruns 74 s for both precisions.
set -u
RES=${RES:-/tmp/lra-gpu-check}; OUT=${OUT:-$RES/out}
mkdir -p "$OUT" "$RES"
export PYTHONUNBUFFERED=1 WANDB_MODE=offline
stages=${*:-modes bench tests devruns}
T0=$(date +%s)
mark() { echo "[t=$(( $(date +%s) - T0 ))s] $*" | tee -a "$OUT/timeline.txt"; }
{ date -u; nvidia-smi; python3 -c "import torch; print(torch.__version__, torch.version.cuda, torch.cuda.get_device_name())"; } > "$OUT/machine.txt" 2>&1

for stage in $stages; do
  mark "$stage start"
  case $stage in
    modes)
      timeout 480 python3 -m lra.bench --protocol table2 --no-isolate --threads 0 --min-time 1 \
        --variants ${MODE_VARIANTS:-linear,adamra_t2a,nystromformer,bigbird} --lengths ${MODE_LENGTHS:-1024 4096} \
        --modes eager,default,reduce-overhead --results-dir "$RES/modes" > "$OUT/modes.log" 2>&1 ;;
    bench)
      LRA_RESULTS_DIR=$RES/bench timeout 300 python3 run.py -m experiment=efficiency bench.isolate=false \
        bench.min_time_s=1.0 hydra.sweep.dir=$RES/multirun/bench > "$OUT/bench.log" 2>&1 ;;
    tests)
      LRA_TEST_DEVICE=cuda timeout 420 python3 -m pytest -v -rfE -n 8 --dist loadgroup -p no:cacheprovider \
        -m "not slow" --junitxml="$OUT/cuda_tests.xml" \
        tests/attention/test_{attention_bf16,attention_contract,fuzz_attention,host_syncs,pooling_reach}.py \
        tests/attention/test_reference_{abc,adamra,baselines,baselines_state,clustered,grid,routing}.py \
        > "$OUT/cuda_tests.log" 2>&1 ;;
    devruns)
      all=$(ls conf/attention | sed 's/\.yaml$//' | paste -sd, -)
      pids=""
      for p in 32-true bf16-mixed; do
        LRA_RESULTS_DIR=$RES/dev-$p timeout 300 python3 run.py -m experiment=quick task=listops attention="$all" \
          trainer=gpu trainer.precision=$p trainer.fast_dev_run=true trainer.enable_progress_bar=false \
          hydra.sweep.dir=$RES/multirun/dev-$p > "$OUT/dev-$p.log" 2>&1 &
        pids="$pids $!"
      done
      wait $pids ;;
    compile)
      LRA_RESULTS_DIR=$RES/compile timeout 420 python3 run.py -m experiment=efficiency bench.isolate=false \
        bench.compile=true 'bench.lengths=[4096]' attention=softmax,adamra_t2a,nystromformer,linear \
        hydra.sweep.dir=$RES/multirun/compile > "$OUT/compile.log" 2>&1 ;;
    listops)
      dir=results/xiong2021-listops-h200; pids=""
      for run in ${RUNS:-softmax nystromformer reformer adamra bigbird}; do   # name or name:seed
        a=${run%%:*}; seed=0; [ "$run" != "$a" ] && seed=${run#*:}
        LRA_RESULTS_DIR=$dir LRA_CHECKPOINT_DIR=$dir/checkpoints timeout -s TERM ${LISTOPS_S:-480} \
          python3 run.py experiment=xiong2021 task=listops attention=$a seed=$seed trainer=gpu \
          trainer.enable_progress_bar=false > "$RES/listops-$a-s$seed.log" 2>&1 &
        pids="$pids $!"
      done
      wait $pids
      tar czf - $dir/runs $dir/checkpoints | split -b 15m -d - "$OUT/listops.tgz.part" ;;  # cat the parts | tar xzf -
    *) echo "unknown stage '$stage' (valid: modes bench tests devruns compile listops)" >&2; exit 2 ;;
  esac
  mark "$stage rc=$?"
done
tar czf "$OUT/records.tgz" -C "$RES" --exclude=./multirun --exclude=./out . && mark "records in $OUT/records.tgz"
