"""Statistics of the benchmark scripts: latency summaries, paired speedups (ratio of medians with a paired
bootstrap 95 % interval, `vitedge.exporter.timing.latency`), how they are printed, and the verdict studies' counts
of caught plants.
"""
from __future__ import annotations

from vitedge.exporter.timing import latency

def rel_width(r: dict) -> float:
    return (r["ci"][1] - r["ci"][0]) / r["ratio"]


def stats(times_s: list[float], batch: int = 1) -> dict:
    return latency.summarize(times_s, batch=batch).to_dict()


def speedup(base_s: list[float], new_s: list[float]) -> dict:
    """How many times faster `new` is than `base`: median(base) / median(new), paired bootstrap CI."""
    return latency.paired_ratio(base_s, new_s)


def speedup_sessions(base_s: list[list[float]], new_s: list[list[float]]) -> dict:
    """`speedup` over several sessions per candidate (fresh sessions, programs loaded anew): the interval is a
    bootstrap over sessions, then rounds within them, so it includes the session-to-session spread."""
    return latency.paired_ratio_sessions(base_s, new_s)


def fmt_ratio(r: dict, unit: str = "x") -> str:
    over = f", {r['sessions']} sessions" if "sessions" in r else ""
    return f"{r['ratio']:.3f}{unit} (95% CI {r['ci'][0]:.3f}-{r['ci'][1]:.3f}, {r['pairs']} pairs{over})"


def print_ratios(results: list[dict], field: str) -> None:
    """The closing lines of a script: each model's ratios in `field` (name -> paired ratio), one per line."""
    for r in results:
        for key, q in r[field].items():
            print(f"  {r['model']} ({r['config']}) {key}: {fmt_ratio(q)}")


def plant_counts(rows: list[dict]) -> dict:
    """The verdict studies' count of one kind of plant over its rows (each with `caught`, `caught_by_outputs`,
    `visible`): caught, of, caught by the outputs alone, and missed though visible in the outputs."""
    return {"caught": sum(r["caught"] for r in rows), "of": len(rows),
            "caught_by_outputs": sum(r["caught_by_outputs"] for r in rows),
            "visible_missed": sum(r["visible"] and not r["caught"] for r in rows)}
