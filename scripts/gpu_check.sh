#!/usr/bin/env bash
# GPU check for the TensorRT target: on a machine with an NVIDIA GPU and the tensorrt package,
# builds fp32 and fp16 engines for one model per family through `vitedge export` (which runs the parity
# ladder and fails on any failed or unverified hop), then a short `vitedge bench` with TensorRT.
# Finishes in under 5 minutes on a recent GPU. Usage: scripts/gpu_check.sh [OUT_DIR]
set -euo pipefail

OUT="${1:-runs/gpu_check}"
MODELS=(swiftformer_xs slab_deit_tiny sima_nano_12_p16)   # one per family: SwiftFormer, SLAB, SimA
SAMPLES=64

python -c "import tensorrt, sys; print('tensorrt', tensorrt.__version__)"
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader

for model in "${MODELS[@]}"; do
  for precision in fp32 fp16; do
    echo "== export $model $precision"
    vitedge export --model "$model" --target onnx,tensorrt --precision "$precision" \
      --samples "$SAMPLES" --require-verified --timing-cache "$OUT/timing.cache" \
      --out "$OUT/$model-$precision" --force
    test -s "$OUT/$model-$precision/$model.engine"
    test -s "$OUT/$model-$precision/$model.engine.json"
  done
done

echo "== bench ${MODELS[0]}"
vitedge bench --model "${MODELS[0]}" --backends torch-deploy,onnxruntime,tensorrt \
  --min-iters 20 --max-s 1 --report "$OUT/bench.json"
echo "gpu_check: all engines built and verified"
