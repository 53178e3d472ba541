"""The export output folder is the atomic unit (issue 8): killing `vitedge export` at any moment leaves DIR
absent, holding the old complete artifacts, or holding the new complete ones; never a half-written set.

What the output-folder transaction documents (exporter/core/outdir.py): everything is built in a temporary sibling
`.DIR.tmp-*` and renamed into place in one step; with --force the old folder is first moved aside to `.DIR.old-*`.
After a SIGKILL nothing can clean up at once, so hidden siblings remain: they must never be merged into DIR,
and the next run that writes DIR recovers them (their names carry the owning pid@host; an abandoned build folder
is removed, an abandoned moved-aside output is put back if DIR is missing). SIGINT cleans the build folder, leaves
DIR as it was and exits 130, even where a library swallowed the KeyboardInterrupt.

Kills are of two kinds: real signals sent from outside while the run waits at a named point (the test hook
VITEDGE_TEST_PAUSE_AT: build folder created, base graph written, just before the commit), so a busy machine cannot
make the signal race the end of the run; and deterministic kills from inside the process at the commit's renames
and halfway through writing the .onnx (a driver wraps `os.rename` / `onnx.save` and SIGKILLs itself).
"""
from __future__ import annotations

import hashlib
import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import onnx
import pytest

from vitedge.exporter.core.outdir import MANIFEST
from vitedge.tests._signals import sigint_default

REPO = Path(__file__).resolve().parents[1]
NAME = "swiftformer_xs"
OUT = "artifacts"  # the --out folder's name inside each test's own parent folder
TINY = ["--model", NAME, "--set", "layers=[1,1,1,1]", "--set", "embed_dims=[8,8,16,16]", "--set", "num_classes=5",
        "--imgsz", "32", "--samples", "2", "--target", "onnx"]
ENV = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONUNBUFFERED": "1"}
TIMEOUT = 240

# Runs the CLI with a kill point: VITEDGE_TEST_KILL_AT = "rename:before|after:N" (the Nth rename whose source
# or target is the --out folder), "save-half" (write half of the first .onnx, then die) or "swallow-sigint" (a
# Ctrl-C while the base graph is saved, caught and dropped the way a library's broad except would).
_DRIVER = r"""
import os, signal, sys, time
from pathlib import Path

point, out_name = os.environ["VITEDGE_TEST_KILL_AT"], os.environ["VITEDGE_TEST_OUT_NAME"]

def die():
    os.kill(os.getpid(), signal.SIGKILL)

if point.startswith("rename:"):
    _, when, nth = point.split(":")
    real_rename, seen = os.rename, [0]

    def rename(src, dst, *args, **kwargs):
        if out_name not in (Path(src).name, Path(dst).name):
            return real_rename(src, dst, *args, **kwargs)
        seen[0] += 1
        if seen[0] == int(nth) and when == "before":
            die()
        real_rename(src, dst, *args, **kwargs)
        if seen[0] == int(nth):
            die()

    os.rename = rename
elif point == "save-half":
    import onnx

    def save(model, path, *args, **kwargs):
        data = model.SerializeToString()
        with open(path, "wb") as f:
            f.write(data[: len(data) // 2])
            f.flush()
            os.fsync(f.fileno())
        die()

    onnx.save = save
elif point == "swallow-sigint":
    import onnx
    real_save = onnx.save

    def save(model, path, *args, **kwargs):
        try:
            os.kill(os.getpid(), signal.SIGINT)
            time.sleep(5)  # the KeyboardInterrupt lands here ...
        except KeyboardInterrupt:
            pass           # ... and is swallowed: the run goes on
        return real_save(model, path, *args, **kwargs)

    onnx.save = save
else:
    raise SystemExit(f"unknown kill point {point!r}")

from vitedge.cli import main
sys.exit(main(sys.argv[1:]))
"""


# ---- helpers ----------------------------------------------------------------------------------------

def export_argv(out: Path, *extra: str) -> list[str]:
    return ["-q", "export", *TINY, "--out", str(out), *extra]


def run_cli(out: Path, *extra: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "cli.py", *export_argv(out, *extra)], cwd=REPO, env=ENV,
                          capture_output=True, text=True, timeout=TIMEOUT)


def start_paused(out: Path, at: str, marker: Path, *extra: str) -> subprocess.Popen:
    """Start the CLI so that it waits at the named point `at` (exporter/core/outdir.py) once it writes `marker`."""
    env = {**ENV, "VITEDGE_TEST_PAUSE_AT": at, "VITEDGE_TEST_PAUSE_FILE": str(marker)}
    return subprocess.Popen([sys.executable, "cli.py", *export_argv(out, *extra)], cwd=REPO, env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, preexec_fn=sigint_default)


def run_driver(out: Path, kill_at: str, *extra: str) -> subprocess.CompletedProcess:
    env = {**ENV, "VITEDGE_TEST_KILL_AT": kill_at, "VITEDGE_TEST_OUT_NAME": out.name}
    return subprocess.run([sys.executable, "-c", _DRIVER, *export_argv(out, *extra)], cwd=REPO, env=env,
                          capture_output=True, text=True, timeout=TIMEOUT, preexec_fn=sigint_default)


def sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def snapshot(folder: Path) -> dict[str, str]:
    """Every file under `folder` (relative path -> sha256)."""
    return {str(p.relative_to(folder)): sha256(p) for p in sorted(folder.rglob("*")) if p.is_file()}


def assert_complete(folder: Path) -> dict[str, str]:
    """A complete export: report.json parses, every artifact it lists exists with its sha256 and size, the base
    graph loads and passes onnx.checker, and no file is there that the report does not account for."""
    report = json.loads((folder / "report.json").read_text())
    listed = {"report.json"}
    for key, a in report["artifacts"].items():
        path = folder / a["path"]
        assert path.is_file(), f"report lists {key} at {a['path']}, which is missing"
        assert sha256(path) == a["sha256"] and path.stat().st_size == a["bytes"], \
            f"{a['path']} is not what the report says"
        listed.add(a["path"])
    onnx.checker.check_model(onnx.load(str(folder / f"{NAME}.onnx")))
    snap = snapshot(folder)
    listed.add(MANIFEST)  # vitedge's own list of what it wrote there (what --force may replace)
    assert set(snap) == listed, f"files the report does not list: {sorted(set(snap) - listed)}"
    assert sorted(json.loads((folder / MANIFEST).read_text())["files"]) == sorted(listed - {MANIFEST})
    return snap


def state_of(out: Path, old: dict[str, str] | None) -> str:
    """'absent', 'old' (byte-identical to the previous export) or 'new' (a different, complete export)."""
    if not out.exists():
        return "absent"
    snap = snapshot(out)
    if old is not None and snap == old:
        return "old"
    try:
        assert_complete(out)
    except Exception as e:  # report it as the contract violation it is
        pytest.fail(f"{out} holds a half-written set {sorted(snap)}: {type(e).__name__}: {e}")
    return "new"


def assert_only_hidden_siblings(out: Path) -> None:
    """Whatever a killed run leaves beside DIR is a hidden `.DIR.tmp-*` / `.DIR.old-*` folder, nothing else."""
    for entry in out.parent.iterdir():
        if entry.name == out.name:
            continue
        assert entry.name.startswith((f".{out.name}.tmp-", f".{out.name}.old-")), f"unexpected {entry} beside {out}"
        assert entry.is_dir(), f"{entry} should be a build folder"


def build_siblings(out: Path) -> list[Path]:
    return sorted(out.parent.glob(f".{out.name}.tmp-*"))


def wait_for(proc: subprocess.Popen, condition, what: str, timeout: float = TIMEOUT) -> None:
    """Poll `condition()` every 10 ms while `proc` runs; fail if the process ends first."""
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        if condition():
            return
        if proc.poll() is not None:
            out, err = proc.communicate()
            pytest.fail(f"export finished (rc {proc.returncode}) before {what}: {err[-2000:]}")
        time.sleep(0.01)
    proc.kill()
    pytest.fail(f"timed out waiting for {what}")


# ---- fixtures ---------------------------------------------------------------------------------------

@pytest.fixture(scope="module")
def good_export(tmp_path_factory) -> tuple[Path, dict[str, str]]:
    """One complete export (the 'old artifacts' every --force re-export starts from). Its --samples differs from
    the re-exports', so its report.json (and so its snapshot) can never equal theirs: 'old' and 'new' stay
    distinguishable."""
    out = tmp_path_factory.mktemp("good") / OUT
    r = run_cli(out, "--samples", "3")
    assert r.returncode == 0, r.stderr
    return out, assert_complete(out)


@pytest.fixture
def previous(good_export, tmp_path) -> tuple[Path, dict[str, str]]:
    """A private copy of the good export at tmp_path/OUT (the folder a --force re-export replaces)."""
    src, snap = good_export
    out = tmp_path / OUT
    shutil.copytree(src, out)
    assert snapshot(out) == snap
    return out, snap


# ---- real signals from outside, at named points of the run ------------------------------------------------

@pytest.fixture
def marker(tmp_path_factory) -> Path:
    """Where a paused run says it is waiting (outside the --out folder's parent, which the tests inspect)."""
    return tmp_path_factory.mktemp("pause") / "paused"


@pytest.mark.parametrize("at, written", [
    ("build-folder", lambda build: True),  # the new build folder exists, nothing in it yet
    # the base .onnx lands in the build folder before its own parity hop and the report: kill in that window
    ("base-graph", lambda build: any(p.suffix == ".onnx" for p in build.iterdir())),
])
def test_sigkill_at_a_named_point_keeps_the_old_artifacts(previous, marker, at, written):
    out, old = previous
    proc = start_paused(out, at, marker, "--force")
    wait_for(proc, marker.exists, f"the run paused at {at}")
    (build,) = build_siblings(out)
    assert written(build)
    proc.send_signal(signal.SIGKILL)
    proc.communicate(timeout=TIMEOUT)
    assert proc.returncode == -signal.SIGKILL
    assert state_of(out, old) == "old"
    assert_only_hidden_siblings(out)


def test_sigkill_of_a_first_export_leaves_no_folder(tmp_path, marker):
    out = tmp_path / OUT
    proc = start_paused(out, "build-folder", marker)
    wait_for(proc, marker.exists, "the run paused in its new build folder")
    proc.send_signal(signal.SIGKILL)
    proc.communicate(timeout=TIMEOUT)
    assert proc.returncode == -signal.SIGKILL
    assert not out.exists()
    assert_only_hidden_siblings(out)


@pytest.mark.parametrize("at", ["build-folder", "base-graph", "commit"])
def test_sigint_exits_nonzero_and_leaves_nothing_partial(previous, marker, at):
    out, old = previous
    proc = start_paused(out, at, marker, "--force")
    wait_for(proc, marker.exists, f"the run paused at {at}")
    proc.send_signal(signal.SIGINT)
    _, err = proc.communicate(timeout=TIMEOUT)
    assert proc.returncode == 130, err[-2000:]
    assert "interrupted" in err
    assert state_of(out, old) == "old"
    assert build_siblings(out) == [], "a KeyboardInterrupt must clean its build folder"
    assert_only_hidden_siblings(out)


def test_a_swallowed_sigint_still_ends_the_run_with_130(previous):
    """A Ctrl-C that a library catches (here: while the base graph is saved) must not let the run commit: the next
    named point re-raises it. Without that the run went on and exited 0 with the new artifacts in place."""
    out, old = previous
    r = run_driver(out, "swallow-sigint", "--force")
    assert r.returncode == 130, r.stderr[-2000:]
    assert "interrupted" in r.stderr
    assert state_of(out, old) == "old"
    assert list(out.parent.iterdir()) == [out], sorted(p.name for p in out.parent.iterdir())


# ---- deterministic kills from inside ----------------------------------------------------------------

@pytest.mark.parametrize("kill_at, allowed", [
    ("rename:after:1", {"absent"}),   # old folder moved aside, new not yet in place: DIR is absent, never partial
    ("rename:after:2", {"new"}),      # new folder in place, the moved-aside old one not yet deleted
])
def test_sigkill_inside_the_commit(previous, kill_at, allowed):
    out, old = previous
    r = run_driver(out, kill_at, "--force")
    assert r.returncode == -signal.SIGKILL, f"the kill point {kill_at} was never reached: {r.stderr[-2000:]}"
    state = state_of(out, old)
    assert state in allowed
    if out.exists():
        assert f"{NAME}.onnx" in snapshot(out)  # never an empty or partial folder at the normal path
    assert_only_hidden_siblings(out)
    assert list(out.parent.glob(f".{out.name}.old-*")), "the moved-aside old folder is what the kill left"
    # The next run recovers: a missing DIR gets its old artifacts back (byte-identical), a committed one keeps
    # the new ones; either way the run then refuses to overwrite without --force and no sibling remains.
    snap_before = snapshot(out) if out.exists() else None
    again = run_cli(out)
    assert again.returncode == 2 and "--force" in again.stderr, again.stderr
    assert snapshot(out) == (old if state == "absent" else snap_before)
    assert list(out.parent.iterdir()) == [out], sorted(p.name for p in out.parent.iterdir())


def test_sigkill_halfway_through_writing_the_graph_then_rerun(previous):
    """Killed halfway through writing the base .onnx: the half graph exists only in a hidden build folder and DIR
    keeps the old artifacts. The next --force run ignores the stale folder, succeeds, and nothing from it
    reaches DIR, and the abandoned build folder is removed by that run."""
    out, old = previous
    killed = run_driver(out, "save-half", "--force")
    assert killed.returncode == -signal.SIGKILL, f"the .onnx was never written: {killed.stderr[-2000:]}"
    assert state_of(out, old) == "old"
    stale = build_siblings(out)
    assert len(stale) == 1 and (stale[0] / f"{NAME}.onnx").stat().st_size > 0
    r = run_cli(out, "--force")
    assert r.returncode == 0, r.stderr
    assert state_of(out, old) == "new"  # complete, and nothing but what its report lists
    assert list(out.parent.iterdir()) == [out], sorted(p.name for p in out.parent.iterdir())


# ---- refusing to overwrite, and what the committed folder looks like ---------------------------------

def test_existing_artifacts_need_force(previous):
    out, old = previous
    r = run_cli(out)
    assert r.returncode == 2
    err = [line for line in r.stderr.splitlines() if line.strip()]
    assert len(err) == 1 and "--force" in err[0], r.stderr
    assert snapshot(out) == old
    assert build_siblings(out) == []


def test_committed_folder_has_normal_permissions(good_export):
    """The build folder comes from tempfile.mkdtemp (mode 0700); once renamed into place it is the user's
    output folder and must carry the usual umask-derived mode, like any `mkdir` (CI artifact uploads,
    shared volumes and other users read it)."""
    out, _ = good_export
    umask = os.umask(0)
    os.umask(umask)
    mode = out.stat().st_mode & 0o777
    assert mode == 0o777 & ~umask, f"{out} has mode {oct(mode)}, expected {oct(0o777 & ~umask)}"


# ---- recovery rules on their own (exporter/core/outdir.py) --------------------------------------------------

def _dead_pid() -> int:
    p = subprocess.Popen([sys.executable, "-c", "pass"])
    p.wait()
    return p.pid


def _fake_sibling(out: Path, kind: str, pid: int, host: str | None = None) -> Path:
    from vitedge.exporter.core import outdir

    name = outdir.sibling(out, kind).name
    if host is not None:
        name = name.rsplit("@", 1)[0] + "@" + host
    name = name.replace(f"-{os.getpid()}@", f"-{pid}@")
    path = out.parent / name
    path.mkdir()
    (path / "report.json").write_text(json.dumps({"kind": kind, "pid": pid}))
    return path


def test_recovery_touches_only_abandoned_siblings(tmp_path):
    from vitedge.exporter.core import outdir

    out = tmp_path / OUT
    dead = _dead_pid()
    live = _fake_sibling(out, "tmp", os.getpid())                  # a concurrent run still building
    other_host = _fake_sibling(out, "tmp", dead, host="elsewhere")  # its pid means nothing here
    other_dir = _fake_sibling(tmp_path / "other", "tmp", dead)      # a sibling of a different output
    gone_tmp = _fake_sibling(out, "tmp", dead)
    gone_old = _fake_sibling(out, "old", dead)
    lines = outdir.recover(out)
    # DIR was missing: the abandoned moved-aside output is put back, the abandoned build folder removed
    assert json.loads((out / "report.json").read_text()) == {"kind": "old", "pid": dead}
    assert not gone_tmp.exists() and not gone_old.exists()
    assert live.exists() and other_host.exists() and other_dir.exists()
    assert len(lines) == 2 and any(line.startswith("restored") for line in lines)
    # DIR present: an abandoned moved-aside copy is just removed, DIR untouched
    again = _fake_sibling(out, "old", dead)
    assert outdir.recover(out) == [f"removed {again.name} left by a killed run"]
    assert json.loads((out / "report.json").read_text())["kind"] == "old" and not again.exists()


def test_deploy_checkpoint_write_clears_its_abandoned_temp_file(tmp_path):
    from vitedge.exporter.core import outdir
    from vitedge.exporter.flow.deploy_checkpoint import save_deploy_checkpoint
    from vitedge.exporter.reparam import reparameterize
    from vitedge.models import create_model

    path = tmp_path / "deploy.pt"
    leftover = tmp_path / outdir.sibling(path, "tmp").name.replace(f"-{os.getpid()}@", f"-{_dead_pid()}@")
    leftover.write_bytes(b"half a checkpoint")
    deploy = reparameterize(create_model(NAME, layers=[1, 1, 1, 1], embed_dims=[8, 8, 16, 16], num_classes=5).eval(), 32)
    save_deploy_checkpoint(deploy, path, imgsz=32)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["deploy.pt"]
