"""Precision truth on inspector output from real engines (tests/fixtures/tensorrt/README.md cites each source).

TensorRT 10's DETAILED inspector lists Myelin's generated kernels one by one (kgen, gemm, shape_call, named
"__myl_..._myl0_N") where older fixtures had one ForeignNode; a kernel's boundary types do not say what it computes
in (Torch-TensorRT's explicit-typing log: Half in, Float out). The fp16 check may confirm from them but never
refutes: it falls back to the output comparison with an fp32 engine. Pinned fp32 layers fused into kernels are
"in_myelin" (unknown), never "not_fp32". TensorRT 11's layer info may come as a bare list. That no correct engine
of these makes the lowering raise is tested in test_tensorrt.py (it has the fake-module lowering helper).
"""
from __future__ import annotations

import json
from pathlib import Path

import pytest

from vitedge.targets.tensorrt.precision import layer_precisions, precision_verdict, verify_pinned

FIXTURES = Path(__file__).parent / "fixtures" / "tensorrt"
FP16_LIKE = {"max_rel_diff": 3e-3, "samples": 4, "finite": True}
FP32_LIKE = {"max_rel_diff": 2e-6, "samples": 4, "finite": True}


def _fixture(name: str):
    return json.loads((FIXTURES / name).read_text())


def test_tensorrt_10_myelin_kernels_confirm_fp16_and_hold_pinned_nodes_unknown():
    info = _fixture("trt10_10_bert_myelin_kernels.json")
    p = layer_precisions(info)
    assert p["myelin_kernels"] == 4 and p["myelin_kernel_layers"] == {"fp16": 4} and p["float_layers"] == 0
    v = precision_verdict("fp16", p)
    assert v["status"] == "confirmed" and v["evidence"] == "inspector" and "Myelin kernel" in v["reason"]
    # the policy's fp32 islands fused into an fp16 MHA / LayerNorm kernel: what they compute in is not visible
    pinned = {"/encoder/layers.3/mha/attn/mha_prob/Softmax": "/encoder/layers.3/mha/attn/mha_prob/Softmax",
              "/encoder/layers.0/pos_ff/layernorm/LayerNormalization":
                  "/encoder/layers.0/pos_ff/layernorm/LayerNormalization",
              "/encoder/layers.0/pos_ff/output/MatMul": "renamed by the parser",  # found by Myelin's "_" for "."
              "/gone/Mul": "/gone/Mul"}
    got = verify_pinned(info, pinned)
    assert got["in_myelin"] == 3 and got["not_fp32"] == 0 and got["verified"] == 0 and got["not_found"] == 1


def test_kernels_with_fp32_boundaries_never_refute_fp16_the_outputs_decide():
    """Explicit typing: linear2 runs in fp16 inside kernels that cast back to Float (…AddCas). Counted as layers,
    2 of 3 outputs are Float: the old share rule called a correct engine "mostly fp32" and the lowering raised."""
    p = layer_precisions(_fixture("torch_tensorrt_kgen_explicit_typing.json"))
    assert p["myelin_kernel_layers"] == {"fp16": 1, "fp32": 2} and p["layers"] == {}
    v = precision_verdict("fp16", p, outputs_unavailable="no CUDA memory library")
    assert v["status"] == "inconclusive" and "no CUDA memory library" in v["reason"]
    assert precision_verdict("fp16", p, FP16_LIKE)["status"] == "confirmed"
    assert precision_verdict("fp16", p, FP32_LIKE)["status"] == "refuted"  # an fp32-like engine is still caught
    assert precision_verdict("fp32", p)["status"] == "refuted"  # Half is visible: not an fp32 engine
    weak = layer_precisions(_fixture("torch_tensorrt_kgen_weak_typing.json"))  # all Float: fp32 built
    assert precision_verdict("fp32", weak)["status"] == "confirmed"
    assert precision_verdict("fp16", weak)["status"] == "inconclusive"


def test_a_real_foreignnode_is_unknown_and_its_nodes_in_myelin():
    info = _fixture("trt10_10_bert_foreignnode.json")
    p = layer_precisions(info)
    assert p["myelin_layers"] == 1 and p["data_movement_layers"] == 1 and p["float_layers"] == 0
    assert precision_verdict("fp16", p)["status"] == "inconclusive"
    assert precision_verdict("fp16", p, FP16_LIKE)["status"] == "confirmed"
    assert verify_pinned(info, {"/encoder/Unsqueeze_3": "/encoder/Unsqueeze_3"})["in_myelin"] == 1


def test_published_ordinary_engines_fp16_and_int8():
    fp16 = layer_precisions(_fixture("trex_resnet_a100_fp16_first_layers.json"))
    assert fp16["myelin_kernels"] == 0 and fp16["layers"] == {"fp16": 4} and fp16["data_movement_layers"] == 4
    assert precision_verdict("fp16", fp16)["status"] == "confirmed"
    qat = layer_precisions(_fixture("trex_resnet_a100_qat_first_layers.json"))
    assert qat["int8_layers"] == 3 and qat["data_movement_layers"] == 4  # the int8 convolutions and pooling
    assert precision_verdict("int8", qat)["status"] == "confirmed"


def test_tensorrt_11_layer_info_as_a_bare_list():
    info = _fixture("trt11_modeled_list_root_kernels.json")
    assert isinstance(info, list)
    p = layer_precisions(info)
    assert p["total_layers"] == 8 and p["data_movement_layers"] == 3  # shape_call, signal, wait
    assert p["layers"] == {"fp16": 1} and p["myelin_kernel_layers"] == {"fp16": 3, "fp32": 1}
    assert precision_verdict("fp16", p)["status"] == "confirmed"
    got = verify_pinned(info, {"/network.1/attn/ReduceL2": "/network.1/attn/ReduceL2",
                               "/stem/stem.0/Conv": "/stem/stem.0/Conv"})
    assert got["in_myelin"] == 1 and got["not_fp32"] == 1  # the conv is an ordinary fp16 layer
