#!/usr/bin/env bash
# The GPU results of chapter 4 (section 4.12) in one run of at most 8 minutes on an NVIDIA H100, no
# training and no download on the device:
#
#   bash scripts/gpu_results.sh OUT
#
# 1. the GPU tests (tests/test_gpu_path.py, their CUDA cases: graphs, one sync per step, chi-square on the device);
# 2. the GPU path with and without its prompt graphs, its drafting ahead and the package's decoder
#    (scripts/gpu_ablation.py, in the log);
# 3. the built-in pair's benchmark in bfloat16 (OUT/gpu-builtin-bfloat16.json: commit it as results/gpu.json), with
#    autoregressive decoding on both forwards: its "best" names the fastest baseline (fastest_ar);
# 4. the cost probe at full size (OUT/costs.json: Llama-3.1-8B / 3.2-1B and Qwen2.5-7B / 0.5B, random weights);
# 5. where a speculative step's time goes on the GPU path (`bench --suite profile`, in the log);
# 6. tokens per call and time per step against the size of a token tree on the GPU path (OUT/trees-gpu.json: commit
#    it as results/trees-gpu.json, for chapter 6's curve);
# 7. batched autoregressive decoding over the dynamic cache and over the static one, its calls replayed as graphs
#    per batch bucket (scripts/batch_speed.py, in the log; step 1 runs the static batch's CUDA test);
# 8. only when STEPS names them: every method of the book on the GPU path (OUT/family-gpu.json, `bench --suite
#    family --gpu-path`, greedy rows checked against autoregressive decoding), the built-in pair in float16,
#    without Hugging Face's rows (OUT/gpu-builtin-float16.json), and with compiled kernels inside the graphs,
#    without Hugging Face's rows (OUT/gpu-builtin-compiled.json): its warm-up is compilation, a minute or more.
#
# Each step has a time limit of its own, so a slow step cannot take the others' time; the logs land in OUT/log.txt,
# the steps' times in OUT/steps.txt.
# STEPS (default "tests ablation bfloat16 costs profile trees batch") picks the steps, in that order; the limits of the
# default add up to 530 s.
# The device lacks altair and the jsonschema stack: wheels found in .whl/ are installed first (see
# ../shared/GPU.md for the command that downloads them on a machine with a network). Settings from the
# environment: PYTHON, KS, REPEATS, STEPS, and HF=--no-hf to leave Hugging Face's rows out of step 2.
set -uo pipefail
out=${1:?usage: bash scripts/gpu_results.sh OUT}
mkdir -p "$out"
if compgen -G ".whl/*.whl" >/dev/null; then
    python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl
    export PYTHONPATH=/tmp/site
fi
export PYTHONPATH=src${PYTHONPATH:+:$PYTHONPATH} PYTHONUNBUFFERED=1 TQDM_DISABLE=1  # no progress bars in the logs
ks=${KS:-3,4,5,6} repeats=${REPEATS:-3} python=${PYTHON:-python3} steps=" ${STEPS:-tests ablation bfloat16 costs profile trees batch} "
started=$SECONDS

step() {  # step NAME SECONDS COMMAND...: run with a time limit, log to OUT/log.txt, note its time in OUT/steps.txt
    local name=$1 limit=$2
    shift 2
    local begun=$SECONDS
    echo "=== $name: $*" >>"$out/log.txt"
    timeout "$limit" "$@" >>"$out/log.txt" 2>&1
    local status=$?
    echo "$name: exit $status, $((SECONDS - begun)) s (limit $limit s)" | tee -a "$out/steps.txt"
}

nvidia-smi >>"$out/log.txt" 2>&1
$python -c "import torch, transformers; print(torch.__version__, torch.version.cuda, transformers.__version__)" \
    | tee -a "$out/steps.txt"
wanted() { [[ $steps == *" $1 "* ]]; }
wanted tests && step tests 100 $python -m pytest tests/test_gpu_path.py tests/test_row_graphs.py -q -rs \
    -k "not cpu and (test_gpu_path or cuda)" -p no:cacheprovider -p no:logging
wanted ablation && step ablation 65 $python scripts/gpu_ablation.py --device cuda --dtype bfloat16 --k 5 --repeats 3
wanted bfloat16 && step builtin-bfloat16 205 $python -m specbook bench --suite gpu --device cuda --dtype bfloat16 \
    --ks "$ks" --repeats "$repeats" ${HF:---hf} --json "$out/gpu-builtin-bfloat16.json"
wanted costs && step costs 60 $python -m specbook bench --suite costs --device cuda --ks 6 --repeats 10 \
    --json "$out/costs.json"
wanted float16 && step builtin-float16 60 $python -m specbook bench --suite gpu --device cuda --dtype float16 \
    --ks 4,5 --repeats 2 --no-hf --json "$out/gpu-builtin-float16.json"
wanted profile && step profile 30 $python -m specbook bench --suite profile --device cuda --dtype bfloat16 \
    --ks 3,5 --prompts open
wanted trees && step trees 45 $python -m specbook bench --suite trees --gpu-path --device cuda --dtype bfloat16 \
    --categories open,repetitive --max-new-tokens 48 --repeats 2 --json "$out/trees-gpu.json"
wanted batch && step batch 25 $python scripts/batch_speed.py --device cuda --dtype bfloat16 --caches dynamic,static \
    --batch-sizes 1,4,16,32 --tokens 32 --rounds 2
wanted family && step family 150 $python -m specbook bench --suite family --gpu-path --device cuda --dtype bfloat16 \
    --repeats 1 --json "$out/family-gpu.json"
wanted compiled && step builtin-compiled 200 $python -m specbook bench --suite gpu --device cuda --dtype bfloat16 \
    --compile --ks 4,5 --repeats 2 --no-hf --json "$out/gpu-builtin-compiled.json"
echo "all steps: $((SECONDS - started)) s" | tee -a "$out/steps.txt"
