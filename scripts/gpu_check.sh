#!/usr/bin/env bash
# GPU check for the TensorRT target, on a machine with an NVIDIA GPU and `pip install 'vitedge[tensorrt]'`:
# builds fp32 and fp16 engines for one model per family through `vitedge export` (the parity ladder, failing on
# any failed or unverified hop), checks each sidecar's precision check, an int8 engine of the trained SwiftFormer
# fixture (explicit quantization from its QDQ graph), then a short `vitedge bench` with
# TensorRT (end-to-end and GPU-compute latency). One PASS/FAIL line per step; exit 1 if any step failed.
# About 5 minutes on a recent GPU. Not run in this project's CI (no GPU). Usage: scripts/gpu_check.sh [OUT_DIR]
set -uo pipefail

OUT="${1:-runs/gpu_check}"
LOGS="$OUT/logs"
mkdir -p "$LOGS"
source "$(dirname "$0")/_steps.sh"
MODELS=(swiftformer_xs slab_deit_tiny sima_nano_12_p16)   # one per family: SwiftFormer, SLAB, SimA
SAMPLES=64

step tensorrt-import python -c "import tensorrt; print('tensorrt', tensorrt.__version__)"
step cuda-runtime python -c "from vitedge.targets.cuda_memory import memory_backend as m; b, why = m(); print(b or why); assert b"
step gpu nvidia-smi --query-gpu=name,driver_version --format=csv,noheader

for model in "${MODELS[@]}"; do
  for precision in fp32 fp16; do
    dir="$OUT/$model-$precision"
    step "export-$model-$precision" vitedge export --model "$model" --target onnx,tensorrt --precision "$precision" \
      --samples "$SAMPLES" --require-verified --timing-cache "$OUT/timing.cache" --out "$dir" --force
    step "precision-$model-$precision" python - "$dir/$model.engine.json" <<'PY'
import json, sys
side = json.load(open(sys.argv[1]))
check = side["precision_check"]
print(f"{side['precision_requested']} -> {side['precision_built']}: {check['status']} ({check['evidence']}): "
      f"{check['reason']}; fp32 layers verified: {side['fp32_policy']['pinned_layers']}")
sys.exit(0 if check["status"] == "confirmed" else 1)
PY
  done
done

# int8 (issue 18): the trained SwiftFormer fixture, engine built strongly typed from its QDQ graph, judged by the
# int8 profile on natural images (tensorrt-qdq: the same graph on ONNX Runtime)
FIX="$(dirname "$0")/../tests/fixtures/trained"   # the checkout this script is in
step export-int8 vitedge export --model swiftformer_xs --checkpoint "$FIX/swiftformer_digits.pth" \
  --set "layers=[1,1,2,1]" --set "embed_dims=[16,24,48,64]" --set num_classes=10 --imgsz 32 \
  --target onnx,tensorrt --precision int8 --samples "$SAMPLES" --require-verified --out "$OUT/int8" --force
step precision-int8 python - "$OUT/int8/swiftformer_xs.engine.json" <<'PY'
import json, sys
side = json.load(open(sys.argv[1]))
check = side["precision_check"]
print(f"int8 -> {side['precision_built']}: {check['status']} ({check['evidence']}): {check['reason']}; "
      f"built from {side['source_onnx']['file']}")
sys.exit(0 if check["status"] == "confirmed" else 1)
PY

step bench vitedge bench --model "${MODELS[0]}" --backends torch-deploy,onnxruntime,tensorrt \
  --min-iters 20 --max-s 1 --report "$OUT/bench.json"
step bench-gpu-compute python - "$OUT/bench.json" <<'PY'
import json, sys
r = [x for x in json.load(open(sys.argv[1]))["results"] if x["backend"] == "tensorrt"][0]
if not (r["valid"] and r.get("latency") and r.get("gpu_compute")):  # failed parity or unavailable: never timed
    print(f"tensorrt {r['status']} ({r.get('precision')}): not timed: {r.get('reason')}")
    sys.exit(1)
print(f"tensorrt {r['status']} ({r.get('precision')}): end to end p50 {r['latency']['p50_ms']:.3f} ms, "
      f"GPU compute p50 {r['gpu_compute']['p50_ms']:.3f} ms")
PY
finish gpu_check
