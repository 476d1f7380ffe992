#!/usr/bin/env bash
# The GPU checks in one command, from the project root, on a machine with a CUDA GPU,
# PyTorch and transformers (no vLLM or network needed): the wheels in .whl/ (from
# scripts/gpu_wheels.sh) are installed beside the project, then benchmarks/gpu_learner.py
# measures the learner (0.5B and 1.5B Qwen2 shapes; about 7 minutes on an H100). Records go
# to $OUT/gpu_learner.json and the log to $OUT/gpu_learner.log (OUT defaults to
# ./gpu-check). Extra arguments go to the benchmark (e.g. --sizes 0.5b --budget 200).
set -uo pipefail
[ -d loomrl ] || { echo "run this from the project root" >&2; exit 1; }
out=${OUT:-gpu-check}
mkdir -p "$out"
if compgen -G ".whl/*.whl" > /dev/null; then
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
    --target /tmp/loomrl-site .whl/*.whl || exit 1
  export PYTHONPATH=/tmp/loomrl-site:$PWD
else
  export PYTHONPATH=$PWD${PYTHONPATH:+:$PYTHONPATH}
fi
nvidia-smi -L
PYTHONUNBUFFERED=1 python3 benchmarks/gpu_learner.py --out "$out/gpu_learner.json" "$@" \
  2>&1 | tee "$out/gpu_learner.log"
exit "${PIPESTATUS[0]}"
