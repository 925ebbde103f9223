#!/usr/bin/env bash
# The GPU results of chapter 4 (section 4.12) in one run of at most 8 minutes on an NVIDIA H100, no
# training and no download on the device:
#
#   bash scripts/gpu_results.sh OUT
#
# 1. the GPU tests (tests/test_gpu_path.py, their CUDA cases: graphs, one sync per step, chi-square on the device);
# 2. the built-in pair's benchmark in bfloat16 (OUT/gpu-builtin-bfloat16.json: commit it as results/gpu.json);
# 3. the cost probe at full size (OUT/costs.json: Llama-3.1-8B / 3.2-1B and Qwen2.5-7B / 0.5B, random weights);
# 4. the built-in pair in float16, without Hugging Face's rows (OUT/gpu-builtin-float16.json).
#
# Each step has a time limit of its own, so a slow step cannot take the others' time; every log lands in OUT.
# The device lacks altair and the jsonschema stack: wheels found in .whl/ are installed first (see
# ../shared/GPU.md for the command that downloads them on a machine with a network). Settings from the
# environment: PYTHON, KS, REPEATS.
set -uo pipefail
out=${1:?usage: bash scripts/gpu_results.sh OUT}
mkdir -p "$out"
if compgen -G ".whl/*.whl" >/dev/null; then
    python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl
    export PYTHONPATH=/tmp/site
fi
export PYTHONPATH=src${PYTHONPATH:+:$PYTHONPATH} PYTHONUNBUFFERED=1 TQDM_DISABLE=1  # no progress bars in the logs
ks=${KS:-3,4,5,6} repeats=${REPEATS:-3} python=${PYTHON:-python3}
started=$SECONDS

step() {  # step NAME SECONDS COMMAND...: run with a time limit, log to OUT/NAME.log, note its time
    local name=$1 limit=$2
    shift 2
    local begun=$SECONDS
    timeout "$limit" "$@" >"$out/$name.log" 2>&1
    local status=$?
    echo "$name: exit $status, $((SECONDS - begun)) s (limit $limit s)" | tee -a "$out/steps.txt"
}

nvidia-smi >"$out/nvidia-smi.txt" 2>&1
$python -c "import torch, transformers; print(torch.__version__, torch.version.cuda, transformers.__version__)" \
    | tee "$out/versions.txt"
step tests 170 $python -m pytest tests/test_gpu_path.py -q -rs -k "not cpu" -p no:cacheprovider
step builtin-bfloat16 150 $python -m specbook bench --suite gpu --device cuda --dtype bfloat16 --ks "$ks" \
    --repeats "$repeats" --json "$out/gpu-builtin-bfloat16.json"
step costs 90 $python -m specbook bench --suite costs --device cuda --ks 6 --repeats 10 --json "$out/costs.json"
step builtin-float16 60 $python -m specbook bench --suite gpu --device cuda --dtype float16 --ks 4,5 \
    --repeats 2 --no-hf --json "$out/gpu-builtin-float16.json"
echo "all steps: $((SECONDS - started)) s" | tee -a "$out/steps.txt"
