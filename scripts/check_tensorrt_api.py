#!/usr/bin/env python
"""Check vitedge's TensorRT API table (targets/tensorrt/api.py) against NVIDIA's pybind11 sources.

Usage: python scripts/check_tensorrt_api.py TENSORRT_GIT_DIR [REF ...]
TENSORRT_GIT_DIR is a clone (or bare mirror) of github.com/NVIDIA/TensorRT; the refs default to the table's
CHECKED_AGAINST. For each ref, every row whose majors include that ref's major version must be found (the
class, the member inside that class's binding, and for a method its arguments in one overload's own `.def(...)`
call: the row's names first and in order, its defaults defaults there, any further argument defaulted); rows of
other majors must be absent, so a member removed in 11.x is caught too. Prints one line per ref and exits 1 on
any mismatch.
"""
from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1].parent))
try:
    from vitedge.targets.tensorrt.api import CHECKED_AGAINST, ROWS, SOURCES
except ImportError:  # run from a checkout that is not installed: load the table file directly
    import importlib.util
    _p = Path(__file__).resolve().parents[1] / "targets" / "tensorrt" / "api.py"
    _spec = importlib.util.spec_from_file_location("tensorrt_api", _p)
    _mod = importlib.util.module_from_spec(_spec)
    _spec.loader.exec_module(_mod)
    CHECKED_AGAINST, ROWS, SOURCES = _mod.CHECKED_AGAINST, _mod.ROWS, _mod.SOURCES

BINDING = re.compile(r'py::(?:class_|enum_)<[^;]*?\(\s*\w+\s*,\s*"(\w+)"|py::(?:class_|enum_)<[^>]*>[^;{(]*\{\s*\w+\s*,\s*"(\w+)"')


def show(git_dir: str, ref: str, path: str) -> str:
    r = subprocess.run(["git", "--git-dir", git_dir, "show", f"{ref}:{path}"], capture_output=True, text=True)
    return r.stdout if r.returncode == 0 else ""


def blocks(text: str) -> dict[str, str]:
    """Python binding name -> its chained definition text (up to the next class_/enum_ binding)."""
    starts = [(m.start(), m.group(1) or m.group(2)) for m in BINDING.finditer(text)]
    out: dict[str, str] = {}
    for i, (pos, name) in enumerate(starts):
        end = starts[i + 1][0] if i + 1 < len(starts) else len(text)
        out[name] = out.get(name, "") + text[pos:end]
    return out


def present(row, texts: dict[str, str], classes: dict[str, str]) -> tuple[bool, str]:
    src = texts[row.source]
    if row.owner == "tensorrt":
        if row.kind == "class":
            return (row.member in classes), "binding"
        if row.source == "init":
            pat = rf"^(def {row.member}\(|{row.member}\s*=)"
            return bool(re.search(pat, src, re.M)), "module"
        return (f'm.attr("{row.member}")' in src), "m.attr"
    owner = "Severity" if (row.owner == "Logger" and row.kind == "value") else row.owner  # export_values()
    block = classes.get(owner)
    if block is None:
        return False, f"no binding for {owner}"
    if row.member == "__init__":
        found = "py::init" in block
    elif row.kind == "value":
        found = f'.value("{row.member}"' in block
    else:
        found = re.search(rf'\.def(?:_property(?:_readonly)?|_static)?\(\s*"{row.member}"', block) is not None
    if not found:
        return False, "member"
    if row.kind != "method" or row.params is None:
        return True, ""
    sigs = signatures(block, row.member)
    if not any(matches(row.params, sig) for sig in sigs):
        seen = "; ".join("(" + ", ".join(n + ("=" if d else "") for n, d in sig) + ")" for sig in sigs) or "none"
        return False, f"arguments ({', '.join(row.params)}) match no overload's own signature (bound: {seen})"
    return True, ""


# a C++ string literal (plain or raw): skipped when matching parentheses, so text in docstrings cannot unbalance them
STRING = re.compile(r'R"(\w*)\((?:.|\n)*?\)\1"|"(?:[^"\\\n]|\\.)*"')
ARG = re.compile(r'"(\w+)"_a(\s*=(?!=))?|py::arg\(\s*"(\w+)"\s*\)(\s*=(?!=))?')


def call_text(text: str, open_paren: int) -> str:
    """The call whose "(" is at `open_paren`, up to its matching ")" (string literals skipped)."""
    depth, i = 0, open_paren
    while i < len(text):
        m = STRING.match(text, i)
        if m:
            i = m.end()
            continue
        if text[i] == "(":
            depth += 1
        elif text[i] == ")":
            depth -= 1
            if depth == 0:
                return text[open_paren:i + 1]
        i += 1
    return text[open_paren:]


def signatures(block: str, member: str) -> list[list[tuple[str, bool]]]:
    """Each overload's own argument list in a class binding: [(name, has a default)] per `.def("member", ...)` call
    (`.def(py::init...)` for __init__), read from that call's text alone, never from its neighbours'."""
    head = r"\.def\(\s*py::init" if member == "__init__" else rf'\.def(?:_static)?\(\s*"{member}"'
    out = []
    for m in re.finditer(head, block):
        call = call_text(block, block.index("(", m.start()))
        out.append([(a.group(1) or a.group(3), bool(a.group(2) or a.group(4))) for a in ARG.finditer(call)])
    return out


def matches(params: tuple, sig: list[tuple[str, bool]]) -> bool:
    """The row's arguments are the overload's first arguments, in order (vitedge passes them positionally), a row
    default (`name=`) is a default there too, and every further argument of the overload has a default."""
    names = [p.split("=")[0] for p in params]
    if [n for n, _ in sig[:len(names)]] != names:
        return False
    if any("=" in p and not d for p, (_, d) in zip(params, sig)):
        return False
    return all(d for _, d in sig[len(names):])


def check(git_dir: str, ref: str, major: int) -> list[str]:
    texts = {k: show(git_dir, ref, v) for k, v in SOURCES.items()}
    classes: dict[str, str] = {}
    for k in ("core", "graph", "onnx", "types"):
        for name, text in blocks(texts[k]).items():
            classes[name] = classes.get(name, "") + text
    problems = []
    for row in ROWS:
        ok, where = present(row, texts, classes)
        want = major in row.majors
        if want and not ok:
            problems.append(f"{row.owner}.{row.member}: missing ({where})")
        elif not want and ok and row.kind != "class":
            problems.append(f"{row.owner}.{row.member}: present but the table says {row.majors} only")
    return problems


def main(argv: list[str]) -> int:
    if not argv:
        print(__doc__)
        return 2
    git_dir = argv[0]
    refs = argv[1:] or [r for rs in CHECKED_AGAINST.values() for r in rs]
    bad = 0
    for ref in refs:
        ver = show(git_dir, ref, "include/NvInferVersion.h")
        m = re.search(r"#define\s+(?:NV_TENSORRT_MAJOR|TRT_MAJOR_ENTERPRISE)\s+(\d+)", ver)
        if not m:
            print(f"FAIL {ref}: cannot read include/NvInferVersion.h")
            bad += 1
            continue
        problems = check(git_dir, ref, int(m.group(1)))
        print(f"{'PASS' if not problems else 'FAIL'} {ref} (TensorRT {m.group(1)}.x): "
              f"{len(ROWS) - len(problems)}/{len(ROWS)} rows agree" + "".join(f"\n  {p}" for p in problems))
        bad += bool(problems)
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
