"""The measurement tables of the README and docs/ (docs/benchmarks/ included) are rendered from
benchmarks/results/*.json (scripts/render_benchmarks.py): re-rendered here and compared, so no quoted figure can drift from its JSON."""
from __future__ import annotations

import copy

import pytest

from vitedge.tests._scripts import load_script
from vitedge.tests.conftest import REPO


@pytest.fixture(scope="module")
def rb():
    return load_script("render_benchmarks")


def test_every_rendered_block_matches_its_json(rb):
    stale = [rel for rel in (*rb.FILES, *rb.code_files())
             if rb.render_text((REPO / rel).read_text()) != (REPO / rel).read_text()]
    assert not stale, f"{stale} differ from benchmarks/results/*.json: run python scripts/render_benchmarks.py"


def test_every_renderer_renders_somewhere_and_the_readme_has_the_headlines_and_the_verdict_line(rb):
    used = [b.split()[0] for rel in (*rb.FILES, *rb.code_files()) for b in rb.blocks((REPO / rel).read_text())]
    assert set(used) == set(rb.RENDERERS), set(rb.RENDERERS) ^ set(used)
    readme = rb.blocks((REPO / "README.md").read_text())
    # one headline table (deploy speed), the main job's cost against the plain conversions (and on a second CPU),
    # the verdict
    assert readme == ["deploy_speed_headline", "export_time_headline", "export_time_brief export_time_amd_epyc.json",
                      "verdict_headline"], readme


def test_a_changed_figure_in_the_json_changes_the_render(rb, monkeypatch):
    """The drift check can fail: a JSON whose c/a ratio moved renders a README that differs, with the new figure."""
    import sys

    script = sys.modules[rb.RENDERERS["deploy_speed_headline"].__module__]  # the script that renders the table
    load = script.load
    moved = copy.deepcopy(load("deploy_speed.json"))
    cell = next(c for c in moved["models"][0]["cells"] if c["threads"] == 1 and c["batch"] == 1)
    cell["speedups"]["c/a"]["ratio"] = 1.234
    monkeypatch.setattr(script, "load", lambda name: moved if name == "deploy_speed.json" else load(name))
    text = (REPO / "README.md").read_text()
    new = rb.render_text(text)
    assert new != text and f"{moved['models'][0]['model']} | 1.234× [" in new


def test_a_block_naming_no_renderer_or_a_missing_row_is_an_error(rb):
    with pytest.raises(rb.RenderError, match="no renderer named 'nope'"):
        rb.render_text("<!-- rendered: nope -->\nx\n<!-- /rendered -->")
    with pytest.raises(rb.RenderError, match="no_such_model"):
        rb.render_text("<!-- rendered: deploy_speed_model deploy_speed.json no_such_model -->\n<!-- /rendered -->")


def test_each_table_is_rendered_by_a_benchmark_script_and_the_renderer_only_collects(rb):
    scripts = {p.stem for p in (REPO / "benchmarks").glob("[!_]*.py")}
    where = {name: render.__module__ for name, render in rb.RENDERERS.items()}
    assert {name: m for name, m in where.items() if m not in scripts} == {}
    assert not [n for n in vars(rb) if n.endswith("_headline") or n in where]  # no table is defined in the renderer


def test_the_verdict_headline_gives_both_ends_per_precision_with_their_configs(rb, monkeypatch):
    """Per precision, the smallest planted error caught and the largest missed (or that none was), each with the
    config it came from; a plant the study missed is named as soon as its JSON says so."""
    import sys

    from vitedge import precisions

    render = rb.RENDERERS["verdict_headline"]
    lines = [line for line in render().splitlines() if line.startswith("- ")]
    assert [line[2:].split()[0] for line in lines] == list(precisions.names())
    for line in lines:
        assert "smallest caught" in line and ("largest missed" in line or "none missed" in line), line
    fp32 = lines[0]   # the 0.1 % plants the noise rule misses: named with their config, not only the best case
    assert "largest missed" in fp32 and "× 1.001" in fp32.split("largest missed")[1]

    script = sys.modules[render.__module__]
    load = script.load
    moved = copy.deepcopy(load("fp16_verdicts.json"))
    worst = max((r for r in moved["cases"] if r["plant"] is not None), key=lambda r: r["worst_error"])
    worst["caught"] = False
    monkeypatch.setattr(script, "load", lambda name: moved if name == "fp16_verdicts.json" else load(name))
    fp16 = next(line for line in render().splitlines() if line.startswith("- fp16"))
    assert f"largest missed {script.sci(worst['worst_error'])} ({worst['model']}/{worst['artifact']}," in fp16


def test_a_figure_quoted_in_a_code_comment_is_rendered_and_checked(rb, monkeypatch):
    """precisions.py's reasons quote their figures as [FIGURE](rendered: NAME): the drift check covers them, so a
    comment cannot keep a figure its JSON no longer says."""
    import sys

    assert "precisions.py" in rb.code_files()
    typed = "# correct hops reach at most [0.99](rendered: fp32_worst_correct) of the allowance"
    assert rb.render_text(typed) != typed   # a figure typed by hand is drift
    script = sys.modules[rb.RENDERERS["fp16_worst_correct"].__module__]
    load = script.load
    moved = copy.deepcopy(load("fp16_verdicts.json"))
    moved["summary"]["worst_correct_ratio"] = 3.21
    monkeypatch.setattr(script, "load", lambda name: moved if name == "fp16_verdicts.json" else load(name))
    text = (REPO / "precisions.py").read_text()
    new = rb.render_text(text)
    assert new != text and "[3.21](rendered: fp16_worst_correct)" in new


def test_benchmarks_readme_is_an_index_and_each_benchmark_has_its_page(rb):
    """Each benchmark's prose lives on its own page of docs/benchmarks/ (in the site's nav, its tables rendered);
    benchmarks/README.md only points to them."""
    import re

    pages = sorted(p.relative_to(REPO).as_posix() for p in (REPO / "docs" / "benchmarks").glob("*.md"))
    assert len(pages) >= 7 and set(pages) <= set(rb.FILES), pages
    nav = (REPO / "mkdocs.yml").read_text()
    assert all(p.removeprefix("docs/") in nav for p in pages)
    index = (REPO / "benchmarks" / "README.md").read_text()
    linked = set(re.findall(r"\]\(\.\./(docs/benchmarks/[a-z_]+\.md)\)", index))
    assert linked == set(pages) and len(index.splitlines()) < 60 and "<!-- rendered" not in index


def test_the_verdict_headline_says_what_the_false_failure_samples_are(rb, monkeypatch):
    """Digits and photo views, how many of each and how many distinct, and the models: from false_failures.json."""
    import sys

    render = rb.RENDERERS["verdict_headline"]
    text = render()
    assert "scikit-learn's 1797 handwritten digits" in text and "views of the 14 shipped photos" in text
    script = sys.modules[render.__module__]
    load = script.load
    moved = copy.deepcopy(load("false_failures.json"))
    moved["models"] = moved["models"][:1]
    moved["models"][0]["sets"] = {"user": 1000, "natural": 24}
    monkeypatch.setattr(script, "load", lambda name: moved if name == "false_failures.json" else load(name))
    text = render()
    assert "per model 1000 original digits, 0 augmented copies and 24 photo views, judged on" in text
    assert f"judged on digit classifiers: {moved['models'][0]['model']} (" in text


def test_the_verdict_headline_reads_the_measured_again_sample_counts_from_the_json(rb, monkeypatch):
    """The models the stopping rule measured again: their sample counts, first draw and re-measure, are the JSONs'."""
    import sys

    render = rb.RENDERERS["verdict_headline"]
    assert "measured again on 20000 samples because their 5000-sample bound" in render()
    script = sys.modules[render.__module__]
    load = script.load
    again = {r["model"] for r in load("false_failures_first_draw.json")["models"]}
    moved = copy.deepcopy(load("false_failures.json"))
    for m in moved["models"]:
        m["samples"] = 40000 if m["model"] in again else m["samples"]
    first = copy.deepcopy(load("false_failures_first_draw.json"))
    for m in first["models"]:
        m["samples"] = 6000
    jsons = {"false_failures.json": moved, "false_failures_first_draw.json": first}
    monkeypatch.setattr(script, "load", lambda name: jsons.get(name) or load(name))
    assert "measured again on 40000 samples because their 6000-sample bound" in render()


def test_the_false_failure_upper_bound_is_named_a_heuristic(rb, monkeypatch):
    """The tail fit's upper bound fixes the shape at a bootstrap quantile and ignores the scale's and the threshold's
    uncertainty: the rendered study and the headline call it a heuristic, and a method written into the JSON is
    what the study's text says."""
    import sys

    assert "heuristic upper bound (not a confidence bound)" in rb.RENDERERS["verdict_headline"]()
    render = rb.RENDERERS["false_failures"]
    assert "its upper bound (heuristic, not a confidence bound" in render()
    # the 20000-sample rows replaced 5000-sample fits: the rule that chose them is stated beside the figures
    assert "Stopping rule: every model is measured on 5000 samples; one whose upper bound" in render()
    assert "the replaced 5000-sample fit is kept beside it (false_failures_first_draw.json)" in render()
    first = rb.RENDERERS["false_failures_first_draw"]()
    assert "5000 samples (its raw and simplified ONNX identical, counted once)): median ratio" in first
    assert "so measured again on more samples: " in first and "**outside**" not in first
    # raw and simplified ONNX with identical statistics are one artifact, not two
    assert "samples (its raw and simplified ONNX identical, counted once)" in render()
    script = sys.modules[render.__module__]
    load = script.load
    moved = copy.deepcopy(load("false_failures.json"))
    moved["summary"]["upper_method"] = "a method named in the JSON"
    monkeypatch.setattr(script, "load", lambda name: moved if name == "false_failures.json" else load(name))
    assert "its upper bound (a method named in the JSON) is" in render()


def test_a_speed_run_says_whether_its_intervals_cover_the_sessions_spread(rb, monkeypatch):
    """deploy_speed's run line says how its intervals were made, from the JSON: over fresh sessions where the run
    recorded them (`settings.sessions`), else over one set of sessions, and then that they may be too narrow."""
    import sys

    render = rb.RENDERERS["deploy_speed_run"]
    script = sys.modules[render.__module__]
    load = script.load
    one = copy.deepcopy(load("deploy_speed_xeon.json"))
    one["settings"].pop("sessions", None)
    many = copy.deepcopy(one)
    many["settings"]["sessions"] = 3
    for d, words in ((one, "over the rounds of one set of sessions per cell"),
                     (many, "a bootstrap over 3 fresh sessions per graph")):
        monkeypatch.setattr(script, "load", lambda name, d=d: d)
        assert words in render("any.json")
