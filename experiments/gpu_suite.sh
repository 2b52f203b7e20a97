#!/usr/bin/env bash
# Everything the GPU machine runs, in two parts that each fit one 10-minute device call:
#
#   bash experiments/gpu_suite.sh kernels   # GPU kernel tests, dense + compressed benchmarks
#   bash experiments/gpu_suite.sh plaid     # end-to-end PLAID (with a synthetic 1M index), multi-GPU scaling
#   bash experiments/gpu_suite.sh recheck   # kernel tests and main shapes, dense and compressed:
#                                           # one call that re-measures after a change
#   bash experiments/gpu_suite.sh plaid-only  # residual kernel tests and end-to-end PLAID
#                                           # (carry runs/plaid_bench)
#   bash experiments/gpu_suite.sh plaid-bench # search-path kernel tests, end-to-end PLAID (carry runs/plaid_bench)
#   bash experiments/gpu_suite.sh packed-ceiling  # main shapes, and the per-document read ceiling
#   bash experiments/gpu_suite.sh profile-encode  # where one query's encode spends its time
#                                           # (carry runs/plaid_bench)
#   bash experiments/gpu_suite.sh reproduce # the runner: wiki-vital-h200 (carry runs/wvgpu, made by
#                                           # `--steps prepare --out runs/wvgpu` on CPU) and the
#                                           # synthetic-scale table (its indexes are written here)
#   bash experiments/gpu_suite.sh reproduce-d384  # wiki-vital-h200-d384 (carry runs/wv384gpu)
#   bash experiments/gpu_suite.sh equivalence     # experiments/equivalence.py (carry runs/wvgpu)
#   bash experiments/gpu_suite.sh lengths         # synthetic-scale's length-* conditions
#   bash experiments/gpu_suite.sh kernels-quick   # dense kernel tests, packed config sweep, main shapes
#   bash experiments/gpu_suite.sh profile-kernels # interleaved timing + ncu of packed and residual kernels
#   bash experiments/gpu_suite.sh compressed-sweep  # residual/PQ main rows and launch-config sweep
#   bash experiments/gpu_suite.sh residual-loads  # residual tests, PTX vs tl.load loads, main rows
#   bash experiments/gpu_suite.sh profile-rerank  # a rerank's kernels: what does not grow with the candidates
#   bash experiments/gpu_suite.sh persistent-check  # residual kernel tests, then profile-rerank
#   bash experiments/gpu_suite.sh plaid-bench-compressed  # plaid-bench and bench_compressed's main rows
#   bash experiments/gpu_suite.sh one-warp-packed  # packed default: tests, rounds vs flash-maxsim, main shapes
#
# The plaid part reads the bundle that `python -m experiments.bench_plaid prepare` writes on a CPU
# machine with colbert-ai and faiss (runs/plaid_bench, ~33 MB: carry it with the call).
# Raw logs and result files land in $OUT/w (OUT defaults to results/gpu) and are bundled into
# $OUT/results-<part>.tar.gz, one file, because the device tool returns at most 8 files. Wheels for packages the GPU image lacks
# (colbert-ai and its small pure-Python needs, flash-maxsim, late-interaction-kernels) are taken
# from .whl/ when present. Every step has its own time limit so one slow step cannot eat the rest.
set -uo pipefail
part=${1:?usage: gpu_suite.sh kernels|kernels-quick|profile-kernels|compressed-sweep|compressed-main|ncu-compressed|wide-gathers|byte-permute|compressed-defaults|pq-g16|pq-hold|pq-pipeline|pq-final|pq-tests|pq-smem|pq-close|pq-caps|pq-parts|pq-bound|pq-skew|pq-latency|pq-pipe|pq-next|pq-stream|pq-stream-chunks|pq-stream-ncu|pq-stream-skew|pq-l1-breakdown|pq-warps|pq-warps-int32|pq-warps-balanced|pq-warps-chunks|pq-final-balanced|pq-final-check|pq-mma|pq-mma-host|pq-mma-default|pq-mma-staged|pq-mma-final|pq-mma-tests|pq-mma-whole|pq-lut-shared|pq-cuda-tests|pq-words|compressed-rounds|compressed-final|residual-loads|profile-rerank|persistent-check|plaid-bench-compressed|one-warp-packed|plaid|plaid-only|plaid-bench|packed-ceiling|profile-encode|tests|recheck|reproduce|reproduce-d384|equivalence|lengths}
BUNDLE_DIR=${OUT:-results/gpu}
OUT=$BUNDLE_DIR/w
mkdir -p "$OUT"
export PYTHONUNBUFFERED=1 HF_HUB_OFFLINE=1 GIT_PYTHON_REFRESH=quiet
# The device's checkout may carry an older .git than the tree it runs: provenance names the
# commit written to .device_commit before the call (git rev-parse HEAD > .device_commit).
[ -f .device_commit ] && export TILEMAXSIM_COMMIT=$(cat .device_commit)
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
if ls .whl/*.whl >/dev/null 2>&1; then
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target /tmp/site .whl/*.whl || exit 1
  export PYTHONPATH=/tmp/site:$PWD
else
  export PYTHONPATH=$PWD
fi

step() {  # step NAME SECONDS COMMAND...: run with a limit, log to $OUT/NAME.log, note the exit code
  local name=$1 limit=$2; shift 2
  local start=$SECONDS
  timeout "$limit" "$@" > "$OUT/$name.log" 2>&1
  local rc=$?
  echo "$name rc=$rc (${limit}s limit, $((SECONDS - start))s)" | tee -a "$OUT/steps.txt"
}

ncu_stalls() {  # ncu_stalls SECONDS "VARIANTS" [ncu section args]: Nsight Compute's speed of light,
  # occupancy and warp-stall reasons per issued instruction for profile_kernels' variants, and
  # the metrics in $NCU_EXTRA_METRICS (comma-separated) if set
  local limit=$1 only=$2; shift 2
  local ncu
  ncu=$(command -v ncu || ls /opt/nvidia/nsight-compute/*/ncu 2>/dev/null | head -1)
  step kernel_ncu "$limit" "$ncu" --clock-control none --profile-from-start off --import-source no \
    --section SpeedOfLight --section Occupancy "$@" \
    --metrics "regex:smsp__average_warps_issue_stalled_.*_per_issue_active\.ratio,smsp__issue_active.avg.pct_of_peak_sustained_active${NCU_EXTRA_METRICS:+,$NCU_EXTRA_METRICS}" \
    python3 -m experiments.profile_kernels profile --only "$only"
}

gpu_tests() {  # every kernel test on the GPU (compiling each variant takes most of the time)
  step gpu_tests 230 python3 -m pytest -q -x -p no:cacheprovider -m "not colbert" \
    tests/kernels/test_maxsim_dense.py tests/kernels/test_maxsim_residual.py
}

bench_plaid() {  # end-to-end PLAID on the carried bundle and a 1M-passage synthetic index
  step bench_plaid 330 python3 -m experiments.bench_plaid run --bundle runs/plaid_bench --out "$OUT/plaid" \
    --synthetic-dir runs/plaid_syn_bench/synthetic.nbits2 --num-queries 32 --equivalence-queries 500 \
    --rerank-sizes 100000 1000000 --stock-rerank-max 100000
}

nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv > "$OUT/nvidia-smi.txt" 2>&1
case "$part" in
  kernels)
    gpu_tests
    step bench_compressed 170 python3 -m experiments.bench_compressed --sweep --out "$OUT/compressed"
    step bench_dense 190 python3 -m experiments.bench --out "$OUT/bench"
    ;;
  tests)
    gpu_tests
    ;;
  kernels-quick)  # dense kernel tests, the packed-layout config sweep (stream path included), main
                  # shapes; the residual kernel tests are in plaid-only
    step dense_tests 170 python3 -m pytest -q -p no:cacheprovider -m "not colbert" \
      tests/kernels/test_maxsim_dense.py
    # ~50 configurations of the one-query packed shape (a compile and ~0.1 s of timing each),
    # then every main shape with every provider.
    step bench_dense 260 python3 -m experiments.bench --sweep --no-sweeps --out "$OUT/bench" \
      --sweep-shapes "1q packed N=100k mean70 d=128"
    step bench_compressed 120 python3 -m experiments.bench_compressed --out "$OUT/compressed"
    ;;
  profile-kernels)  # interleaved timing and Nsight Compute sections of the packed and residual
                    # kernels, their floors and flash-maxsim's packed kernel
    step kernel_rounds 150 python3 -m experiments.profile_kernels time --rounds 10
    NCU=$(command -v ncu || ls /opt/nvidia/nsight-compute/*/ncu 2>/dev/null | head -1)
    step kernel_ncu 300 "$NCU" --clock-control none --profile-from-start off --import-source no \
      --section LaunchStats --section Occupancy --section SpeedOfLight \
      --section MemoryWorkloadAnalysis --section ComputeWorkloadAnalysis \
      --section SchedulerStats --section WarpStateStats --section SourceCounters \
      python3 -m experiments.profile_kernels profile
    ;;
  residual-loads)  # residual kernel tests, then shuffled / PTX-loaded / tl.load pair tables and words
                   # in interleaved rounds (one-query shape and the rerank path), then main rows
    # ~100 s warm, over 170 s on a fresh machine (every variant compiles).
    step residual_tests 280 python3 -m pytest -q -p no:cacheprovider -m "not colbert" \
      tests/kernels/test_maxsim_residual.py
    step kernel_rounds 120 python3 -m experiments.profile_kernels time --rounds 8 \
      --only "residual default,residual 1w r96 d4,rerank fp16x2 32/2w,rerank fp16x2 1w r128 d4,rerank fp16 1w r96 d2"
    step bench_compressed 150 python3 -m experiments.bench_compressed --out "$OUT/compressed"
    ;;
  profile-rerank)  # a rerank's scoring split into the residual kernel and its fixed part
    step profile_rerank 200 python3 -m experiments.profile_rerank
    ;;
  persistent-check)  # residual kernel tests (the persistent grid included), the fp16 kernel with
                     # and without a persistent grid in interleaved rounds, then profile-rerank
    step residual_tests 250 python3 -m pytest -q -p no:cacheprovider -m "not colbert" \
      tests/kernels/test_maxsim_residual.py
    step kernel_rounds 110 python3 -m experiments.profile_kernels time --rounds 8 \
      --only "residual default,residual 1w r96 d4 persistent,residual 1w r96 d2 persistent,rerank fp16x2 1w r128 d4"
    step profile_rerank 150 python3 -m experiments.profile_rerank
    ;;
  plaid-bench-compressed)  # plaid-bench, then the residual and PQ main rows (carry runs/plaid_bench)
    step plaid_kernel_tests 100 python3 -m pytest -q -p no:cacheprovider -m "not colbert" \
      tests/plaid/test_centroid.py tests/plaid/test_ivf.py tests/plaid/test_sort.py
    bench_plaid
    step bench_compressed 140 python3 -m experiments.bench_compressed --out "$OUT/compressed"
    ;;
  pq-words)  # PQ kernel tests (word gathers, persistent grid) and the fp16-table residual test,
             # then PQ launch shapes, zero-code variants and the residual with an fp16 table in
             # interleaved rounds beside the dense packed default
    step pq_tests 240 python3 -m pytest -q -p no:cacheprovider -m "not colbert" \
      tests/kernels/test_maxsim_pq.py tests/kernels/test_maxsim_residual.py -k "pq or centroid_scores or persistent"
    step kernel_rounds 240 python3 -m experiments.profile_kernels time --rounds 6 \
      --only "pq,residual default,residual 1w r96 d2 persistent,packed default"
    ;;
  compressed-rounds)  # residual and PQ kernel tests, then their variants (L2 prefetch, fp16
                      # centroid-score table, PQ chunk widths) in interleaved rounds beside the
                      # dense packed default
    step compressed_tests 300 python3 -m pytest -q -x -p no:cacheprovider -m "not colbert" \
      tests/kernels/test_maxsim_residual.py tests/kernels/test_maxsim_pq.py
    step kernel_rounds 300 python3 -m experiments.profile_kernels time --rounds 6 \
      --only "pq,residual default,residual 16/1w,residual 32/1w,packed default"
    ;;
  compressed-final)  # residual and PQ kernel tests, the new defaults against their neighbours in
                     # interleaved rounds, then bench_compressed's main rows and floors
    step compressed_tests 300 python3 -m pytest -q -x -p no:cacheprovider -m "not colbert" \
      tests/kernels/test_maxsim_residual.py tests/kernels/test_maxsim_pq.py
    step kernel_rounds 150 python3 -m experiments.profile_kernels time --rounds 6 \
      --only "packed default,residual default,residual 16/1w r96 d2 persistent pf,residual 16/1w r112 d2 persistent pf1 S fp16,residual 16/1w r104 d2 persistent pf1 S fp16,pq16 former,pq32 former,pq16 words 32/1w bd64 rNone,pq32 words 32/1w bd64 rNone"
    step bench_compressed 200 python3 -m experiments.bench_compressed --out "$OUT/compressed"
    ;;
  wide-gathers)  # residual and PQ kernel tests, then fewer, wider L1 lookups in interleaved
                  # rounds beside the dense packed default: PQ 8-byte codebook words, the PQ
                  # lookup-table kernel, residual four-weight (quads) decode tables
    step compressed_tests 330 python3 -m pytest -q -x -p no:cacheprovider -m "not colbert" \
      tests/kernels/test_maxsim_pq.py tests/kernels/test_maxsim_residual.py
    step kernel_rounds 200 python3 -m experiments.profile_kernels time --rounds 6 \
      --only "packed default,pq16 words 32/1w bd64 rNone,pq16 words 32/1w bd128 rNone,pq32 words 32/1w bd64 rNone,pq16 zero,pq16 lut,pq32 lut,residual default,residual quads,rerank fp16x2 quads,rerank fp16x2 1w r128 d4"
    ;;
  byte-permute)  # residual and PQ kernel tests (8-byte PQ gathers now the default), the byte-
                 # permute residual decoder against the pair table in interleaved rounds, then
                 # bench_compressed's main rows (with a byte-permute row) and floors
    step compressed_tests 330 python3 -m pytest -q -x -p no:cacheprovider -m "not colbert" \
      tests/kernels/test_maxsim_residual.py tests/kernels/test_maxsim_pq.py
    step kernel_rounds 150 python3 -m experiments.profile_kernels time --rounds 6 \
      --only "packed default,residual default,residual permute,rerank fp16x2 permute,rerank fp16x2 1w r128 d4 persistent,pq16 words 32/1w bd64 rNone,pq32 words 32/1w bd64 rNone"
    step bench_compressed 200 python3 -m experiments.bench_compressed --out "$OUT/compressed"
    ;;
  compressed-defaults)  # the residual kernel's tests (the byte-permute default and its
                        # fallback), then bench_compressed's main rows and floors
    step residual_tests 300 python3 -m pytest -q -x -p no:cacheprovider -m "not colbert" \
      tests/kernels/test_maxsim_residual.py
    step bench_compressed 200 python3 -m experiments.bench_compressed --out "$OUT/compressed"
    ;;
  pq-g16)  # PQ tests, then 16-byte codebook words against the 8-byte default in interleaved
           # rounds (with every code 0 too), then Nsight Compute on both and the residual default
    step pq_tests 200 python3 -m pytest -q -x -p no:cacheprovider -m "not colbert" \
      tests/kernels/test_maxsim_pq.py
    step kernel_rounds 150 python3 -m experiments.profile_kernels time --rounds 6 \
      --only "packed default,pq16 words 32/1w bd64 rNone g,pq16 words 32/1w bd128 rNone g16,pq16 zero codes words 32/1w bd64,pq32 words 32/1w bd64 rNone g8"
    NCU=$(command -v ncu || ls /opt/nvidia/nsight-compute/*/ncu 2>/dev/null | head -1)
    step kernel_ncu 200 "$NCU" --clock-control none --profile-from-start off --import-source no \
      --section LaunchStats --section Occupancy --section SpeedOfLight --section WarpStateStats \
      --section MemoryWorkloadAnalysis --section MemoryWorkloadAnalysis_Tables \
      python3 -m experiments.profile_kernels profile --only "residual default,pq16 words 32/1w bd64 rNone g,pq16 zero codes words 32/1w bd64 rNone g"
    ;;
  pq-hold)  # PQ tests, then the query held in registers (hold_query, the default) against the
            # query read back from shared memory per product, 8- and 16-byte words, M = 16 and
            # 32, every code 0 too; bench_compressed's main rows; Nsight Compute on both g8 kernels
    step pq_tests 220 python3 -m pytest -q -x -p no:cacheprovider -m "not colbert" \
      tests/kernels/test_maxsim_pq.py
    step kernel_rounds 150 python3 -m experiments.profile_kernels time --rounds 6 \
      --only "packed default,pq16 words 32/1w bd64 rNone g,pq16 words 32/1w bd128 rNone g,pq16 zero codes words 32/1w bd64,pq32 words 32/1w bd64 rNone g8"
    step bench_compressed 150 python3 -m experiments.bench_compressed --out "$OUT/compressed"
    NCU=$(command -v ncu || ls /opt/nvidia/nsight-compute/*/ncu 2>/dev/null | head -1)
    step kernel_ncu 90 "$NCU" --clock-control none --profile-from-start off --import-source no \
      --section LaunchStats --section Occupancy --section SpeedOfLight --section WarpStateStats \
      --section MemoryWorkloadAnalysis --section MemoryWorkloadAnalysis_Tables \
      python3 -m experiments.profile_kernels profile --only "pq16 words 32/1w bd64 rNone g8"
    ;;
  pq-pipeline)  # PQ tests, then code words loaded one tile ahead (pipeline_codes) against per
                # tile, 8- and 16-byte words, tails of 16 and 32 tokens, M = 16 and 32 (one
                # 128-column chunk, query held), every code 0 too; bench_compressed's main rows
    step pq_tests 290 python3 -m pytest -q -x -p no:cacheprovider -m "not colbert" \
      tests/kernels/test_maxsim_pq.py
    step kernel_rounds 120 python3 -m experiments.profile_kernels time --rounds 6 \
      --only "packed default,pq16 words 32/1w bd128 rNone g,pq16 zero codes words 32/1w bd128,pq32 words 32/1w bd128 rNone g8"
    step bench_compressed 120 python3 -m experiments.bench_compressed --out "$OUT/compressed"
    ;;
  pq-final)  # PQ tests (not the config-space property test: the CPU suite runs it), the
             # defaults' variants in rounds, bench_compressed's main rows, and Nsight Compute's
             # warp-stall reasons and tensor-pipe use for the PQ default
    step pq_tests 170 python3 -m pytest -q -x -p no:cacheprovider -m "not colbert" \
      tests/kernels/test_maxsim_pq.py -k "not any_config"
    step kernel_rounds 90 python3 -m experiments.profile_kernels time --rounds 5 \
      --only "packed default,=pq16 words 32/1w bd128 rNone g16,pq16 words 32/2d,pq16 words 32/4d,pq16 words 32/8d,=pq32 words 32/1w bd128 rNone g8,pq32 words 32/1w bd128 rNone g8 pipe"
    step bench_compressed 110 python3 -m experiments.bench_compressed --out "$OUT/compressed"
    NCU=$(command -v ncu || ls /opt/nvidia/nsight-compute/*/ncu 2>/dev/null | head -1)
    step kernel_ncu 70 "$NCU" --clock-control none --profile-from-start off --import-source no \
      --section SpeedOfLight --section Occupancy \
      --metrics "regex:smsp__average_warps_issue_stalled_.*_per_issue_active\.ratio,sm__inst_executed_pipe_tensor_op_hmma.avg.pct_of_peak_sustained_active,sm__pipe_tensor_op_hmma_cycles_active.avg.pct_of_peak_sustained_active,smsp__issue_active.avg.pct_of_peak_sustained_active" \
      python3 -m experiments.profile_kernels profile --only "=pq16 words 32/1w bd128 rNone g16"
    ;;
  pq-tests)  # the PQ test file but its config-space property test, alone: with the held-query
             # and one-tile-ahead tests it compiles for longer than the parts above allow (43
             # tests took 170 s). The property test passed on the GPU at ed5f374 (pq-pipeline).
    step pq_tests 560 python3 -m pytest -q -x -p no:cacheprovider -m "not colbert" \
      tests/kernels/test_maxsim_pq.py -k "not any_config"
    ;;
  pq-smem)  # the codebook staged in shared memory (shared_codebook) against gathers through L1,
             # one to eight warps per program; tiles reduced as they come under register caps;
             # Nsight Compute for the default and the staged one- and four-warp variants
    step pq_tests 150 python3 -m pytest -q -x -p no:cacheprovider -m "not colbert" \
      tests/kernels/test_maxsim_pq.py -k "shared_memory or reduced_as_they_come or many_documents"
    step kernel_rounds 250 python3 -m experiments.profile_kernels time --rounds 6 \
      --only "packed default,=pq16 words 32/1w bd128 rNone g16,words 32+16/1w,words 64+,words 128+,pq16 words 32/4d/1w bd128 rNone g16,g16 tilemax,=pq32 words 32/1w bd128 rNone g8"
    ncu_stalls 150 "=pq16 words 32/1w bd128 rNone g16,=pq16 words 32+16/1w bd128 rNone g16 smem,=pq16 words 64+16/4w bd128 rNone g8 smem,=pq16 words 128+32/8w bd128 rNone g8 smem" \
      --section MemoryWorkloadAnalysis_Tables
    ;;
  pq-close)  # the headline bench at the final PQ default, rounds of the one-warp shapes with
              # and without tiles reduced as they come under a cap, Nsight Compute of the default
    step pq_tests 120 python3 -m pytest -q -x -p no:cacheprovider -m "not colbert" \
      tests/kernels/test_maxsim_pq.py -k "many_documents or reduced_as_they_come or default"
    step kernel_rounds 150 python3 -m experiments.profile_kernels time --rounds 6 \
      --only "packed default,=pq16 words 32/1w bd128 rNone g16,=pq16 words 32/4d/1w bd128 r144 g16 tilemax,=pq32 words 32/1w bd128 rNone g8,=pq32 words 32/4d/1w bd128 r144 g8 tilemax"
    step bench_compressed 200 python3 -m experiments.bench_compressed --out "$OUT/compressed"
    ncu_stalls 100 "=pq16 words 32/4d/1w bd128 r144 g16 tilemax,=pq32 words 32/4d/1w bd128 r144 g8 tilemax"
    ;;
  pq-caps)  # the PQ config-space property test (shared_codebook sampled too); the default's
             # 144-register cap against 128 (16 one-warp programs per SM: registers are split over
             # the SM's four schedulers, so 144 fits 3 per scheduler as 168 does), with occupancy
    step pq_property 240 python3 -m pytest -q -x -p no:cacheprovider -m "not colbert" \
      tests/kernels/test_maxsim_pq.py -k "any_config or shared_memory or refused"
    step kernel_rounds 150 python3 -m experiments.profile_kernels time --rounds 6 \
      --only "packed default,=pq16 words 32/4d/1w bd128 r144 g16 tilemax,=pq16 words 32/4d/1w bd128 r128 g16 tilemax,=pq32 words 32/4d/1w bd128 r144 g8 tilemax,=pq32 words 32/4d/1w bd128 r128 g8 tilemax"
    ncu_stalls 100 "=pq16 words 32/4d/1w bd128 r128 g16 tilemax" --section LaunchStats
    ;;
  pq-parts)  # 32-bit codebook parts: the PQ test file but its property test, the headline bench,
              # then the default with every code 0 (no gather conflicts) against random codes
    step pq_tests 290 python3 -m pytest -q -x -p no:cacheprovider -m "not colbert" \
      tests/kernels/test_maxsim_pq.py -k "not any_config"
    step bench_compressed 200 python3 -m experiments.bench_compressed --out "$OUT/compressed"
    step kernel_rounds 60 python3 -m experiments.profile_kernels time --rounds 4 \
      --only "=pq16 words 32/4d/1w bd128 r128 g16 tilemax,=pq16 zero codes words 32/4d/1w bd128 r128 g16 tilemax,=pq32 words 32/4d/1w bd128 r128 g8 tilemax,=pq32 zero codes words 32/4d/1w bd128 r128 g8 tilemax"
    ;;
  pq-bound)  # the PQ tests pq-parts did not reach in its limit (those after the one-tile-ahead
              # test), the headline bench again, rounds of the PQ default against 8 documents per
              # counter increment, Nsight Compute (stalls, L1 tables) of the M = 16 default
    step pq_tests 200 python3 -m pytest -q -x -p no:cacheprovider -m "not colbert" \
      tests/kernels/test_maxsim_pq.py -k "reduced_as_they_come or shared_memory or persistent or refused or default or many_documents or lookup"
    step bench_compressed 200 python3 -m experiments.bench_compressed --out "$OUT/compressed"
    step kernel_rounds 80 python3 -m experiments.profile_kernels time --rounds 5 \
      --only "packed default,=pq16 words 32/4d/1w bd128 r128 g16 tilemax,=pq16 words 32/8d/1w bd128 r128 g16 tilemax,=pq32 words 32/4d/1w bd128 r128 g8 tilemax,=pq32 words 32/8d/1w bd128 r128 g8 tilemax"
    ncu_stalls 120 "=pq16 words 32/4d/1w bd128 r128 g16 tilemax" --section MemoryWorkloadAnalysis_Tables --section LaunchStats
    ;;
  pq-skew)  # two skewed codebook copies (skewed_codebook): their tests, rounds against the codebook
             # as it is (random and all-zero codes, 128 and 144 registers), the headline bench,
             # Nsight Compute's L1 of both. (Run 4 of results/compressed/h200-register-order ran
             # this when the skew was the default: its labels then were these without " skew"
             # and, for the plain layout, with " noskew".)
    step pq_tests 120 python3 -m pytest -q -x -p no:cacheprovider -m "not colbert" \
      tests/kernels/test_maxsim_pq.py -k "skewed or refused or many_documents or default or word_gathers"
    step kernel_rounds 90 python3 -m experiments.profile_kernels time --rounds 5 \
      --only "packed default,=pq16 words 32/4d/1w bd128 r128 g16 tilemax skew,=pq16 words 32/4d/1w bd128 r128 g16 tilemax,=pq16 words 32/4d/1w bd128 r144 g16 tilemax skew,=pq16 words 32/4d/1w bd128 r144 g16 tilemax,=pq16 zero codes words 32/4d/1w bd128 r128 g16 tilemax skew,=pq16 zero codes words 32/4d/1w bd128 r128 g16 tilemax"
    step bench_compressed 200 python3 -m experiments.bench_compressed --out "$OUT/compressed"
    NCU_EXTRA_METRICS=l1tex__data_bank_conflicts_pipe_lsu_mem_global_op_ld.sum,l1tex__data_pipe_lsu_wavefronts_mem_global_op_ld.sum,l1tex__t_requests_pipe_lsu_mem_global_op_ld.sum \
      ncu_stalls 120 "=pq16 words 32/4d/1w bd128 r128 g16 tilemax skew,=pq16 words 32/4d/1w bd128 r128 g16 tilemax"
    ;;
  pq-latency)  # the word-gather PQ tests at the final default, rounds of the default against
                # code rows asked of L2 ahead (prefetch) or loaded a tile ahead, the headline bench
    step pq_tests 120 python3 -m pytest -q -x -p no:cacheprovider -m "not colbert" \
      tests/kernels/test_maxsim_pq.py -k "skewed or many_documents or default or word_gathers"
    step kernel_rounds 100 python3 -m experiments.profile_kernels time --rounds 5 \
      --only "packed default,=pq16 words 32/4d/1w bd128 r128 g16 tilemax,=pq16 words 32/4d/1w bd128 r128 g16 tilemax pf1,=pq16 words 32/4d/1w bd128 r128 g16 tilemax pf2,=pq16 words 32/4d/1w bd128 r128 g16 tilemax pipe,=pq16 words 32/8d/1w bd128 r128 g16 tilemax"
    step bench_compressed 200 python3 -m experiments.bench_compressed --out "$OUT/compressed"
    ;;
  pq-pipe)  # the headline bench alone, at the PQ default with code words loaded a tile ahead (M = 16)
    step bench_compressed 120 python3 -m experiments.bench_compressed --out "$OUT/compressed"
    ;;
  pq-next)  # the whole PQ test file but its property test at the current commit, then rounds for
             # the open predictions of results/PERFORMANCE_LOG.md (code words a tile ahead with L2
             # prefetch at M = 16; a tile ahead at M = 32) and the headline bench
    step pq_tests 330 python3 -m pytest -q -x -p no:cacheprovider -m "not colbert" \
      tests/kernels/test_maxsim_pq.py -k "not any_config"
    step kernel_rounds 100 python3 -m experiments.profile_kernels time --rounds 5 \
      --only "packed default,=pq16 words 32/4d/1w bd128 r128 g16 tilemax pipe,=pq16 words 32/4d/1w bd128 r128 g16 tilemax pipe pf2,=pq32 words 32/4d/1w bd128 r128 g8 tilemax,=pq32 words 32/4d/1w bd128 r128 g8 tilemax pipe,=pq32 words 32/4d/1w bd128 r128 g8 tilemax pipe pf2"
    step bench_compressed 120 python3 -m experiments.bench_compressed --out "$OUT/compressed"
    ;;
  pq-stream)  # the tile stream (stream_tiles, decode_ahead): its tests and the PQ tests they
              # touch, rounds against the M = 16 / M = 32 defaults, then the bench
    step pq_tests 200 python3 -m pytest -q -x -p no:cacheprovider -m "not colbert" \
      tests/kernels/test_maxsim_pq.py -k "stream or refused or ahead or default"
    step kernel_rounds 200 python3 -m experiments.profile_kernels time --rounds 5 \
      --only "packed default,=pq16 words 32/4d/1w bd128 r128 g16 tilemax pipe,=pq32 words 32/4d/1w bd128 r128 g8 tilemax,pq16 words 32/4d/1w bd128 r128 g16 stream,pq16 words 16/4d/1w bd128 r128 g16 stream,pq16 words 16/4d/1w bd128 r168 g16 stream,pq16 words 16/4d/1w bd128 rNone g16 stream,pq16 words 16/8d/1w bd128 r168 g16 stream,pq16 words 32/4d/1w bd128 rNone g16 stream,pq32 words 32/4d/1w bd128 r128 g8 stream,pq32 words 16/4d/1w bd128 r168 g8 stream"
    step bench_compressed 120 python3 -m experiments.bench_compressed --out "$OUT/compressed"
    ;;
  pq-stream-chunks)  # the tile stream with longer chunks (its pipeline restarts per chunk)
    step kernel_rounds 200 python3 -m experiments.profile_kernels time --rounds 5 \
      --only "packed default,=pq16 words 32/4d/1w bd128 r128 g16 tilemax pipe,=pq16 words 16/8d/1w bd128 r168 g16 stream ahead,pq16 words 16/16d/,pq16 words 16/32d/,pq16 words 16/8d/1w bd128 r128 g16 stream,pq16 words 32/16d/,=pq32 words 32/4d/1w bd128 r128 g8 tilemax,pq32 words 16/16d/"
    ;;
  pq-warps)  # independent warps sharing one codebook: tests, rounds against the defaults, ncu
    step pq_tests 150 python3 -m pytest -q -x -p no:cacheprovider -m "not colbert" \
      tests/kernels/test_maxsim_pq.py -k "independent or refused"
    step kernel_rounds 200 python3 -m experiments.profile_kernels time --rounds 5 \
      --only "packed default,=pq16 words 32/4d/1w bd128 r128 g16 tilemax pipe,=pq32 words 32/4d/1w bd128 r128 g8 tilemax,pq16 warps,pq32 warps"
    NCU_EXTRA_METRICS=breakdown:l1tex__throughput.avg.pct_of_peak_sustained_active,smsp__inst_executed.sum,sm__pipe_tensor_cycles_active.avg.pct_of_peak_sustained_active \
      ncu_stalls 150 "=pq16 warps 16/8d/16w r128 g16 smem skew,=pq16 warps 16/8d/16w r128 g16 smem"
    ;;
  pq-warps-int32)  # independent warps with int32 rows (no spills, 268 instructions per 16-token
                   # tile in sm_90 SASS against 332): tests, rounds against the defaults, ncu
    step pq_tests 150 python3 -m pytest -q -x -p no:cacheprovider -m "not colbert" \
      tests/kernels/test_maxsim_pq.py -k "independent or refused or int32"
    step kernel_rounds 200 python3 -m experiments.profile_kernels time --rounds 5 \
      --only "packed default,=pq16 words 32/4d/1w bd128 r128 g16 tilemax pipe,=pq16 warps 16/8d/16w r128 g16 smem skew,=pq16 warps 16/32d/16w r128 g16 smem skew,=pq16 warps 32/8d/8w rNone g16 smem skew,=pq16 warps 32/16d/8w rNone g16 smem skew,=pq16 warps 32/8d/8w rNone g16 smem"
    NCU_EXTRA_METRICS=breakdown:l1tex__throughput.avg.pct_of_peak_sustained_active,smsp__inst_executed.sum,sm__pipe_tensor_cycles_active.avg.pct_of_peak_sustained_active \
      ncu_stalls 150 "=pq16 warps 16/8d/16w r128 g16 smem skew,=pq16 warps 32/8d/8w rNone g16 smem skew"
    ;;
  pq-warps-balanced)  # independent warps whose chunks are cut into runs of equal tiles per
                      # warp: tests, rounds by chunk size against the defaults, ncu
    step pq_tests 150 python3 -m pytest -q -x -p no:cacheprovider -m "not colbert" \
      tests/kernels/test_maxsim_pq.py -k "independent or refused or int32"
    step kernel_rounds 200 python3 -m experiments.profile_kernels time --rounds 5 \
      --only "packed default,=pq16 words 32/4d/1w bd128 r128 g16 tilemax pipe,=pq16 warps 16/8d/16w r128 g16 smem skew,=pq16 warps 16/16d/16w r128 g16 smem skew,=pq16 warps 16/32d/16w r128 g16 smem skew,=pq16 warps 16/64d/16w r128 g16 smem skew"
    NCU_EXTRA_METRICS=breakdown:l1tex__throughput.avg.pct_of_peak_sustained_active,smsp__inst_executed.sum,sm__pipe_tensor_cycles_active.avg.pct_of_peak_sustained_active \
      ncu_stalls 150 "=pq16 warps 16/32d/16w r128 g16 smem skew"
    ;;
  pq-warps-chunks)  # the balanced independent warps by chunk size, with Nsight Compute of
                    # the slowest (16/8d) and the fastest (16/32d) of run 10
    step pq_tests 150 python3 -m pytest -q -x -p no:cacheprovider -m "not colbert" \
      tests/kernels/test_maxsim_pq.py -k "independent or refused or int32"
    step kernel_rounds 200 python3 -m experiments.profile_kernels time --rounds 5 \
      --only "packed default,=pq16 words 32/4d/1w bd128 r128 g16 tilemax pipe,=pq16 warps 16/8d/16w r128 g16 smem skew,=pq16 warps 16/24d/16w r128 g16 smem skew,=pq16 warps 16/32d/16w r128 g16 smem skew,=pq16 warps 16/48d/16w r128 g16 smem skew"
    NCU_EXTRA_METRICS=breakdown:l1tex__throughput.avg.pct_of_peak_sustained_active,smsp__inst_executed.sum,sm__pipe_tensor_cycles_active.avg.pct_of_peak_sustained_active \
      ncu_stalls 150 "=pq16 warps 16/8d/16w r128 g16 smem skew,=pq16 warps 16/32d/16w r128 g16 smem skew"
    ;;
  pq-final-balanced)  # the whole PQ test file but its property test at the final commit of
                      # the balanced independent warps, rounds against the defaults, the bench
    step pq_tests 400 python3 -m pytest -q -x -p no:cacheprovider -m "not colbert" \
      tests/kernels/test_maxsim_pq.py -k "not any_config"
    step kernel_rounds 100 python3 -m experiments.profile_kernels time --rounds 5 \
      --only "packed default,=pq16 words 32/4d/1w bd128 r128 g16 tilemax pipe,=pq16 warps 16/24d/16w r128 g16 smem skew,=pq16 warps 16/32d/16w r128 g16 smem skew"
    step bench_compressed 120 python3 -m experiments.bench_compressed --out "$OUT/compressed"
    ;;
  pq-mma)  # the CUDA tensor-core PQ kernel (scoring="mma"): its GPU tests, rounds against the
           # dense packed default and the M = 16 PQ default, Nsight Compute on both PQ kernels
    step mma_tests 200 python3 -m pytest -q -x -p no:cacheprovider -m "not colbert" \
      tests/kernels/test_maxsim_pq_mma.py
    step kernel_rounds 200 python3 -m experiments.profile_kernels time --rounds 5 \
      --only "packed default,=pq16 words 32/4d/1w bd128 r128 g16 tilemax pipe,=pq16 mma 16w g4,=pq16 mma 16w g1,=pq16 mma 16w g2,=pq16 mma 16w g8,=pq16 mma 12w g4,=pq16 mma 8w g4,=pq16 mma 24w g4"
    ncu_stalls 150 "=pq16 mma 16w g4,=pq16 words 32/4d/1w bd128 r128 g16 tilemax pipe"
    ;;
  pq-cuda-tests)  # both CUDA PQ kernels' tests and the table tests, at the final commit
    step cuda_tests 200 python3 -m pytest -q -p no:cacheprovider -m "not colbert" \
      tests/kernels/test_maxsim_pq_mma.py tests/kernels/test_maxsim_pq_lut_shared.py \
      tests/kernels/test_maxsim_pq.py -k "mma or lut_shared or lookup or keeps or compiles or many_documents or default or refused"
    ;;
  pq-lut-shared)  # PQ lookup tables in shared memory (CUDA, lut_shared): tests, rounds against
                  # the Triton table kernel and the mma default
    step lut_tests 200 python3 -m pytest -q -p no:cacheprovider -m "not colbert" \
      tests/kernels/test_maxsim_pq_lut_shared.py tests/kernels/test_maxsim_pq.py -k "lut_shared or lookup or keeps or compiles or many_documents_in"
    step kernel_rounds 150 python3 -m experiments.profile_kernels time --rounds 3 \
      --only "packed default,=pq16 mma 16w g4 c2,=pq16 lut r8 32/4w d4,=pq16 lut r32 32/4w d4,lut shared"
    ;;
  pq-mma-whole)  # the whole PQ test file but its property test, the codec's and the mma kernel's
    step pq_tests 480 python3 -m pytest -q -p no:cacheprovider -m "not colbert" \
      tests/kernels/test_maxsim_pq.py tests/kernels/test_maxsim_pq_mma.py tests/codecs/test_pq_codec.py \
      -k "not any_config"
    ;;
  pq-mma-tests)  # the mma kernel's tests alone (after a test fix)
    step mma_tests 200 python3 -m pytest -q -p no:cacheprovider -m "not colbert" \
      tests/kernels/test_maxsim_pq_mma.py
    ;;
  pq-mma-final)  # the final commit, two accumulation chains the default: tests, rounds, bench
    step mma_tests 300 python3 -m pytest -q -p no:cacheprovider -m "not colbert" \
      tests/kernels/test_maxsim_pq_mma.py tests/codecs/test_pq_codec.py \
      tests/kernels/test_maxsim_pq.py -k "mma or many_documents or default or bad_inputs or refused or codec or Codec"
    step kernel_rounds 100 python3 -m experiments.profile_kernels time --rounds 5 \
      --only "packed default,=pq16 words 32/4d/1w bd128 r128 g16 tilemax pipe,=pq16 mma 16w g4,=pq16 mma 16w g4 c2"
    step bench_compressed 150 python3 -m experiments.bench_compressed --out "$OUT/compressed"
    ;;
  pq-mma-staged)  # the mma kernel staging its codebook and loading its query fragments itself
                  # (one memset and one launch per call): tests, rounds, the headline bench
    step mma_tests 300 python3 -m pytest -q -p no:cacheprovider -m "not colbert" \
      tests/kernels/test_maxsim_pq_mma.py tests/codecs/test_pq_codec.py \
      tests/kernels/test_maxsim_pq.py -k "mma or many_documents or default or bad_inputs or refused or codec or Codec"
    step kernel_rounds 100 python3 -m experiments.profile_kernels time --rounds 5 \
      --only "packed default,=pq16 words 32/4d/1w bd128 r128 g16 tilemax pipe,=pq16 mma 16w g4,=pq16 mma 16w g4 c2"
    step bench_compressed 150 python3 -m experiments.bench_compressed --out "$OUT/compressed"
    ;;
  pq-mma-default)  # scoring="mma" as the M = 16 default from MANY_DOCS documents on: the tests
                   # that reach it, rounds, the headline bench
    step mma_tests 300 python3 -m pytest -q -p no:cacheprovider -m "not colbert" \
      tests/kernels/test_maxsim_pq_mma.py tests/codecs/test_pq_codec.py \
      tests/kernels/test_maxsim_pq.py -k "mma or many_documents or default or bad_inputs or refused or codec or Codec"
    step kernel_rounds 100 python3 -m experiments.profile_kernels time --rounds 5 \
      --only "packed default,=pq16 words 32/4d/1w bd128 r128 g16 tilemax pipe,=pq16 mma 16w g4"
    step bench_compressed 150 python3 -m experiments.bench_compressed --out "$OUT/compressed"
    ;;
  pq-mma-host)  # the same after the host's per-call work was cut (cached fragment gather, no
                # host-to-device copies), with two accumulation chains per product
    step mma_tests 200 python3 -m pytest -q -x -p no:cacheprovider -m "not colbert" \
      tests/kernels/test_maxsim_pq_mma.py
    step kernel_rounds 200 python3 -m experiments.profile_kernels time --rounds 5 \
      --only "packed default,=pq16 words 32/4d/1w bd128 r128 g16 tilemax pipe,=pq16 mma 16w g4,=pq16 mma 16w g8,=pq16 mma 16w g4 c2,=pq16 mma 12w g4 c2"
    ncu_stalls 150 "=pq16 mma 16w g4 c2"
    ;;
  pq-final-check)  # the whole PQ test file but its property test at the final commit, rounds of
                   # the independent warps with fewer documents per warp, the headline bench
    step pq_tests 400 python3 -m pytest -q -x -p no:cacheprovider -m "not colbert" \
      tests/kernels/test_maxsim_pq.py -k "not any_config"
    step kernel_rounds 100 python3 -m experiments.profile_kernels time --rounds 5 \
      --only "packed default,=pq16 words 32/4d/1w bd128 r128 g16 tilemax pipe,=pq16 warps 16/8d/16w r128 g16 smem skew,=pq16 warps 16/4d/16w r128 g16 smem skew,=pq16 warps 16/2d/16w r128 g16 smem skew"
    step bench_compressed 120 python3 -m experiments.bench_compressed --out "$OUT/compressed"
    ;;
  pq-l1-breakdown)  # which L1/TEX stage is busiest (Nsight Compute's breakdown of its throughput)
                    # for the M = 16 default and the tile stream with words gathered ahead
    NCU_EXTRA_METRICS=breakdown:l1tex__throughput.avg.pct_of_peak_sustained_active,breakdown:sm__throughput.avg.pct_of_peak_sustained_active \
      ncu_stalls 200 "=pq16 words 32/4d/1w bd128 r128 g16 tilemax pipe,=pq16 words 16/32d/1w bd128 r168 g16 stream ahead"
    ;;
  pq-stream-skew)  # the tile stream with two skewed codebook copies, against the M = 16 default
    step kernel_rounds 200 python3 -m experiments.profile_kernels time --rounds 5 \
      --only "packed default,=pq16 words 32/4d/1w bd128 r128 g16 tilemax pipe,=pq16 words 16/32d/1w bd128 r168 g16 stream ahead,pq16 words 32/4d/1w bd128 r128 g16 tilemax pipe skew,pq16 words 16/32d/1w bd128 r168 g16 stream ahead skew,pq16 words 16/16d/1w bd128 r128 g16 stream ahead skew,pq16 words 16/16d/1w bd128 r128 g16 stream skew,pq16 words 16/32d/1w bd128 rNone g16 stream ahead skew"
    ;;
  pq-stream-ncu)  # Nsight Compute of the M = 16 default against the tile stream with the
                 # codebook words gathered a tile ahead: does hiding the gathers' latency in
                 # the warp change the stalls when the time does not?
    NCU_EXTRA_METRICS=smsp__inst_executed.sum,l1tex__t_requests_pipe_lsu_mem_global_op_ld.sum,l1tex__t_sectors_pipe_lsu_mem_global_op_ld.sum,l1tex__data_pipe_lsu_wavefronts_mem_lg.sum,sm__pipe_tensor_op_hmma_cycles_active.avg.pct_of_peak_sustained_active,sm__inst_executed_pipe_lsu.avg.pct_of_peak_sustained_active,l1tex__lsu_writeback_active.avg.pct_of_peak_sustained_active \
      ncu_stalls 200 "=pq16 words 32/4d/1w bd128 r128 g16 tilemax pipe,=pq16 words 16/32d/1w bd128 r168 g16 stream ahead,=pq16 words 16/16d/1w bd128 r128 g16 stream" --section MemoryWorkloadAnalysis_Tables --section LaunchStats
    ;;
  ncu-compressed)  # Nsight Compute's occupancy, speed-of-light, warp-stall and L1 tables of the
                   # residual and PQ defaults, and of the PQ default with every code 0 (one
                   # launch each): what bounds PQ when its gathers do not conflict
    NCU=$(command -v ncu || ls /opt/nvidia/nsight-compute/*/ncu 2>/dev/null | head -1)
    step kernel_ncu 200 "$NCU" --clock-control none --profile-from-start off --import-source no \
      --section LaunchStats --section Occupancy --section SpeedOfLight --section WarpStateStats \
      --section MemoryWorkloadAnalysis --section MemoryWorkloadAnalysis_Tables \
      python3 -m experiments.profile_kernels profile --only "residual default,pq16 words 32/1w bd64 rNone g8,pq16 zero codes words 32/1w bd64 rNone g8"
    ;;
  compressed-main)  # bench_compressed's main rows and floors only
    step bench_compressed 200 python3 -m experiments.bench_compressed --out "$OUT/compressed"
    ;;
  compressed-sweep)  # residual and PQ kernels, main rows and the launch-config sweep
    step bench_compressed 200 python3 -m experiments.bench_compressed --sweep --out "$OUT/compressed"
    ;;
  plaid-bench)  # the search path's own kernels on the GPU, then end-to-end PLAID (carry runs/plaid_bench)
    step plaid_kernel_tests 120 python3 -m pytest -q -p no:cacheprovider -m "not colbert" \
      tests/plaid/test_centroid.py tests/plaid/test_ivf.py tests/plaid/test_sort.py
    bench_plaid
    ;;
  one-warp-packed)  # the packed default's tests, interleaved rounds against flash-maxsim, main shapes
    step dense_tests 90 python3 -m pytest -q -p no:cacheprovider -m "not colbert" \
      tests/kernels/test_maxsim_dense.py -k "one-warp or default_config or hold or packed"
    step packed_rounds 100 python3 -m experiments.profile_kernels time --rounds 8 \
      --only "packed default,packed 32/2w/2st,packed 1w hold 16 d4/3st,flash_maxsim_packed,floor read"
    step bench_dense 200 python3 -m experiments.bench --no-sweeps --out "$OUT/bench" \
      --providers tilemaxsim,flash_maxsim
    ;;
  packed-ceiling)  # main shapes vs flash-maxsim, with the packed shape's per-document floors
    step bench_dense 200 python3 -m experiments.bench --no-sweeps --out "$OUT/bench" \
      --providers tilemaxsim,flash_maxsim
    ;;
  profile-encode)  # host vs GPU time of one query's encode, stock and patched (carry runs/plaid_bench)
    step profile_encode 200 python3 -m experiments.profile_encode --bundle runs/plaid_bench \
      --encoder-shapes bundle minilm-l6 bert-base --calls 200 --lines 30
    ;;
  plaid-only)  # end-to-end PLAID and the residual kernel tests, on one GPU
    step residual_tests 160 python3 -m pytest -q -p no:cacheprovider -m "not colbert" \
      tests/kernels/test_maxsim_residual.py
    bench_plaid
    ;;
  recheck)
    gpu_tests
    step bench_compressed 120 python3 -m experiments.bench_compressed --out "$OUT/compressed"
    step bench_dense 90 python3 -m experiments.bench --no-sweeps --out "$OUT/bench"
    # End-to-end PLAID is the plaid-only part: with it the step limits would pass 10 minutes.
    ;;
  reproduce)
    # Search only here; ranx (evaluate, report) runs on the CPU machine from the returned runs.
    step reproduce_wiki 200 python3 -m experiments.reproduce configs/wiki-vital-h200.yaml \
      --steps search --out runs/wvgpu
    # The length-* conditions (three more indexes to write) are left for a longer call.
    step reproduce_synthetic 230 python3 -m experiments.reproduce configs/synthetic-scale.yaml \
      --steps prepare,search --out runs/syngpu \
      --conditions rerank-1k,rerank-10k,rerank-100k,rerank-1m,plaid-k10,plaid-k100,plaid-k1000
    for name in wiki-vital-h200:runs/wvgpu synthetic-scale:runs/syngpu; do
      experiment=${name%%:*} root=${name#*:}
      [ -d "$root/$experiment/results" ] && tar -cJf "$BUNDLE_DIR/runs-$experiment.tar.xz" -C "$root/$experiment" results
    done
    ;;
  equivalence)
    # Per-query candidate sets and top-k on the GPU (fused kernels vs colbert-ai's fp16 path),
    # on the carried wiki-vital-h200 bundle (runs/wvgpu).
    step equivalence 400 python3 -m experiments.equivalence configs/wiki-vital-h200.yaml \
      --condition d128-k10 --ks 10 100 1000 --runs runs/wvgpu --out "$OUT/equivalence" --device cuda
    ;;
  reproduce-d384)
    # configs/wiki-vital-h200-d384.yaml: carry runs/wv384gpu (prepare's output without the
    # checkpoint and collection text, ~34 MB).
    step reproduce_d384 300 python3 -m experiments.reproduce configs/wiki-vital-h200-d384.yaml \
      --steps search --out runs/wv384gpu
    [ -d runs/wv384gpu/wiki-vital-h200-d384/results ] && tar -cJf "$BUNDLE_DIR/runs-wiki-vital-h200-d384.tar.xz" \
      -C runs/wv384gpu/wiki-vital-h200-d384 results
    ;;
  lengths)
    # configs/synthetic-scale.yaml's length-32/64/128 conditions: three 100k-passage indexes,
    # written here, exact-scoring throughput per passage length.
    step reproduce_lengths 240 python3 -m experiments.reproduce configs/synthetic-scale.yaml \
      --steps prepare,search --out runs/synlen --conditions length-32,length-64,length-128
    [ -d runs/synlen/synthetic-scale/results ] && tar -cJf "$BUNDLE_DIR/runs-synthetic-lengths.tar.xz" \
      -C runs/synlen/synthetic-scale results
    ;;
  plaid)
    # bench_plaid writes (or reuses) its own 1M-passage synthetic index: its spec records the
    # bundle's encoder, so an index from `tilemaxsim synthesize` would not match it.
    bench_plaid
    if [ "$(python3 -c 'import torch; print(torch.cuda.device_count())')" -ge 2 ]; then
      step bench_distributed 120 torchrun --nproc_per_node=2 experiments/bench_distributed.py \
        --residual-size 8GiB --out "$OUT/distributed"
    fi
    ;;
esac
tar -czf "$BUNDLE_DIR/results-$part.tar.gz" -C "$OUT" .
cat "$OUT/steps.txt"
for f in "$OUT"/*.log; do echo "=== tail $f"; tail -n 25 "$f"; done
