"""PositionPlanesPatchEmbed (exporter/reparam/primitives.py, SLAB-DeiT's `pos_embed_in_patch_conv` rewrite): the
patch conv over the image and constant 0/1 position planes is `conv(x) + pos` for every grid and patch shape,
and the float64 gate names the patch embed when a folded position is wrong."""
from __future__ import annotations

import pytest
import torch
import torch.nn as nn

from vitedge.exporter.verdict.equivalence import verify_equivalence
from vitedge.exporter.reparam import reparameterize
from vitedge.exporter.reparam.primitives import PositionPlanesPatchEmbed
from vitedge.models import create_model, make_trained_like
from vitedge.models.reduced import reduced


@pytest.mark.parametrize("patch, grid, bias", [
    ((16, 16), (14, 14), True),   # SLAB-DeiT at 224: 196 tokens, one plane
    ((4, 4), (9, 9), True),       # 81 tokens > 16 offsets per patch: six planes
    ((2, 3), (5, 4), False),      # rectangular patches and grid, no bias
])
@pytest.mark.parametrize("grid_out", [False, True])
def test_planes_add_exactly_the_positions(patch, grid, bias, grid_out):
    torch.manual_seed(0)
    conv = nn.Conv2d(3, 8, patch, patch, bias=bias).double()
    pos = torch.randn(1, grid[0] * grid[1], 8, dtype=torch.float64)
    m = PositionPlanesPatchEmbed(conv, pos, grid, grid_out=grid_out)
    n_planes = -(-grid[0] * grid[1] // (patch[0] * patch[1]))
    assert m.planes.shape == (1, n_planes, grid[0] * patch[0], grid[1] * patch[1])
    assert int(m.planes.sum()) == grid[0] * grid[1]  # one 1 per token
    x = torch.randn(2, 3, grid[0] * patch[0], grid[1] * patch[1], dtype=torch.float64)
    with torch.no_grad():
        ref = conv(x).flatten(2).transpose(1, 2) + pos
        y = m(x)
    if grid_out:
        assert y.shape == (2, 8, *grid)
        y = y.flatten(2).transpose(1, 2)
    assert float((y - ref).abs().max()) <= 1e-14 * float(ref.abs().max())


@pytest.mark.parametrize("conv", [nn.Conv2d(3, 8, 4, 2), nn.Conv2d(3, 8, 4, 4, padding=1), nn.Conv2d(4, 8, 4, 4, groups=2)])
def test_only_non_overlapping_patch_convs(conv):
    with pytest.raises(ValueError, match="non-overlapping, unpadded patch conv"):
        PositionPlanesPatchEmbed(conv, torch.zeros(1, 9, 8), (3, 3))


def test_gate_names_the_patch_embed_when_a_folded_position_is_wrong():
    model = make_trained_like(create_model("slab_deit_tiny", **reduced("slab_deit", num_classes=1000)), seed=8).eval()
    deploy = reparameterize(model)
    assert "pos_embed_in_patch_conv" in deploy.reparam_summary.rewrites
    assert verify_equivalence(model, deploy, samples=2).passed
    with torch.no_grad():  # token 5's position (plane 0, offset (0, 5): input channel 3), channel 7, off by 1 %
        for form in (deploy, deploy.__dict__["reparam_fp64"]):  # the gate checks the fold's float64 twin
            form.patch_embed.proj.weight[7, 3, 0, 5] *= 1.01
    res = verify_equivalence(model, deploy, samples=2, raise_on_fail=False)
    assert not res.passed and res.diverging_module == "patch_embed"


def test_applied_only_where_the_positions_fit_one_plane():
    # 32 px, 4 px patches: 64 tokens > 16 offsets per patch would need 4 planes (a 7-channel stem): not applied
    model = make_trained_like(create_model("slab_deit_tiny", img_size=32, patch_size=4, embed_dim=64, depth=1,
                                           num_heads=2, num_classes=10), seed=8).eval()
    deploy = reparameterize(model, 32)
    assert "pos_embed_in_patch_conv" not in deploy.reparam_summary.rewrites
    assert not any(isinstance(m, PositionPlanesPatchEmbed) for m in deploy.modules())
    assert verify_equivalence(model, deploy, 32, samples=2).passed


@pytest.mark.parametrize("grid_out", [False, True])
def test_the_coreml_trace_records_conv_plus_pos_with_the_same_outputs(grid_out):
    torch.manual_seed(1)
    m = PositionPlanesPatchEmbed(nn.Conv2d(3, 16, 16, 16), torch.randn(1, 196, 16), (14, 14), grid_out=grid_out)
    x = torch.randn(2, 3, 224, 224)
    with torch.no_grad():
        traced = torch.jit.trace(m, x)
        nodes = [n.kind() for n in traced.inlined_graph.nodes()]
        assert "aten::cat" not in nodes and "aten::add" in nodes  # no constant planes for coremltools to trip on
        assert float((traced(x) - m(x)).abs().max()) <= 1e-5 * float(m(x).abs().max())
