"""The default parity set's size rests on measured evidence: benchmarks/parity_set_size.py judged the same artifacts
on the first n inputs of a larger default set. At the default size every correct artifact passes and a zeroed
channel, a sign flip and a 1 % channel fail wherever they fail on the larger set, each on enough samples that any
set of the default size meets one. The summary is recomputed here from the per-artifact rows, so neither can be
edited alone."""
import json
import sys
from pathlib import Path

from vitedge.exporter.verdict.inputs import DEFAULT_SAMPLES

BENCH = Path(__file__).resolve().parents[1] / "benchmarks"
sys.path.insert(0, str(BENCH))
import parity_noise  # noqa: E402
import parity_set_size  # noqa: E402

RESULTS = json.loads((BENCH / "results" / "parity_set_size.json").read_text())


def test_the_default_size_was_measured_against_a_larger_set():
    assert RESULTS["quick"] is False and not RESULTS["not_measured"]
    assert RESULTS["default_samples"] == DEFAULT_SAMPLES, "the study must be re-run when the default changes"
    assert DEFAULT_SAMPLES in RESULTS["sizes"] and RESULTS["measured_samples"] >= 4 * DEFAULT_SAMPLES
    labels = {r["label"] for r in RESULTS["configs"]}
    assert {c[0] for c in parity_noise.SMALL} <= labels, "every family's small config"
    assert any(r["label"].endswith("(full)") for r in RESULTS["configs"])


def test_the_summary_is_what_the_rows_say():
    assert parity_set_size.summarize(RESULTS["configs"], RESULTS["sizes"]) == RESULTS["summary"]


def test_at_the_default_size_correct_artifacts_pass_and_the_named_plants_fail_as_with_the_larger_set():
    n, top = str(DEFAULT_SAMPLES), str(RESULTS["measured_samples"])
    assert RESULTS["summary"][n]["differ_correct"] == [] and RESULTS["summary"][n]["differ_named"] == []
    for r in RESULTS["configs"]:
        arts = r["artifacts"]
        for name, a in arts.items():
            if not a["planted"]:
                assert a["by_n"][n]["passed"], f"{r['label']}: correct {name} failed at {n}"
        for name in parity_set_size.NAMED:
            if arts[name]["by_n"][top]["passed"]:
                continue  # below the logits' noise on this config (the feature probe's case, not run here)
            assert not arts[name]["by_n"][n]["passed"], f"{r['label']}: {name} passed at {n}"
            # it fails on so many samples by itself that any set of the default size would meet one
            miss = parity_set_size.miss_probability(arts[name]["failing_samples"], RESULTS["measured_samples"], int(n))
            assert miss < 1e-6, f"{r['label']}: {name} missed by a random set of {n} with probability {miss:.2g}"


def test_miss_probability_is_the_hypergeometric_tail():
    assert parity_set_size.miss_probability(0, 256, 64) == 1.0
    assert parity_set_size.miss_probability(200, 256, 64) == 0.0
    assert abs(parity_set_size.miss_probability(1, 256, 64) - 192 / 256) < 1e-12
