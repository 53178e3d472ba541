"""What the benchmark scripts' tables share: their JSON results read once, a paired ratio and a Markdown table as
every table prints them, a run's one-line description, how its intervals were made, and a figure in short
scientific notation.

Each script renders its own tables from its own JSON (its `TABLES`, beside the code that writes the JSON);
scripts/render_benchmarks.py collects them and writes them between the `<!-- rendered: NAME -->` markers.
"""
from __future__ import annotations

import json
from functools import lru_cache
from pathlib import Path

RESULTS = Path(__file__).resolve().parent / "results"


class RenderError(ValueError):
    """A marker names no renderer, or its JSON lacks what the renderer reads."""


@lru_cache(maxsize=None)
def load(name: str) -> dict:
    return json.loads((RESULTS / name).read_text())


def ratio(r: dict, sign: str = "×") -> str:
    """A paired ratio with its 95 % CI, as every table prints it."""
    return f"{r['ratio']:.3f}{sign} [{r['ci'][0]:.3f}–{r['ci'][1]:.3f}]"


def table(head: list[str], rows: list[list], sep: str = "|---") -> str:
    line = "| " + " | ".join(head) + " |"
    rule = "|" + "---|" * len(head) if sep == "|---" else "| " + " | ".join("---" for _ in head) + " |"
    return "\n".join([line, rule] + ["| " + " | ".join(str(c) for c in row) + " |" for row in rows])


def utc(date: str) -> str:
    """A results file's ISO date as the pages write it: `YYYY-MM-DD HH:MM UTC`."""
    return f"{date[:16].replace('T', ' ')} UTC"


def run_line(d: dict) -> str:
    m = d["machine"]
    return f"{utc(m['date'])}, {m['cpu']}, {m['cores']} cores, ONNX Runtime {m['onnxruntime']}"


def intervals(settings: dict, per: str, once: str | None = None) -> str:
    """How a speed run's ratio intervals were made, from its `settings`: a bootstrap over fresh sessions where the
    run recorded `sessions`, else over the rounds of one session (`once`), which leaves out the spread between
    identical sessions."""
    n = settings.get("sessions")
    if n:
        return (f"every ratio's 95 % interval is a bootstrap over {n} fresh sessions per {per}, then the rounds "
                "within them, so it includes the spread between identical sessions")
    return (f"every ratio's 95 % interval is over the rounds of {once or f'one session per {per}'}, so it leaves out "
            "the spread between identical sessions (up to 2.6 % here) and may be too narrow by that much")


def sci(x: float) -> str:
    """1.0e-7 rather than 1.0e-07 (and 0 rather than 0.0e+0)."""
    if x == 0:
        return "0"
    return f"{x:.1e}".replace("e-0", "e-").replace("e+0", "e+")
