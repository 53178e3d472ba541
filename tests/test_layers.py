"""The layers' defining identities."""
import torch
import torch.nn as nn
import torch.nn.functional as F

from vitedge.models.layers import (LinearNorm, RepBN, SimAAttention, SimplifiedLinearAttention, sima_rule,
                                   sla_rule)
from vitedge.models.trained_like import make_trained_like


def _bn_randomize(bn, g):
    with torch.no_grad():
        bn.weight.copy_(1 + 0.1 * torch.randn(bn.weight.shape, generator=g))
        bn.bias.copy_(0.1 * torch.randn(bn.bias.shape, generator=g))
        bn.running_mean.copy_(0.2 * torch.randn(bn.running_mean.shape, generator=g))
        bn.running_var.copy_(0.5 + torch.rand(bn.running_var.shape, generator=g))


def test_repbn_with_zero_alpha_is_bn():
    g = torch.Generator().manual_seed(0)
    m = RepBN(8).eval()
    _bn_randomize(m.bn, g)
    with torch.no_grad():
        m.alpha.zero_()
    x = torch.randn(2, 5, 8, generator=g)
    ref = m.bn(x.transpose(1, 2)).transpose(1, 2)
    assert torch.allclose(m(x), ref, atol=1e-6)
    assert not torch.allclose(x, ref, atol=1e-2)  # the BN is not an identity here


def test_repbn_affine_matches_eval_forward():
    g = torch.Generator().manual_seed(1)
    m = RepBN(8).eval()
    _bn_randomize(m.bn, g)
    with torch.no_grad():
        m.alpha.fill_(0.7)
    x = torch.randn(3, 4, 8, generator=g)
    a, b = m.affine()
    assert torch.allclose(m(x), a * x + b, atol=1e-6)


def _linear_norm(step=100):
    ln = LinearNorm(8, norm1=lambda d: nn.LayerNorm(d, eps=1e-6), norm2=RepBN, step=step)
    make_trained_like(ln, seed=3)
    return ln


def test_linear_norm_endpoints():
    x = torch.randn(4, 6, 8)
    ln = _linear_norm()
    ln.train()
    ln.iter.fill_(100)  # lambda = 1: pure LN
    assert torch.allclose(ln(x), ln.norm1(x), atol=1e-6)
    ln.iter.fill_(0)  # lambda = 0: pure RepBN (batch statistics in train mode)
    ref_bn = RepBN(8)
    ref_bn.load_state_dict(ln.norm2.state_dict())
    ref_bn.train()
    assert torch.allclose(ln(x), ref_bn(x), atol=1e-6)


def test_linear_norm_steps_in_train_not_eval():
    ln = _linear_norm(step=10)
    ln.iter.fill_(10)
    x = torch.randn(2, 3, 8)
    ln.train()
    lams = []
    for _ in range(3):
        lams.append(float(ln.lam()))
        ln(x)
    assert [round(v, 6) for v in lams] == [1.0, 0.9, 0.8]
    assert int(ln.iter) == 7
    ln.eval()
    y = ln(x)
    assert int(ln.iter) == 7
    assert torch.allclose(y, ln.norm2(x))  # eval = RepBN alone, whatever lambda is


def test_linear_norm_warmup_then_schedule():
    ln = LinearNorm(4, warm=2, step=4)
    ln.train()
    x = torch.randn(2, 3, 4)
    ln(x), ln(x)
    assert int(ln.warm) == 0 and int(ln.iter) == 4
    ln(x)
    assert int(ln.iter) == 3


def test_linear_norm_other_schedules():
    for sched in ("cosine", "step"):
        ln = LinearNorm(4, step=8, schedule=sched)
        vals = []
        for it in (8, 4, 0):
            ln.iter.fill_(it)
            vals.append(float(ln.lam()))
        assert vals[0] == 1.0 and vals[-1] == 0.0 and 0.0 < vals[1] < 1.0


def test_order_rules_match_official_formulas():
    # SLAB: kv first iff i*j*(c+d) > c*d*(i+j); tie -> qk first
    assert sla_rule(196, 196, 64, 64) == "kv_first"
    assert sla_rule(16, 16, 64, 64) == "qk_first"
    assert sla_rule(64, 64, 64, 64) == "qk_first"  # 64*64*128 == 64*64*128: tie, not '>'
    # SimA: qk first iff N < d
    assert sima_rule(25, 32) == "qk_first"
    assert sima_rule(32, 32) == "kv_first"
    assert sima_rule(196, 48) == "kv_first"


def test_sla_both_orders_agree():
    torch.manual_seed(0)
    x = torch.randn(2, 16, 32)
    outs = []
    for order in ("qk_first", "kv_first"):
        torch.manual_seed(1)
        m = SimplifiedLinearAttention(32, 2, num_tokens=16, attn_order=order)
        make_trained_like(m, seed=5)
        outs.append(m(x))
    assert (outs[0] - outs[1]).abs().max() <= 1e-5 * outs[0].abs().max()


def test_sima_both_orders_agree_and_l1_axis_is_tokens():
    x = torch.randn(2, 10, 16)
    outs = []
    for order in ("qk_first", "kv_first"):
        m = SimAAttention(16, num_heads=2, qkv_bias=True, attn_order=order)
        make_trained_like(m, seed=7)
        outs.append(m(x))
    assert (outs[0] - outs[1]).abs().max() <= 1e-5 * outs[0].abs().max()
    # token-axis l1: scaling one token's features must change other tokens' outputs
    m = SimAAttention(16, num_heads=2, qkv_bias=True)
    make_trained_like(m, seed=7)
    b, n, c = x.shape
    q = m.qkv(x).reshape(b, n, 3, 2, 8).permute(2, 0, 3, 1, 4)[0]
    qn = F.normalize(q, p=1, dim=-2)
    assert torch.allclose(qn.abs().sum(dim=-2), torch.ones(b, 2, 8), atol=1e-5)
