#!/usr/bin/env bash
# GPU check for the TensorRT target, on a machine with an NVIDIA GPU, run from a checkout of vitedge installed
# editable with its test extra: `pip install -e '.[tensorrt10,test]'` (CUDA 12) or `-e '.[tensorrt11,test]'`
# (CUDA 13; on Python 3.14 only this one installs). Its first step checks that install (the GPU tests import the
# checkout's test helpers, pytest needs pytest-xdist) and stops with the one command that fixes it. Then: builds
# fp32 and fp16 engines for one model per family through `vitedge export` (the parity ladder, failing on any
# failed or unverified hop), checks each sidecar's precision check and saves each engine's inspector layer info
# (layer_info/, for tests/fixtures/tensorrt/), an int8 engine of the trained SwiftFormer fixture (explicit
# quantization from its QDQ graph), a short `vitedge bench` with TensorRT (end-to-end and GPU-compute latency,
# judged by the fp16 profile). Cross-checks by NVIDIA's own tools where installed: `trtexec --loadEngine` on
# vitedge's plain engine file (it loads outside vitedge; its "GPU Compute Time" median against `vitedge bench
# --artifact`'s on the same file; `--exportLayerInfo` saved too) and `polygraphy run model.onnx --trt --onnxrt`
# (fp32, TensorRT against ONNX Runtime). One PASS/FAIL/INCONCLUSIVE/SKIP line per step (a precision check follows
# the target's rule: refuted fails, inconclusive is neither); exit 1 if any step failed, 2 if setup failed.
# The whole run, versions first and every step's full output, is written to one log (GPU_CHECK_LOG, default
# benchmarks/results/gpu_check/<UTC date>.log in this checkout): commit it, docs/devices.md links there.
# About 5-8 minutes on a recent GPU. Not run in this project's CI (no GPU).
# Usage: scripts/gpu_check.sh [--setup-only] [OUT_DIR]   (--setup-only: the install checks, then stop)
set -uo pipefail

SETUP_ONLY=0
if [ "${1:-}" = "--setup-only" ]; then SETUP_ONLY=1; shift; fi
HERE="$(cd "$(dirname "$0")" && pwd)"
CHECKOUT="$(dirname "$HERE")"
OUT="${1:-runs/gpu_check}"
LOGS="$OUT/logs"
mkdir -p "$LOGS"
RECORD="${GPU_CHECK_LOG:-}"
if [ -z "$RECORD" ]; then  # <UTC date>.log, never overwriting an earlier run's (then <date>-2.log, ...)
  base="$CHECKOUT/benchmarks/results/gpu_check/$(date -u +%F)"
  RECORD="$base.log"
  n=2
  while [ -e "$RECORD" ]; do RECORD="$base-$n.log"; n=$((n + 1)); done
fi
mkdir -p "$(dirname "$RECORD")"
: >"$RECORD"
source "$HERE/_steps.sh"
MODELS=(swiftformer_xs slab_deit_tiny sima_nano_12_p16)   # one per family: SwiftFormer, SLAB, SimA
SAMPLES=64

say "gpu_check $(date -u +%FT%TZ), log: $RECORD"
step versions python "$HERE/gpu_check_steps.py" versions
if ! step setup python "$HERE/gpu_check_steps.py" setup "$CHECKOUT"; then
  say "setup failed, nothing else was run: $(tail -n 1 "$LOGS/setup.log")"
  exit 2
fi
step tensorrt-import python -c "import tensorrt; print('tensorrt', tensorrt.__version__)"
if [ "$SETUP_ONLY" -eq 1 ]; then
  finish gpu_check-setup
  exit
fi
step cuda-runtime python -c "from vitedge.targets.tensorrt.cuda_memory import memory_backend as m; b, why = m(); print(b or why); assert b"
step gpu nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
# the runner's buffer backends (torch.cuda, cuda-python): round trips and events on this GPU; then the engine tests.
# VITEDGE_GPU_CHECK=1 turns their skips into failures: on this machine a backend that cannot run is a failure
TESTS="$CHECKOUT/tests"
step cuda-memory env VITEDGE_GPU_CHECK=1 python -m pytest -q -n 0 -m gpu "$TESTS/test_cuda_memory.py"
step gpu-tests env VITEDGE_GPU_CHECK=1 python -m pytest -q -n 0 -m gpu "$TESTS/test_tensorrt.py"

for model in "${MODELS[@]}"; do
  for precision in fp32 fp16; do
    dir="$OUT/$model-$precision"
    step "export-$model-$precision" vitedge export --model "$model" --target onnx,tensorrt --precision "$precision" \
      --samples "$SAMPLES" --require-verified --timing-cache "$OUT/timing.cache" --out "$dir" --force
    step "precision-$model-$precision" python "$HERE/gpu_check_steps.py" precision "$dir/$model.engine.json"
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

# int8: the trained SwiftFormer fixture, engine built strongly typed from its QDQ graph, judged by the int8
# profile on natural images (tensorrt-qdq: the same graph on ONNX Runtime); its precision check by the same rule
FIX="$CHECKOUT/tests/fixtures/trained"
step export-int8 vitedge export --model swiftformer_xs --checkpoint "$FIX/swiftformer_digits.pth" \
  --set "layers=[1,1,2,1]" --set "embed_dims=[16,24,48,64]" --set num_classes=10 --imgsz 32 \
  --target onnx,tensorrt --precision int8 --samples "$SAMPLES" --require-verified --out "$OUT/int8" --force
step precision-int8 python "$HERE/gpu_check_steps.py" precision "$OUT/int8/swiftformer_xs.engine.json"

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
