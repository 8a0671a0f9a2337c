#!/usr/bin/env bash
# The GPU check (issue 17): on a machine with an NVIDIA GPU, four stages, each with its
# own time limit (150, 300, then 480 s for the last two) so that a stuck stage leaves the
# next one its time. XLA's autotuner made the first compilation of the IWSLT-size model's
# forward and backward pass take 197 s on an H200 (2026-12-04), so the stages do not fit
# one 10-minute call together; GPU_CHECK_STAGES picks some of them:
#   1. the tests with a GPU meaning, on the GPU (JAX_PLATFORMS=cuda): bf16 steps against
#      float32, sharded bf16 steps (2 GPUs or more; tests/test_sharding.py with 8),
#      cuDNN flash attention against XLA's attention (tests/test_gpu_check.py, and the
#      attention tests of tests/test_models.py);
#   2. the bf16 suite against PyTorch autocast with MFU, the LM and the IWSLT-size
#      encoder-decoder (benchmarks/suite.py; BENCHMARKS.md's suite_gpu section; needs a
#      CUDA PyTorch, else skipped with a line saying so); stage "llama": the Llama-style
#      decoder at a 125M shape against transformers' LlamaForCausalLM, eager and under
#      torch.compile, bf16 (suite_gpu_llama section; the same CUDA PyTorch);
#   3. kernels: the attention kernels (plain, xla, cudnn) checked against each other and
#      timed (benchmarks/gpu_check.py; BENCHMARKS.md's gpu_check section, with each stage's
#      time);
#   4. run: a 300-step IWSLT-size encoder-decoder run with cuDNN flash attention
#      (benchmarks/gpu_check.py; BENCHMARKS.md's gpu_check_run section);
#   5. plan: the IWSLT-size train step's memory as `lnjax compile`'s library predicts it
#      for the GPUs attached (XLA's memory analysis) beside JAX's measured peak after 3
#      steps (benchmarks/plan_peak.py; BENCHMARKS.md's gpu_check_plan section).
# On a CPU it runs stages 2 to 5 at tiny sizes, end to end (suite.py and gpu_check.py
# --dry_run: every model and dtype of the GPU stages, so that a lent GPU's minutes are
# spent measuring, not finding a crash), writes nothing, says it needs a GPU and exits 0.
#
#   bash benchmarks/gpu_check.sh            # exit 0: passed (or no GPU); 1: a check failed
#   GPU_CHECK_OUT=/tmp/b.md bash benchmarks/gpu_check.sh   # write the tables elsewhere
#   GPU_CHECK_STAGES=tests,suite bash benchmarks/gpu_check.sh  # then, in a second call,
#   GPU_CHECK_STAGES=kernels,run bash benchmarks/gpu_check.sh  # (each under 10 minutes)
set -euo pipefail
cd "$(dirname "$0")/.."
out=${GPU_CHECK_OUT:-BENCHMARKS.md}
only=",${GPU_CHECK_STAGES:-tests,suite,llama,kernels,run,plan},"  # The stages that run: a subset.
suite=(benchmarks/suite.py --dtype bfloat16 --models lm,mt_iwslt)  # Stage 2's comparison.
llama=(benchmarks/suite.py --dtype bfloat16 --models llama,llama_compile)  # Stage "llama".
if ! command -v python >/dev/null; then  # An image with python3 alone (the first GPU machine's).
  bin=$(mktemp -d)
  printf '#!/bin/sh\nexec python3 "$@"\n' > "$bin/python" && chmod +x "$bin/python"
  PATH=$bin:$PATH
fi

backend=$(python -c 'import jax; print(jax.default_backend())' 2>/dev/null || echo "none (JAX failed)")
if [ "$backend" != gpu ]; then
  python "${suite[@]}" --dry_run
  python "${llama[@]}" --dry_run
  python benchmarks/gpu_check.py --dry_run
  echo "gpu_check: needs a GPU (JAX's backend here: $backend); ran stages 2 to 5 at tiny" \
       "sizes (--dry_run), nothing written. On a GPU machine: pip install -e \".[cuda]\"" \
       "(BUILD.md)."
  exit 0
fi

stages=""
failed=0
stage() {  # stage NAME SECONDS COMMAND...: runs it for at most SECONDS, records its outcome.
  local name=$1 limit=$2 t0=$SECONDS note="passed" rc=0
  shift 2
  echo "=== gpu_check: $name (at most $limit s)"
  timeout -k 10 "$limit" "$@" || rc=$?
  if [ $rc = 124 ] || [ $rc = 137 ]; then note="FAILED: stopped at its $limit s limit"
  elif [ $rc != 0 ]; then note="FAILED (exit $rc)"; fi
  [ $rc = 0 ] || failed=1
  stages+="${stages:+,}$name=$((SECONDS - t0))=$note"
}

export JAX_PLATFORMS=cuda
# One autotuning cache for every process of the check (a fusion tuned once is read back,
# not tuned again); only where this XLA knows the flag: an unknown one stops a process.
cache_flag="--xla_gpu_per_fusion_autotune_cache_dir=${TMPDIR:-/tmp}/lnjax_xla_autotune"
if XLA_FLAGS="${XLA_FLAGS:-} $cache_flag" python -c 'import jax; jax.numpy.ones(1)' 2>/dev/null; then
  export XLA_FLAGS="${XLA_FLAGS:-} $cache_flag"
fi
gpus=$(python -c 'import jax; print(jax.device_count())')
tests=(tests/test_gpu_check.py tests/test_models.py::test_attention_impl_equals_the_plain_path)
if [ "$gpus" -ge 8 ]; then tests+=(tests/test_sharding.py::test_sharded_steps_equal_single_device); fi
# Full float32 matmuls (not TF32) where the tests compare float32 values.
if [[ $only == *,tests,* ]]; then
  stage "tests on $gpus GPU(s)" 150 env JAX_DEFAULT_MATMUL_PRECISION=highest \
      python -m pytest -q -p no:cacheprovider "${tests[@]}"
fi

if [[ $only != *,suite,* ]]; then :
elif python -c 'import sys, torch; sys.exit(not torch.cuda.is_available())' 2>/dev/null; then
  stage "bf16 suite vs PyTorch autocast" 300 python "${suite[@]}" --rounds 3 --steps 20 --out "$out"
else
  echo "=== gpu_check: no CUDA PyTorch here: the bf16 suite is skipped (pip install" \
       "torch==2.13.0 --index-url https://download.pytorch.org/whl/cu128)"
  stages+="${stages:+,}bf16 suite vs PyTorch autocast=0=skipped: no CUDA PyTorch"
fi

if [[ $only == *,llama,* ]] && python -c 'import sys, torch; sys.exit(not torch.cuda.is_available())' 2>/dev/null; then
  stage "bf16 Llama-style vs LlamaForCausalLM (eager, torch.compile)" 300 \
      python "${llama[@]}" --rounds 3 --steps 20 --out "$out"
fi

# Its own 420 s budget ends the run in time to write the tables; the outer limit is a backstop.
parts=""
for part in kernels run plan; do [[ $only == *,$part,* ]] && parts+="${parts:+,}$part"; done
if [ -n "$parts" ]; then
  timeout -k 10 480 python benchmarks/gpu_check.py --parts "$parts" --out "$out" \
    --stages "$stages" --budget_s 420 || failed=1
fi
echo "gpu_check: $([ $failed = 0 ] && echo passed || echo FAILED) in ${SECONDS} s; tables in $out"
exit $failed
