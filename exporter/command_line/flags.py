"""The flags several commands share, the argparse types they use, and each target's own flag group, generated
from its row (targets/rows.py). Torch-free."""
from __future__ import annotations

import argparse
import ast

from ...targets.rows import positive_float, positive_int  # noqa: F401  (the CLI's positive types; re-exported)

ATTN_ORDERS = ("auto", "qk_first", "kv_first")
BENCH_DEFAULT = ("torch", "torch-deploy", "onnxruntime")


def kv(text: str) -> tuple[str, object]:
    """`key=value` with a Python-literal value (`depth=2`, `embed_dims=[48,56]`); non-literals stay strings."""
    if "=" not in text:
        raise argparse.ArgumentTypeError(f"expected key=value, got {text!r}")
    key, value = text.split("=", 1)
    try:
        return key.strip(), ast.literal_eval(value)
    except (ValueError, SyntaxError):
        return key.strip(), value


def image_sizes(text: str):
    """--imgsz: S, HxW, or a comma list of them, as ((H, W), ...) (exporter/core/settings.py says which the command
    runs)."""
    from vitedge.errors import VitedgeError
    from ...models.size_limit import SizeLimitError
    from ..core.settings import parse_sizes  # torch-free

    try:
        return parse_sizes(text)
    except SizeLimitError as e:  # its own line says the limit (argparse names the flag)
        raise argparse.ArgumentTypeError(str(e).removeprefix("--imgsz ")) from None
    except VitedgeError:
        raise argparse.ArgumentTypeError(f"expected a size S or HxW in positive integers (e.g. 224 or 256x320), or "
                                         f"a comma list of them; got {text!r}") from None


def add_model_flags(p: argparse.ArgumentParser, required: bool = True, named: bool = False) -> None:
    p.add_argument("--model", required=required and not named,
                   help=("model name (see `vitedge models`); optional with a --checkpoint that names its model (a "
                         "transformers folder or hf-hub: repo with config.json, or timm:NAME)") if named else
                   "model name (see `vitedge models`)" if required else
                   "model name (default: the one the artifact's or deploy checkpoint's metadata names)")
    p.add_argument("--checkpoint", help="train-form checkpoint: a .pth/.safetensors file (official or timm "
                                        "layout), a transformers save_pretrained folder or its weight file, "
                                        "hf-hub:ORG/REPO[:FILE] or timm:NAME; without it, seeded trained-like demo "
                                        "weights are used and the report says weights: untrained")
    p.add_argument("--set", dest="overrides", action="append", type=kv, default=[], metavar="KEY=VALUE",
                   help="constructor override, official keyword names (e.g. --set depth=2); repeatable")
    p.add_argument("--imgsz", type=image_sizes, metavar="S[,S]",
                   help="input size (default: the model's); export: a comma list (e.g. 224,256) exports every size "
                        "in one run: an ONNX file per size, one CoreML package / ExecuTorch program of every size; "
                        "parity: the sizes of a multi-size artifact to check (default: every one)")
    p.add_argument("--attn-order", choices=ATTN_ORDERS, default=None,
                   help="SLA/SimA attention order for the export size (default auto: the FLOP rule)")


def add_features_flag(p: argparse.ArgumentParser) -> None:
    p.add_argument("--features", nargs="?", const="default", default=None, metavar="INDICES",
                   help="export the backbone's multi-scale feature maps (NCHW, named feat_s<stride>) instead of the "
                        "logits: without INDICES its official detection outputs, else the comma-separated positions "
                        "of the maps to keep (e.g. 1,2,3); see the dense prediction page of the docs")


def rgb(text: str):
    from vitedge.errors import VitedgeError
    from vitedge.models.preprocess import three  # torch-free

    try:
        return three(text, "R,G,B")
    except VitedgeError:
        raise argparse.ArgumentTypeError(f"expected three numbers R,G,B (e.g. 0.5,0.5,0.5), got {text!r}") from None


def add_preprocess_flags(p: argparse.ArgumentParser) -> None:
    from vitedge.models.preprocess import INTERPOLATIONS  # torch-free

    g = p.add_argument_group("preprocessing", "the model's eval preprocessing (default: its official one, or a "
                                              "transformers checkpoint's preprocessor_config.json); used for --images, "
                                              "calibration and the bundle, recorded in report.json and the artifacts")
    g.add_argument("--crop-pct", type=positive_float, metavar="F",
                   help="resize the shorter side to imgsz / F, then centre-crop imgsz (1.0: resize only)")
    g.add_argument("--interpolation", choices=tuple(INTERPOLATIONS), help="resize filter")
    g.add_argument("--mean", type=rgb, metavar="R,G,B", help="per-channel mean of pixels scaled to [0, 1]")
    g.add_argument("--std", type=rgb, metavar="R,G,B", help="per-channel std of pixels scaled to [0, 1]")


def add_rewrites_flag(p: argparse.ArgumentParser) -> None:
    p.add_argument("--rewrites", type=rewrites, default="all", metavar="all|none|NAME[,NAME]",
                   help="deploy-form speed rewrites beyond folding (default all; each exact; names per family "
                        "in the README), e.g. --rewrites none for the folded-only ablation")


def rewrites(value: str):
    v = value.strip()
    if v == "all":
        return True
    if v == "none":
        return False
    names = [n.strip() for n in v.split(",") if n.strip()]
    if not names:
        raise argparse.ArgumentTypeError("give all, none or a comma list of rewrite names")
    return names


def add_parity_flags(p: argparse.ArgumentParser) -> None:
    # Building the parser imports no torch, so `vitedge --help` and usage errors stay instant.
    p.add_argument("--samples", type=positive_int, default=None,
                   help="parity inputs (default: 64, fewer for models over 8 GMACs by a fixed rule on GMACs, "
                        "reported as samples_rule)")
    p.add_argument("--tol", action="append", default=[], metavar="PROFILE.KEY=VALUE",
                   help="override a tolerance, e.g. --tol fp32.max_rel=2e-4 --tol fp16.psnr_db=30 (value none "
                        "disables a check); repeatable")
    p.add_argument("--require-verified", action="store_true",
                   help="exit 1 if any hop of a requested target is unverified (could not run here)")
    p.add_argument("--no-truth-cache", action="store_true",
                   help="compute the float64 ground truth again instead of reading it from the cache "
                        "(~/.cache/vitedge/truth, or $VITEDGE_CACHE_DIR/truth; keyed by weights, model code, inputs "
                        "and toolchain), and do not store it; also $VITEDGE_TRUTH_CACHE=off")
    p.add_argument("--require-ane", action="store_true",
                   help="coreml on macOS: fail the hop when under half of the model's estimated cost prefers the "
                        "Neural Engine (CoreML's compute plan); inconclusive where no Neural Engine exists")


def add_inputs_flags(p: argparse.ArgumentParser, labels_extra: str = "") -> None:
    p.add_argument("--images", metavar="DIR",
                   help="judge on your own images: every jpg/png in DIR (flat, or DIR/<class>/<image>, which also "
                        "gives labels and top-1/top-5 accuracy per hop) plus 16 stress images, instead of the "
                        "default parity set")
    p.add_argument("--labels", metavar="FILE",
                   help="class names in index order, one per line: stored with the artifacts (ONNX metadata "
                        "vitedge.labels" + labels_extra + "); an ImageFolder --images maps each folder name to its "
                        "line (default: sorted folder order)")


def add_exporter_flag(p: argparse.ArgumentParser, opset: bool = False, what: str = "") -> None:
    from vitedge.exporter.onnx.onnx_choice import DEFAULT_EXPORTER, DEFAULT_OPSET, DYNAMO_OPSET, EXPORTERS  # torch-free

    p.add_argument("--exporter", choices=EXPORTERS, default=None,
                   help=what or f"ONNX exporter (default {DEFAULT_EXPORTER}): torchscript (torch.onnx.export("
                                "dynamo=False)) or dynamo (the torch.export-based one); where dynamo cannot export "
                                "the model, TorchScript is used and the report says why (exporter_fallback)")
    if opset:
        p.add_argument("--opset", type=int, default=None,
                       help=f"ONNX opset (default {DEFAULT_OPSET} with torchscript, {DYNAMO_OPSET} with dynamo, which "
                            f"takes {DYNAMO_OPSET} or newer)")


def add_global_flags(p: argparse.ArgumentParser, main: bool = False) -> None:
    """-q and --config, on the main parser and on every subcommand, so both work anywhere on the line. On a
    subcommand their default is SUPPRESS: a flag given before the subcommand is not reset by the subparser."""
    default = {} if main else {"default": argparse.SUPPRESS}
    p.add_argument("-q", "--quiet", action="store_true", help="no progress lines", **default)
    p.add_argument("--config", metavar="FILE", help="read this command's options from a YAML (or .toml / .json) "
                                                    "file: keys are the flag names (attn_order or attn-order); "
                                                    "flags on the command line win", **default)


class Parser(argparse.ArgumentParser):
    """argparse with vitedge's one-line errors: the problem and where the flags are listed, not the whole usage."""

    def error(self, message: str):
        self.exit(2, f"{self.prog}: error: {message}; run `{self.prog} --help` for the flags\n")


def add_target_flags(p: argparse.ArgumentParser) -> None:
    """Each target's own flags, in a group named after it, as its row declares them."""
    from ...targets import rows

    for r in rows():
        if r.options:
            g = p.add_argument_group(r.name)
            for o in r.options:
                g.add_argument(o.flag, type=o.type, choices=o.choices, default=o.default, metavar=o.metavar,
                               dest=o.key, help=o.help)


def target_options() -> tuple[str, ...]:
    """The dests of every target's own flags (handed to export as `options`)."""
    from ...targets import rows

    return tuple(dict.fromkeys(o.key for r in rows() for o in r.options))


def bench_backends() -> tuple[str, ...]:
    """torch's two forms and every target row's bench name (validated again in exporter.timing.bench)."""
    from ...targets import rows

    return ("torch", "torch-deploy") + tuple(r.bench for r in rows() if r.bench)
