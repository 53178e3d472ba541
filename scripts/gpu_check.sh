#!/usr/bin/env bash
# GPU check for the TensorRT target, on a machine with an NVIDIA GPU and `pip install 'vitedge[tensorrt10]'` (CUDA 12)
# or 'vitedge[tensorrt11]' (CUDA 13): builds fp32 and fp16 engines for one model per family through `vitedge
# export` (the parity ladder, failing on any failed or unverified hop), checks each sidecar's precision check and
# saves each engine's inspector layer info (layer_info/, for tests/fixtures/tensorrt/), an int8 engine of the
# trained SwiftFormer fixture (explicit quantization from its QDQ graph), a short `vitedge bench` with TensorRT
# (end-to-end and GPU-compute latency, judged by the fp16 profile). Cross-checks by NVIDIA's own tools where
# installed: `trtexec --loadEngine` on vitedge's plain engine file (it loads outside vitedge; its "GPU Compute
# Time" median against `vitedge bench --artifact`'s on the same file; `--exportLayerInfo` saved too) and
# `polygraphy run model.onnx --trt --onnxrt` (fp32, TensorRT against ONNX Runtime). One PASS/FAIL/SKIP line per
# step; exit 1 if any step failed. About 5-8 minutes on a recent GPU. Not run in this project's CI (no GPU).
# Usage: scripts/gpu_check.sh [OUT_DIR]
set -uo pipefail

OUT="${1:-runs/gpu_check}"
LOGS="$OUT/logs"
mkdir -p "$LOGS"
source "$(dirname "$0")/_steps.sh"
MODELS=(swiftformer_xs slab_deit_tiny sima_nano_12_p16)   # one per family: SwiftFormer, SLAB, SimA
SAMPLES=64

step tensorrt-import python -c "import tensorrt; print('tensorrt', tensorrt.__version__)"
step cuda-runtime python -c "from vitedge.targets.tensorrt.cuda_memory import memory_backend as m; b, why = m(); print(b or why); assert b"
step gpu nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
# the runner's buffer backends (torch.cuda, cuda-python): round trips and events on this GPU; then the engine tests.
# VITEDGE_GPU_CHECK=1 turns their skips into failures: on this machine a backend that cannot run is a failure
TESTS="$(dirname "$0")/../tests"
step cuda-memory env VITEDGE_GPU_CHECK=1 python -m pytest -q -n 0 -m gpu "$TESTS/test_cuda_memory.py"
step gpu-tests env VITEDGE_GPU_CHECK=1 python -m pytest -q -n 0 -m gpu "$TESTS/test_tensorrt.py"

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
    step "layer-info-$model-$precision" python - "$dir/$model.engine" "$OUT/layer_info/$model-$precision.json" <<'PY'
import json, sys
from pathlib import Path
import tensorrt as trt
engine = trt.Runtime(trt.Logger(trt.Logger.WARNING)).deserialize_cuda_engine(Path(sys.argv[1]).read_bytes())
info = engine.create_engine_inspector().get_engine_information(trt.LayerInformationFormat.JSON)
out = Path(sys.argv[2])
out.parent.mkdir(parents=True, exist_ok=True)
out.write_text(info)
layers = json.loads(info)
layers = layers if isinstance(layers, list) else layers.get("Layers", [])
kinds = sorted({str(x.get("LayerType")) for x in layers if isinstance(x, dict)})
print(f"{len(layers)} layers ({', '.join(kinds)}) -> {out}")
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

# NVIDIA's own tools on vitedge's plain engine file (SwiftFormer fp16, static batch 1)
ENGINE="$OUT/${MODELS[0]}-fp16/${MODELS[0]}.engine"
step bench-artifact vitedge bench --artifact "$ENGINE" --min-iters 100 --max-s 2 --report "$OUT/bench_engine.json"
if command -v trtexec >/dev/null 2>&1; then
  step trtexec-load trtexec --loadEngine="$ENGINE" --iterations=200 --warmUp=500 --duration=0 \
    --profilingVerbosity=detailed --exportLayerInfo="$OUT/layer_info/${MODELS[0]}-fp16.trtexec.json"
  step gpu-compute-vs-trtexec python - "$LOGS/trtexec-load.log" "$OUT/bench_engine.json" <<'PY'
import json, re, sys
log = open(sys.argv[1]).read()
m = re.search(r"GPU Compute Time: .*?median = ([0-9.]+) ms", log)
r = json.load(open(sys.argv[2]))["results"][0]
if not m or not r.get("gpu_compute"):
    print(f"no figure to compare: trtexec median {'found' if m else 'missing'}, vitedge's gpu_compute "
          f"{'found' if r.get('gpu_compute') else 'missing'} ({r.get('status')}: {r.get('reason')})")
    sys.exit(1)
theirs, ours = float(m.group(1)), r["gpu_compute"]["p50_ms"]
print(f"GPU compute median: trtexec {theirs:.4f} ms, vitedge's {ours:.4f} ms, ratio {ours / theirs:.2f} "
      "(both time one enqueue between CUDA events; within 0.67-1.5x passes)")
sys.exit(0 if 0.67 <= ours / theirs <= 1.5 else 1)
PY
else
  skip trtexec-load "trtexec is not on PATH (it ships in the TensorRT tar/deb packages and NGC containers, not the wheel)"
  skip gpu-compute-vs-trtexec "no trtexec"
fi
if command -v polygraphy >/dev/null 2>&1; then
  step polygraphy-fp32 polygraphy run "$OUT/${MODELS[0]}-fp32/${MODELS[0]}.onnx" --trt --onnxrt \
    --atol 1e-4 --rtol 1e-3
else
  skip polygraphy-fp32 "polygraphy is not installed (pip install polygraphy)"
fi
finish gpu_check
