"""A deploy-form that holds a tensor twice (SLAB-DeiT: the positions in the patch conv's extra weights and in the
`pos` buffer the CoreML trace uses; the shared SLA dwc tiled once per head) refuses a deploy checkpoint whose
copies differ, at load, naming the module, instead of exporting a function that depends on the backend."""
from __future__ import annotations

import pytest
import torch

from vitedge import cli
from vitedge.errors import CheckpointError
from vitedge.exporter.flow.deploy_checkpoint import load_deploy_checkpoint, reparam_checkpoint
from vitedge.models.reduced import reduced

SLAB = reduced("slab_deit")
EDITS = {  # state_dict key suffix -> (what the error names, how one copy is edited)
    "patch_embed.pos": ("pos buffer", lambda t: t.view(-1)[5].add_(1e-3)),
    "patch_embed.planes": ("position planes", lambda t: t.view(-1)[t.view(-1).argmax()].mul_(0.5)),
    "attn.dwc.weight": ("heads' copies of the shared dwc", lambda t: t[-1].mul_(1.01)),
}


@pytest.fixture(scope="module")
def written(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("copies")
    return tmp, reparam_checkpoint("slab_deit_tiny", tmp / "d.pth", overrides=SLAB).path


def test_an_untouched_checkpoint_loads_with_its_copies_in_agreement(written):
    _, path = written
    deploy = load_deploy_checkpoint(path)
    checked = [n for n, m in deploy.named_modules() if hasattr(m, "copies_disagree")]
    assert any(n.endswith("patch_embed") for n in checked) and any(n.endswith("attn") for n in checked)
    assert all(m.copies_disagree() is None for m in deploy.modules() if hasattr(m, "copies_disagree"))
    state = torch.load(path, weights_only=True)["state_dict"]
    assert all(any(k.endswith(suffix) for k in state) for suffix in EDITS)  # every edited copy is in the file


@pytest.mark.parametrize("suffix", list(EDITS))
def test_an_edited_copy_is_refused_naming_the_module(written, suffix):
    tmp, path = written
    what, edit = EDITS[suffix]
    payload = torch.load(path, weights_only=True)
    key = next(k for k in payload["state_dict"] if k.endswith(suffix))
    with torch.no_grad():
        edit(payload["state_dict"][key])
    bad = tmp / f"edited_{suffix.replace('.', '_')}.pth"
    torch.save(payload, bad)
    with pytest.raises(CheckpointError, match=f"{key.rpartition('.')[0].removesuffix('.dwc')}.*{what}.*vitedge reparam"):
        load_deploy_checkpoint(bad)


def test_cli_parity_on_an_edited_checkpoint_exits_2_with_one_line(written, capsys):
    tmp, path = written
    payload = torch.load(path, weights_only=True)
    key = next(k for k in payload["state_dict"] if k.endswith("patch_embed.pos"))
    payload["state_dict"][key] = payload["state_dict"][key] * 1.001
    bad = tmp / "edited_cli.pth"
    torch.save(payload, bad)
    code = cli.main(["parity", "--model", "slab_deit_tiny", "--deploy-checkpoint", str(bad), "--samples", "2",
                     *[a for k, v in SLAB.items() for a in ("--set", f"{k}={v}")]])
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 2 and len(err) == 1 and "pos buffer" in err[0] and "vitedge reparam" in err[0]
