"""SLAB's LLaMA-style RMSNorm -> masked RepBN norm: official layout, train-mode semantics, and its exact fold."""
from __future__ import annotations

import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F

from vitedge.exporter.reparam.llama_repbn import FoldedNorm, llama_norm_affine, reparameterize_llama
from vitedge.models import VitedgeError, make_trained_like
from vitedge.models.layers.llama_repbn import LlamaLinearNorm, LlamaRMSNorm, MaskedRepBN

OFFICIAL_KEYS = ["num_step", "warm", "iter", "total_step", "norm1.weight", "norm2.alpha", "norm2.bn.weight",
                 "norm2.bn.bias", "norm2.bn.running_mean", "norm2.bn.running_var", "norm2.bn.num_batches_tracked"]


# A minimal LLaMA-shaped language model with the HF/SLAB attribute names (test scaffolding: causal softmax attention
# and a SiLU-gated MLP are enough to make every folded Linear matter).
class _Attention(nn.Module):
    def __init__(self, c: int, heads: int):
        super().__init__()
        self.heads = heads
        self.q_proj, self.k_proj, self.v_proj, self.o_proj = (nn.Linear(c, c, bias=False) for _ in range(4))

    def forward(self, x):
        b, t, c = x.shape
        q, k, v = (p(x).reshape(b, t, self.heads, -1).transpose(1, 2) for p in (self.q_proj, self.k_proj, self.v_proj))
        return self.o_proj(F.scaled_dot_product_attention(q, k, v, is_causal=True).transpose(1, 2).reshape(b, t, c))


class _MLP(nn.Module):
    def __init__(self, c: int):
        super().__init__()
        self.gate_proj, self.up_proj = nn.Linear(c, 3 * c, bias=False), nn.Linear(c, 3 * c, bias=False)
        self.down_proj = nn.Linear(3 * c, c, bias=False)

    def forward(self, x):
        return self.down_proj(F.silu(self.gate_proj(x)) * self.up_proj(x))


class _DecoderLayer(nn.Module):
    def __init__(self, c: int, heads: int, eps: float):
        super().__init__()
        self.self_attn, self.mlp = _Attention(c, heads), _MLP(c)
        self.input_layernorm = LlamaLinearNorm(c, eps=eps)
        self.post_attention_layernorm = LlamaLinearNorm(c, eps=eps)

    def forward(self, x):
        x = x + self.self_attn(self.input_layernorm(x))
        return x + self.mlp(self.post_attention_layernorm(x))


class _Backbone(nn.Module):
    def __init__(self, vocab: int, c: int, heads: int, layers: int, eps: float):
        super().__init__()
        self.embed_tokens = nn.Embedding(vocab, c)
        self.layers = nn.ModuleList([_DecoderLayer(c, heads, eps) for _ in range(layers)])
        self.norm = LlamaLinearNorm(c, eps=eps)


class _TinyLM(nn.Module):
    def __init__(self, vocab: int = 50, c: int = 32, heads: int = 4, layers: int = 2, eps: float = 1e-6):
        super().__init__()
        self.model = _Backbone(vocab, c, heads, layers, eps)
        self.lm_head = nn.Linear(c, vocab, bias=False)

    def forward(self, ids):
        x = self.model.embed_tokens(ids)
        for layer in self.model.layers:
            x = layer(x)
        return self.lm_head(self.model.norm(x))


def _ids(seed: int = 0) -> torch.Tensor:
    return torch.randint(0, 50, (3, 11), generator=torch.Generator().manual_seed(seed))


# --- the layer -----------------------------------------------------------------------------------------------------

def test_official_layout_and_init():
    ln = LlamaLinearNorm(16, eps=1e-6)
    state = ln.state_dict()
    assert list(state) == OFFICIAL_KEYS
    assert [int(state[k]) for k in OFFICIAL_KEYS[:4]] == [0, 10000, 18000, 18000]
    assert all(state[k].dtype == torch.long for k in OFFICIAL_KEYS[:4])
    assert isinstance(ln.norm1, LlamaRMSNorm) and ln.norm1.variance_epsilon == 1e-6
    assert isinstance(ln.norm2, MaskedRepBN) and ln.norm2.bn.eps == 1e-6  # the eps reaches the BatchNorm too
    assert not ln.norm2.alpha.any() and not ln.norm2.bn.weight.any() and not ln.norm2.bn.bias.any()
    fresh = LlamaLinearNorm(16, eps=1e-6)
    fresh.load_state_dict(make_trained_like(ln, seed=0).state_dict(), strict=True)  # official keys load strictly


def test_rms_norm():
    rms = LlamaRMSNorm(8, eps=1e-6)
    with torch.no_grad():
        rms.weight.uniform_(0.5, 1.5)
    x = torch.randn(2, 5, 8, dtype=torch.float64)
    ref = rms.weight * x / torch.sqrt(x.pow(2).mean(-1, keepdim=True) + 1e-6)
    assert torch.allclose(rms(x), ref, rtol=0, atol=1e-13)


def test_masked_bn_uses_real_tokens_only():
    bn = make_trained_like(MaskedRepBN(8), seed=1).train()
    x = torch.randn(2, 6, 8, dtype=torch.float64)
    bn.double()
    mask = torch.tensor([[1, 1, 1, 1, 0, 0], [1, 1, 1, 0, 0, 0]])
    mean0 = bn.bn.running_mean.clone()
    with torch.no_grad():
        y = bn(x, mask)
    real = x[mask == 1]  # (7, 8)
    mu, var = real.mean(0), real.var(0, unbiased=False)
    g, beta, alpha = bn.bn.weight, bn.bn.bias, bn.alpha
    expect_real = (real - mu) / torch.sqrt(var + bn.bn.eps) * g + beta + alpha * real
    assert torch.allclose(y[mask == 1], expect_real, atol=1e-12)
    assert torch.allclose(y[mask == 0], (1 + alpha) * x[mask == 0], atol=1e-12)  # pads keep x, plus alpha * x
    assert torch.allclose(bn.bn.running_mean, 0.9 * mean0 + 0.1 * mu, atol=1e-12)  # stats from real tokens only
    # no mask: every token is normalized
    with torch.no_grad():
        y_all = bn(x)
    flat = x.reshape(-1, 8)
    ref = (flat - flat.mean(0)) / torch.sqrt(flat.var(0, unbiased=False) + bn.bn.eps) * g + beta
    assert torch.allclose(y_all, ref.reshape(2, 6, 8) + alpha * x, atol=1e-12)


def test_counters_tick_every_16_calls():
    ln = make_trained_like(LlamaLinearNorm(8, warm=2, step=3), seed=2).double().train()
    ln.warm.fill_(2)
    ln.iter.fill_(3)
    x = torch.randn(4, 5, 8, dtype=torch.float64)
    with torch.no_grad():
        for _ in range(16):  # call 1 ticks warm 2 -> 1; the next tick is call 17
            assert torch.allclose(ln(x), ln.norm1(x))
        assert (int(ln.warm), int(ln.num_step)) == (1, 0)
        ln(x)
        assert int(ln.warm) == 0 and int(ln.iter) == 3
        for _ in range(15):  # calls 18-32: lambda = 3/3, no tick
            assert torch.allclose(ln(x), ln.norm1(x))
        assert int(ln.iter) == 3 and int(ln.num_step) == 0
        ln(x)  # call 33: lambda 1, then iter 3 -> 2
        assert int(ln.iter) == 2
        ref_bn = MaskedRepBN(8).double().train()
        ref_bn.load_state_dict(ln.norm2.state_dict())
        expect = 2 / 3 * ln.norm1(x) + 1 / 3 * ref_bn(x)  # call 34: lambda = 2/3
        assert torch.allclose(ln(x), expect, atol=1e-12)


def test_eval_is_one_affine_and_ignores_the_mask():
    ln = make_trained_like(LlamaLinearNorm(8), seed=3).double().eval()
    x = torch.randn(2, 4, 8, dtype=torch.float64)
    a, b = llama_norm_affine(ln)
    with torch.no_grad():
        assert torch.allclose(ln(x), a * x + b, atol=1e-13)
        assert torch.equal(ln(x, torch.tensor([[1, 1, 0, 0], [1, 0, 0, 0]])), ln(x))
    assert not torch.allclose(a, torch.ones_like(a)) and bool(b.abs().gt(1e-3).any())  # a real affine, not identity


# --- the fold --------------------------------------------------------------------------------------------------------

def test_fold_is_exact_fp64():
    model = make_trained_like(_TinyLM(), seed=4).double().eval()
    folded = reparameterize_llama(model)
    with torch.no_grad():
        y, y_f = model(_ids()), folded(_ids())
    scale = float(y.abs().max())
    assert float((y - y_f).abs().max()) <= 1e-9 * scale
    bad = [n for n, m in folded.named_modules() if isinstance(m, (LlamaLinearNorm, MaskedRepBN, nn.BatchNorm1d))]
    assert not bad, bad
    assert isinstance(folded.model.layers[0].input_layernorm, FoldedNorm) and isinstance(folded.model.norm, FoldedNorm)
    layer = folded.model.layers[1]
    for lin in (layer.self_attn.q_proj, layer.self_attn.k_proj, layer.self_attn.v_proj, layer.mlp.gate_proj,
                layer.mlp.up_proj, folded.lm_head):
        assert lin.bias is not None  # the RepBN shift lands in a new bias
    assert layer.self_attn.o_proj.bias is None and layer.mlp.down_proj.bias is None  # untouched
    s = folded.reparam_summary
    assert s.folded["input_layernorm->q_proj/k_proj/v_proj"] == 2
    assert s.folded["post_attention_layernorm->gate_proj/up_proj"] == 2
    assert s.folded["final_norm->lm_head"] == 1 and s.unfolded == [] and s.schedule == []
    assert isinstance(model.model.norm, LlamaLinearNorm)  # the input model is untouched


def test_fold_detects_a_broken_shift():
    # the gate this fold relies on: dropping the RepBN shift (W b) from one projection is visible at 1e-9
    model = make_trained_like(_TinyLM(), seed=5).double().eval()
    folded = reparameterize_llama(model)
    with torch.no_grad():
        folded.model.layers[0].mlp.up_proj.bias.zero_()
        y, y_f = model(_ids(1)), folded(_ids(1))
    assert float((y - y_f).abs().max()) > 1e-6 * float(y.abs().max())


def test_unfinished_schedule_warns_and_strict_raises():
    model = make_trained_like(_TinyLM(), seed=6).double().eval()
    model.model.layers[0].input_layernorm.iter.fill_(900)  # lambda = 900 / 18000
    with pytest.warns(UserWarning, match="lambda"):
        folded = reparameterize_llama(model)
    assert folded.reparam_summary.schedule[0]["lambda"] == pytest.approx(0.05)
    with pytest.raises(VitedgeError, match="schedule"):
        reparameterize_llama(model, strict_schedule=True)


def test_refuses_a_model_without_repbn_norms():
    with pytest.raises(VitedgeError, match="nothing to fold"):
        reparameterize_llama(nn.Sequential(nn.Linear(4, 4)))
