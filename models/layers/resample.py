"""What a train-form changes to run at another input size, in one place: position tables resampled on their grid
(`resample_grid_table`, timm's `resample_abs_pos_embed` convention), and the record of each change that
report.json's `resized` holds (`Resized`). The families' `set_input_size` methods use these (docs/models.md)."""
from __future__ import annotations

import torch
import torch.nn as nn
import torch.nn.functional as F


def resample_grid_table(table: torch.Tensor, old: tuple[int, int], new: tuple[int, int],
                        prefix: int = 0) -> torch.Tensor:
    """A (1, prefix + h*w, C) table laid out row-major over an `old` grid, resampled to the `new` grid: the
    `prefix` tokens (CLS) kept as they are, the grid part bicubic (antialiased when shrinking, align_corners
    False), computed in float32 at least and returned in the table's dtype, as timm's `resample_abs_pos_embed`
    does (its defaults). Unchanged (the same tensor) when the grids are equal."""
    if tuple(old) == tuple(new):
        return table
    head, grid = table[:, :prefix], table[:, prefix:]
    c = grid.shape[-1]
    work = torch.promote_types(grid.dtype, torch.float32)
    g = grid.to(work).reshape(1, old[0], old[1], c).permute(0, 3, 1, 2)
    g = F.interpolate(g, size=tuple(new), mode="bicubic", align_corners=False, antialias=True)
    g = g.permute(0, 2, 3, 1).reshape(1, new[0] * new[1], c).to(table.dtype)
    return torch.cat([head, g], dim=1)


class Resized:
    """Resamples a module's tables from the ones it was built with (kept aside once, so that resizing twice, or
    back, starts from the pretrained values) and records each change: {"tensor", "how", "from", "to"}."""

    def __init__(self, model: nn.Module):
        self.model = model
        if "_vitedge_native" not in model.__dict__:
            model.__dict__["_vitedge_native"] = {}  # (plain attribute: not in the state_dict, not a submodule)
        self.native = model.__dict__["_vitedge_native"]
        self.records: list[dict] = []

    def table(self, owner: nn.Module, attr: str, path: str, old: tuple[int, int], new: tuple[int, int],
              prefix: int = 0, what: str = "position table") -> None:
        """Set `owner.attr` (a (1, prefix + h*w, C) Parameter over the `old` grid when built) to its resampling
        on the `new` grid."""
        if path not in self.native:
            self.native[path] = getattr(owner, attr).detach().clone()
        base = self.native[path]
        out = resample_grid_table(base, old, new, prefix)
        was = getattr(owner, attr)
        setattr(owner, attr, nn.Parameter(out.detach().clone().to(was.device), requires_grad=was.requires_grad))
        if tuple(old) != tuple(new):
            kept = f", the {prefix} prefix token{'s' if prefix > 1 else ''} kept" if prefix else ""
            self.records.append({"tensor": path, "how": f"{what} resampled bicubic (antialiased) on its grid{kept}",
                                 "from": [prefix + old[0] * old[1], *old], "to": [prefix + new[0] * new[1], *new]})

    def pad(self, path: str, how: str, old: tuple[int, int], new: tuple[int, int]) -> None:
        """Record that the feature map at `path` is padded from `old` to `new` (h, w) in the forward."""
        if tuple(old) != tuple(new):
            self.records.append({"tensor": path, "how": how, "from": list(old), "to": list(new)})
