"""Localization of a failed hop: the first torch module (in forward order) whose output diverges.

- ONNX artifacts: intermediate tensors are added as graph outputs and compared with PyTorch forward hooks
  on the deploy-form. ONNX nodes are mapped to torch modules through, in this order: the dynamo exporter's
  own module-scope metadata (`pkg.torch.onnx.name_scopes`, see `onnx_dynamo`), the scoped node names the
  TorchScript exporter writes (`/blocks/blocks.0/attn/qkv/MatMul`; vitedge writes the same form for dynamo
  graphs, since onnxsim drops node metadata but keeps names), and for nodes that onnxsim renamed, the
  parameter names of their initializers (`blocks.0.attn.qkv.bias`).
- Torch vs torch (a loaded deploy-form checkpoint vs a fresh re-parameterization): same module tree,
  compared module by module.
Hooks fire when a module's forward returns, so a corrupted leaf is seen before its parents; modules
called more than once per forward are skipped (their output is ambiguous).
"""
from __future__ import annotations

import copy
from dataclasses import dataclass
from typing import Any, Callable

import numpy as np
import onnx
import torch
import torch.nn as nn

from .criteria import NoiseRule
from ..onnx.onnx_dynamo import node_module_scopes
from ..core.report import Tolerance


@dataclass
class Divergence:
    module: str
    max_rel: float
    cosine: float
    checked: int  # modules compared up to and including this one
    noise_ratio: float | None = None  # with the noise rule: worst per-sample error / allowance (> 1)

    def describe(self) -> str:
        ratio = f", noise_ratio {self.noise_ratio:.3g}" if self.noise_ratio is not None else ""
        return f"first diverging module {self.module} (max_rel {self.max_rel:.3g}, cosine {self.cosine:.6f}{ratio})"


def _first_tensor(out):
    if isinstance(out, torch.Tensor):
        return out
    if isinstance(out, (tuple, list)):
        for o in out:
            t = _first_tensor(o)
            if t is not None:
                return t
    return None


@torch.no_grad()
def capture_modules(model: nn.Module, x: torch.Tensor,
                    keep: Callable[[torch.Tensor], Any] | None = None) -> tuple[list[str], dict[str, Any]]:
    """Run `model(x)` with hooks on every submodule: (paths in completion order, output per path; `keep(output)`
    instead where given, e.g. its shape).

    Modules that ran more than once are dropped."""
    order: list[str] = []
    store: dict[str, torch.Tensor] = {}
    calls: dict[str, int] = {}
    handles = []
    for path, m in model.named_modules():
        if not path:
            continue

        def hook(_m, _inp, out, path=path):
            calls[path] = calls.get(path, 0) + 1
            t = _first_tensor(out)
            if t is not None and calls[path] == 1:
                order.append(path)
                # clone: later in-place ops must not alter it
                store[path] = keep(t) if keep is not None else t.detach().clone()
        handles.append(m.register_forward_hook(hook))
    try:
        model.eval()(x)
    finally:
        for h in handles:
            h.remove()
    order = [p for p in order if calls[p] == 1]
    return order, {p: store[p] for p in order}


def _compare(a: np.ndarray, ref: np.ndarray) -> tuple[float, float] | None:
    """(max_rel, cosine) of `a` vs `ref`, or None when the layouts are not comparable."""
    if a.shape != ref.shape:
        if a.size != ref.size or not a.shape or not ref.shape or a.shape[-1] != ref.shape[-1]:
            return None
        a = a.reshape(ref.shape)  # onnxsim flattens leading dims around Gemm
    a64, r64 = a.astype(np.float64), ref.astype(np.float64)
    scale = float(np.abs(r64).max())
    err = float(np.abs(a64 - r64).max()) if np.isfinite(a64).all() else float("inf")
    max_rel = err / max(scale, 1e-30) if scale > 0 else (0.0 if err == 0 else float("inf"))
    na, nr = np.linalg.norm(a64), np.linalg.norm(r64)
    cosine = float(a64.ravel() @ r64.ravel() / (na * nr)) if na > 0 and nr > 0 else (1.0 if na == nr else 0.0)
    return max_rel, cosine


NOISE_FACTOR = 10.0  # a module diverges when its error exceeds this multiple of its own float32 rounding noise


def _diverges(max_rel: float, cosine: float, tol: Tolerance, noise: tuple[float, float] | None) -> bool:
    """Judge one module's output with the hop's bounds (elementwise where it has one, else cosine), raised to
    NOISE_FACTOR times the module's float32 rounding noise where that is known: deep or ill-conditioned
    modules legitimately differ between kernels by more than the logits' tolerance."""
    if not np.isfinite(max_rel):
        return True
    noise_rel, noise_cos = noise if noise is not None else (0.0, 1.0)
    if tol.max_rel is not None and max_rel > max(tol.max_rel, NOISE_FACTOR * noise_rel):
        return True
    return tol.cosine is not None and (1.0 - cosine) > max(1.0 - tol.cosine, NOISE_FACTOR * (1.0 - noise_cos))


def first_divergence(order: list[str], candidate: dict[str, np.ndarray], reference: dict[str, np.ndarray],
                     tol: Tolerance, exact: dict[str, np.ndarray] | None = None) -> Divergence | None:
    """First module (in `order`) whose candidate output diverges from the reference. `exact` (the reference
    model's module outputs in float64) gives each module's own rounding noise.

    A divergence counts only if the nearest compared enclosing module diverges too: graph rewrites (onnxsim
    folding GELU's 0.5 into the next conv) can move a constant across a module boundary, which changes one
    module's output but not its parent's, whereas a real defect propagates outwards."""
    verdicts: dict[str, tuple[bool, tuple[float, float], float | None]] = {}
    for path in order:
        if path not in candidate or path not in reference:
            continue
        cmp = _compare(candidate[path], reference[path])
        if cmp is None:
            continue
        noise = _compare(reference[path], exact[path]) if exact is not None and path in exact else None
        verdicts[path] = (_diverges(*cmp, tol, noise), cmp, None)
    return _first_outward(verdicts)


EXPLAINS = 1000.0  # a module diverging by less than 1/EXPLAINS of a later module's ratio does not explain the failure


def _first_outward(verdicts: dict) -> Divergence | None:
    """The first diverging module whose nearest compared enclosing module diverges too (see first_divergence), of
    those whose noise ratio is within EXPLAINS of the largest such ratio. Another runtime's kernels can round a
    correct module beyond the module-level rule (SwiftFormer-XS's network.0.2.attn.Proj under ONNX Runtime: 2.2 x
    on one of 256 samples, its stage 0.1 x); a zeroed network.4.1.pwconv1 later in the same graph diverged at
    1.7e5 x and was blamed on that earlier module. Ratios fall as a defect's error spreads downstream (1.7e5 at the
    zeroed layer, 1.3e4 at the head; a x1.001 channel of SimA-DeiT's qkv 68, its block's norm 1.4), so a module
    thousands of times below a later one is not its cause."""
    def parent_agrees(path: str) -> bool:
        p = path.rpartition(".")[0]
        while p and p not in verdicts:
            p = p.rpartition(".")[0]
        return p == "" or verdicts[p][0]

    found = [(checked, path, cmp, ratio) for checked, (path, (bad, cmp, ratio)) in enumerate(verdicts.items(), 1)
             if bad and parent_agrees(path)]
    ratios = [r for *_, r in found if r is not None and np.isfinite(r)]
    top = max(ratios, default=None)
    for checked, path, cmp, ratio in found:
        if top is None or ratio is None or not np.isfinite(ratio) or ratio * EXPLAINS >= top:
            return Divergence(path, cmp[0], cmp[1], checked, ratio)
    return None


def _aligned(a: np.ndarray, ref: np.ndarray) -> np.ndarray | None:
    """`a` in `ref`'s layout, or None when not comparable (as in _compare)."""
    if a.shape == ref.shape:
        return a
    if a.size != ref.size or not a.shape or not ref.shape or a.shape[-1] != ref.shape[-1]:
        return None
    return a.reshape(ref.shape)


def first_divergence_truth(order: list[str], candidate: dict[str, np.ndarray], truth: dict[str, np.ndarray],
                           noisy: dict[str, np.ndarray], rule: NoiseRule) -> Divergence | None:
    """First module (in `order`) whose candidate output breaks the parity noise rule (exporter/verdict/criteria.py) at
    module level: per sample, max|candidate - truth| / max|truth| must stay within max(floor, K * noise), where
    `truth` holds the reference model's module outputs in float64 and `noisy` the same model's in float32 (its
    deviation from `truth` is each sample's float32 noise at that module). Same outward rule as
    first_divergence."""
    verdicts: dict[str, tuple[bool, tuple[float, float], float | None]] = {}
    for path in order:
        if path not in candidate or path not in truth or path not in noisy:
            continue
        c = _aligned(candidate[path], truth[path])
        if c is None or noisy[path].shape != truth[path].shape:
            continue
        ratio, _ = rule.worst(truth[path], c, noisy[path])
        verdicts[path] = (not ratio <= 1.0, _compare(c, truth[path]), ratio)
    return _first_outward(verdicts)


# ---- ONNX -> torch module mapping --------------------------------------------------------------

def _resolve_scope(components: list[str], modules: set[str]) -> str | None:
    """Walk scope components (`["blocks", "blocks.0", "attn"]`) down the module tree."""
    cur = ""
    for comp in components:
        options = [f"{cur}.{comp}" if cur else comp, comp, f"{cur}.{comp.rsplit('.', 1)[-1]}" if cur else None]
        nxt = next((o for o in options if o and o in modules), None)
        if nxt is None and not cur:  # called outside its parent's forward (a backbone's forward_intermediates
            # under a FeatureMaps or a user's head): the one module path ending with this component
            ends = [m for m in modules if m.endswith("." + comp)]
            nxt = ends[0] if len(ends) == 1 else None
        if nxt is None:
            break
        cur = nxt
    return cur or None


def _scope_of_name(name: str, modules: set[str]) -> str | None:
    if not name.startswith("/"):
        return None
    parts = name.strip("/").split("/")[:-1]  # the last part is the op (or "Op_output_0")
    return _resolve_scope(parts, modules) if parts else None


def _scope_of_metadata(node: onnx.NodeProto, modules: set[str]) -> str | None:
    known = [s for s in node_module_scopes(node) if s in modules]  # full module paths, outermost first
    return known[-1] if known else None


def node_scopes(model: onnx.ModelProto, module_paths: set[str], param_owner: dict[str, str]) -> list[str | None]:
    """Torch module path of every top-level node (None where it cannot be told)."""
    scopes = []
    for node in model.graph.node:
        scope = _scope_of_metadata(node, module_paths)
        if scope is None:
            scope = _scope_of_name(node.name, module_paths)
        if scope is None:
            scope = next((s for s in (_scope_of_name(o, module_paths) for o in node.output) if s), None)
        if scope is None:
            scope = next((param_owner[i] for i in node.input if i in param_owner), None)
        scopes.append(scope)
    return scopes


def module_outputs(model: onnx.ModelProto, module_paths: set[str], param_owner: dict[str, str]) -> dict[str, str]:
    """For each torch module path, the ONNX tensor holding its output: the last tensor produced inside the
    module's scope that is used outside it (or is a graph output)."""
    scopes = node_scopes(model, module_paths, param_owner)
    graph_outputs = {o.name for o in model.graph.output}
    consumers: dict[str, list[int]] = {}
    for i, node in enumerate(model.graph.node):
        for t in node.input:
            consumers.setdefault(t, []).append(i)

    def inside(scope: str | None, path: str) -> bool:
        return scope is not None and (scope == path or scope.startswith(path + "."))

    out: dict[str, str] = {}
    for i, node in enumerate(model.graph.node):  # topologically sorted: the last escaping tensor wins
        scope = scopes[i]
        while scope:
            if scope in module_paths:
                escaping = [t for t in node.output if t in graph_outputs
                            or any(not inside(scopes[j], scope) for j in consumers.get(t, []))]
                if escaping:
                    out[scope] = escaping[0]
            scope = scope.rpartition(".")[0]
    return out


def _with_outputs(model: onnx.ModelProto, tensors: list[str]) -> onnx.ModelProto:
    """A copy of `model` that also outputs `tensors` (element types from shape inference)."""
    m = onnx.ModelProto()
    m.CopyFrom(model)
    try:
        inferred = onnx.shape_inference.infer_shapes(m)
        types = {v.name: v.type.tensor_type.elem_type for v in inferred.graph.value_info}
    except Exception:  # inference is only needed for dtypes; float is the right guess for these graphs
        types = {}
    existing = {o.name for o in m.graph.output}
    for t in tensors:
        if t not in existing:
            m.graph.output.append(onnx.helper.make_tensor_value_info(t, types.get(t, onnx.TensorProto.FLOAT), None))
    return m


def param_owners(model: nn.Module) -> dict[str, str]:
    """Parameter/buffer name -> owning module path (how ONNX initializers keep torch names)."""
    out = {}
    for name, _ in list(model.named_parameters()) + list(model.named_buffers()):
        owner = name.rpartition(".")[0]
        if owner:
            out[name] = owner
    return out


def localize_onnx(onnx_model: onnx.ModelProto, deploy_model: nn.Module, x: np.ndarray,
                  tol: Tolerance, rule: NoiseRule | None = None) -> Divergence | None:
    """First torch module whose output differs between `onnx_model` (ONNX Runtime) and `deploy_model`
    (float32) by more than the hop's tolerance and the module's own float32 noise (vs a float64 copy). With
    `rule`, the parity noise rule instead: ONNX vs the deploy-form in float64, allowance from the deploy-form's
    float32 noise per module and sample."""
    from ...targets.graph.runtime import OnnxRuntimeRunner

    paths = {p for p, _ in deploy_model.named_modules() if p}
    mapping = module_outputs(onnx_model, paths, param_owners(deploy_model))
    if not mapping:
        return None
    runner = OnnxRuntimeRunner(_with_outputs(onnx_model, sorted(set(mapping.values()))))
    batch = runner.max_batch()
    if batch and batch != len(x):  # a static-batch graph: localize on exactly its batch
        x = np.resize(x, (batch,) + x.shape[1:])
    xt = torch.from_numpy(x).float()
    order, ref = capture_modules(deploy_model, xt)
    exact = {p: v.numpy() for p, v in capture_modules(copy.deepcopy(deploy_model).double(), xt.double())[1].items()}
    values = runner.run_all(x)
    cand = {p: np.asarray(values[t], dtype=np.float32) for p, t in mapping.items() if p in ref}
    ref = {p: v.numpy() for p, v in ref.items()}
    if rule is not None:
        return first_divergence_truth(order, cand, exact, ref, rule)
    return first_divergence(order, cand, ref, tol, exact)


def localize_torch(reference: nn.Module, candidate: nn.Module, x: np.ndarray, tol: Tolerance,
                   rule: NoiseRule | None = None) -> Divergence | None:
    """First module whose output differs between two models with the same module tree. With `rule`, by the
    parity noise rule: `candidate` vs `reference` in float64, allowance from `reference`'s float32 noise."""
    xt = torch.from_numpy(x).float()
    order, ref = capture_modules(reference, xt)
    _, cand = capture_modules(candidate, xt)
    cand = {p: v.numpy() for p, v in cand.items()}
    ref = {p: v.numpy() for p, v in ref.items()}
    if rule is not None:
        exact = {p: v.numpy() for p, v in capture_modules(copy.deepcopy(reference).double(), xt.double())[1].items()}
        return first_divergence_truth(order, cand, exact, ref, rule)
    return first_divergence(order, cand, ref, tol)
