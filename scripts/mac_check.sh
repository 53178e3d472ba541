#!/usr/bin/env bash
# macOS check for the CoreML target, on a Mac (Apple silicon for the Neural Engine steps) with vitedge installed:
# exports a CoreML package, re-runs its parity hop on CoreML itself (`--mode device --require-verified`), prints
# the compute plan (each op's preferred device), benches the fp16 package with `vitedge bench --backends coreml`
# (judged by the fp16 profile, then timed), gates Neural Engine residency where a Neural Engine exists,
# and, with an iPhone connected (as coremltools sees it) and VITEDGE_TEAM_ID set, times the model on the phone
# with its golden-vector parity there. One PASS/FAIL (or SKIP, with why) line per step; exit 1 if any step failed.
# Not run in this project's CI (no Mac). Usage: scripts/mac_check.sh [OUT_DIR] [MODEL]
set -uo pipefail

OUT="${1:-runs/mac_check}"
MODEL="${2:-swiftformer_xs}"
LOGS="$OUT/logs"
mkdir -p "$LOGS"
source "$(dirname "$0")/_steps.sh"
PKG="$OUT/$MODEL/$MODEL.mlpackage"

step macos python -c "import platform, sys; print(platform.mac_ver()[0]); assert sys.platform == 'darwin'"
step coremltools python -c "import coremltools as ct; from coremltools import libcoremlpython; print(ct.__version__)"
step export-coreml vitedge export --model "$MODEL" --target coreml --samples 64 --out "$OUT/$MODEL" --force
step coreml-device-hop vitedge parity --model "$MODEL" --artifact "$PKG" --mode device --require-verified \
  --samples 64 --report "$OUT/parity_device.json"
step compute-plan python - "$PKG" <<'PY'
import sys
from pathlib import Path
from vitedge.targets.coreml import CoreMLFramework
fw = CoreMLFramework()
plan = fw.compute_plan(Path(sys.argv[1]), "CPU_AND_NE")
share = plan["cost_share"]["ane"] if plan["cost_share"] else plan["ane_op_share"]
print(f"{plan['ops']} ops: ane {plan['ane']}, gpu {plan['gpu']}, cpu {plan['cpu']}, unknown {plan['unknown']}; "
      f"Neural Engine share {share:.0%}; Neural Engine present: {fw.has_neural_engine()}")
sys.exit(0 if plan["ops"] > 0 and plan["unknown"] < plan["ops"] else 1)
PY
step bench-coreml vitedge bench --model "$MODEL" --backends torch-deploy,coreml --min-iters 20 --max-s 1 \
  --report "$OUT/bench_coreml.json"
step bench-coreml-fp16 python - "$OUT/bench_coreml.json" <<'PY'
import json, sys
r = [x for x in json.load(open(sys.argv[1]))["results"] if x["backend"] == "coreml"][0]
if not (r["valid"] and r.get("latency")):
    print(f"coreml {r['status']} ({r.get('precision')}): not timed: {r.get('reason')}")
    sys.exit(1)
print(f"coreml {r['status']} ({r.get('precision')}, {r.get('mode')}): p50 {r['latency']['p50_ms']:.3f} ms; "
      f"parity max_rel {r['parity']['max_rel']:.2e}")
sys.exit(0 if r.get("precision") == "fp16" else 1)
PY
if python -c "import sys; from vitedge.targets.coreml import CoreMLFramework as F; sys.exit(0 if F().has_neural_engine() else 1)" \
    >"$LOGS/has-ane.log" 2>&1; then
  step ane-residency vitedge parity --model "$MODEL" --artifact "$PKG" --mode device --require-ane \
    --require-verified --samples 16 --report "$OUT/parity_ane.json"
else
  skip ane-residency "no Neural Engine that CoreML can use (virtualized Mac?): the check would be inconclusive"
fi
if [ -z "${VITEDGE_TEAM_ID:-}" ]; then
  skip iphone-bench "VITEDGE_TEAM_ID is not set (your Apple Developer Team ID signs the model-runner app)"
elif ! python -c "from vitedge.targets.coreml.iphone import check_device; print(check_device('iphone').name)" \
    >"$LOGS/iphone-connected.log" 2>&1; then
  # coremltools' own test (Device.get_connected_devices: devicectl's tunnelState "connected"), not a listing grep
  skip iphone-bench "$(tail -n 1 "$LOGS/iphone-connected.log")"
else
  step iphone-bench vitedge bench --model "$MODEL" --backends torch-deploy --device iphone --min-iters 20 \
    --max-s 1 --report "$OUT/bench_iphone.json"
  step iphone-report python - "$OUT/bench_iphone.json" <<'PY'
import json, sys
d = json.load(open(sys.argv[1]))["device"]
r = d["results"][0]
print(f"{d['name']} iOS {d['os']} {d['compute_units']}: load p50 {r['load_ms']['p50_ms']:.1f} ms, predict p50 "
      f"{r['predict_ms']['p50_ms']:.3f} ms, parity {r['parity']['status']} ({r['parity']['mode']})")
sys.exit(0 if r["parity"]["status"] == "passed" else 1)
PY
fi
finish mac_check
