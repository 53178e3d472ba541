"""`vitedge.matrix()`: resolve the plan, reuse what the cache holds, build the rest on an engine, write results.

Order of work (nothing is written before the plan and the arguments are valid: a bad plan exits 2):
1. read the plan; its resolution into cells comes from the cache's memo when this exact plan (same content,
   folder, vitedge source and toolchain) was resolved before, so a fully cached re-run imports no torch;
2. key every cell (cache.py); a passed entry is copied into DIR (unless DIR already holds that key);
3. the other cells are grouped by model and size. When the group's verified base (deploy-form + ONNX + ground
   truth: exporter/flow/verified_base.py) is not cached, its cheapest cell goes first and stores it; the rest of
   the group then reuse it;
4. each result is recorded in the cache (a failed or unverified one is dropped again after it is copied
   into DIR: never reused as passed) and its folder committed atomically into DIR/<label>/<imgsz>/<cell>/;
5. DIR/matrix.json and DIR/matrix.md. Ctrl-C stops the workers (their build folders removed) and raises
   KeyboardInterrupt before anything else is written; a re-run resumes from the cache.
"""
from __future__ import annotations

import shutil
import time
from collections import defaultdict
from pathlib import Path

from ...errors import VitedgeError
from ..core.digests import json_digest
from ..core.writable import check_folder_path
from ..onnx.onnx_choice import DEFAULT_EXPORTER, check_exporter
from .cache import Cache, Env, base_key, cell_key, toolchain_drift, trt_mismatch
from .engines import Job, LocalPool, size_pool
from .folders import (BASE_META, KEY_FILE, TRACEBACK, base_untrusted, current_key, materialize, untrusted, unpack,
                      write_error)
from .plan import PlanError, ResolvedPlan, canonical, read_plan
from .ray_engine import resources_for
from .results import CellResult, MatrixProgress, MatrixResult
from .status import artifact_bytes, worst_metric

DEFAULT_RESOURCE_TIMEOUT = 300.0
POLL_S = 0.5
_COST = {"onnx": 0, "tensorrt": 1, "coreml": 2}  # which cell of a group builds the shared base first


def matrix(plan, *, out, workers: int | None = None, ray=None, rebuild: bool = False, dry_run: bool = False,
           bench: bool = False, cache=None, resource_timeout: float = DEFAULT_RESOURCE_TIMEOUT,
           require_verified: bool = False, progress: bool = True, exporter: str | None = None) -> MatrixResult:
    """Run the export matrix `plan` (a YAML/TOML/JSON file, or the same structure as a dict) into `out`.

    `workers`: local pool size (default from the cores) or, with `ray`, the most cells in flight. `ray`: None
    or False (local pool), True (a local Ray instance, or the one this process is already connected to) or a
    cluster address. Returns the MatrixResult also written to OUT/matrix.json; `exit_code` 0 (every executed
    cell passed), 1 (a cell failed or crashed, or unverified with `require_verified`). Raises VitedgeError
    (exit 2) on a bad plan or arguments, before anything is written. `exporter`: the ONNX exporter of the cells
    whose plan entry (or `defaults`) names none (None: the default exporter). Works from a plain script, with or
    without an `if __name__ == "__main__":` guard: the local pool's workers never re-run the calling script.
    """
    t0 = time.monotonic()
    if workers is not None and (isinstance(workers, bool) or not isinstance(workers, int) or workers <= 0):
        raise VitedgeError(f"--workers must be a positive integer; got {workers!r}")
    if not resource_timeout > 0:
        raise VitedgeError(f"--resource-timeout must be a positive number of seconds; got {resource_timeout!r}")
    if exporter is not None:
        check_exporter(exporter)
    out = Path(out)
    check_folder_path(out, "--out")  # a file, a read-only disk: exit 2 now, not after the cells ran
    check_folder_path(cache, "--cache")
    if isinstance(plan, dict):
        doc, base, plan_name = plan, Path.cwd(), "<dict>"
    else:
        doc, base, plan_name = read_plan(plan), Path(plan).resolve().parent, str(plan)
    env = Env()
    store = Cache(cache if cache is not None else out / ".cache")
    resolved, memo = _resolve(doc, base, env, store, exporter)
    keys = [cell_key(c, env, bench) for c in resolved.cells]
    result = MatrixResult(plan=plan_name, out=str(out), cache=str(store.root), engine="", skipped=resolved.skipped,
                          require_verified=require_verified, bench=bench, dry_run=dry_run, versions=env.versions)
    if dry_run:
        for c, (k, _, why) in zip(resolved.cells, keys):
            cached = why is None and not rebuild and store.lookup(k) is not None
            result.cells.append(_result(c, "pending", cache_key=k, cached=cached, reason=why))
        result.engine = "dry run"
        return result.finalize()

    if ray:
        from .ray_engine import RayEngine

        engine = RayEngine(ray, resource_timeout, max_inflight=workers)
    else:
        n, threads = size_pool(workers, len(resolved.cells))
        engine = LocalPool(n, threads, out / ".matrix")
    if memo is not None:
        store.put_plan(memo, resolved.to_dict())
    out.mkdir(parents=True, exist_ok=True)
    _Driver(resolved, keys, env, store, out, engine, rebuild, bench, result,
            MatrixProgress(len(resolved.cells), progress)).run()
    result.seconds = round(time.monotonic() - t0, 3)
    result.finalize().write(out)
    return result


def _resolve(doc: dict, base: Path, env: Env, store: Cache, exporter: str | None = None
             ) -> tuple[ResolvedPlan, str | None]:
    """(the resolved plan, the memo key to store it under, or None when it came from the memo)."""
    memo = json_digest({"plan": canonical(doc), "base": str(base), "exporter": exporter or DEFAULT_EXPORTER,
                        **env.common(sorted(env.versions))})
    cached = store.get_plan(memo)
    if cached is None:
        from .resolve import resolve_plan

        return resolve_plan(doc, base, exporter), memo
    resolved = ResolvedPlan.from_dict(cached)
    for c in resolved.cells:  # files can vanish between runs: still exit 2 before any work
        for what, path in (("checkpoint", c.checkpoint), ("labels", c.options.get("labels"))):
            if path and not Path(path).is_file():
                raise PlanError(f"{c.label}: {what} {path} not found; paths are relative to the plan's folder")
    return resolved, None


def _result(c, status: str, **kw) -> CellResult:
    return CellResult(id=c.id, model=c.model, label=c.label, imgsz=c.size, target=c.target, precision=c.precision,
                      trt_arch=c.trt_arch, status=status, path=c.id, **kw)


class _Driver:
    def __init__(self, resolved, keys, env, store, out, engine, rebuild, bench, result, progress):
        self.cells, self.keys, self.store, self.out = resolved.cells, keys, store, out
        self.bases = [base_key(c, env)[0] for c in self.cells]
        self.engine, self.rebuild, self.bench, self.result, self.progress = engine, rebuild, bench, result, progress
        self.results: dict[int, CellResult] = {}
        self.base_refs: dict = {}
        self.twins: dict[int, list[int]] = {}  # a cell built -> the cells with the same key (other labels)
        self.notes: dict[int, str] = {}          # why a cell is rebuilt or re-copied (said in its result)
        self.ray = engine.name == "ray"

    def run(self) -> None:
        todo, first = [], {}
        for i, c in enumerate(self.cells):
            key, _, why = self.keys[i]
            entry = None if (self.rebuild or why) else self.store.lookup(key)
            bad = None if entry is None else self.store.untrusted(key)
            if bad is not None:  # a cached artifact that is not what its report says: never reused
                self.store.drop(key)
                entry = None
                if self.result.require_verified:
                    self.results[i] = _result(c, "failed", cache_key=key, reason=f"the cached cell cannot be "
                                              f"trusted ({bad}) and --require-verified forbids a silent rebuild: "
                                              "run again to rebuild it")
                    continue
                self.notes[i] = f"rebuilt: the cached cell could not be trusted ({bad})"
            if entry is not None:
                self.results[i] = self._from_cache(i, entry)
            elif key in first:  # the same export under another label: built once, copied to both folders
                self.twins[first[key]].append(i)
            else:
                first[key] = i
                self.twins[i] = []
                todo.append(i)
        ready, followers = self._plan_groups(todo)
        if todo:
            self.engine.start()
            self.result.engine = self.engine.describe()
        else:
            self.result.engine = "none (every cell from the cache)"
        cached = len(self.results)
        self.progress.say(f"{len(self.cells)} cells: {cached} from the cache, {len(self.cells) - cached} to build"
                          + (f" on {self.result.engine}" if todo else ""))
        for i in sorted(self.results):
            self.progress.cell(self.results[i])
        self.progress.started_building()
        try:
            while ready or self.engine.running():
                while ready and self.engine.free() > 0:
                    self.engine.submit(ready.pop(0))
                for job, res in self.engine.poll(POLL_S):
                    for i in [job.index, *self.twins[job.index]]:
                        self.results[i] = r = self._done(i, job, res)
                        self.progress.cell(r)
                    if job.build_base:
                        hk = self.bases[job.index]
                        ok = self._base_ready(hk)
                        ready += [self._job(i, "use" if ok else None) for i in followers.pop(hk, [])]
        except BaseException:
            self.engine.stop(interrupted=True)
            raise
        if todo:
            self.engine.stop()
        self.result.cells = [self.results[i] for i in range(len(self.cells))]

    # -- groups and jobs -------------------------------------------------------------------------------
    def _base_ready(self, hk: str) -> bool:
        """The verified base is stored and every file of it re-hashes to what was recorded when it was verified."""
        return (self.store.base_dir(hk) / BASE_META).is_file() and base_untrusted(self.store.base_dir(hk)) is None

    def _plan_groups(self, todo: list[int]):
        groups = defaultdict(list)
        for i in todo:
            groups[self.bases[i]].append(i)
        ready, followers = [], {}
        for hk, members in groups.items():
            if self.rebuild or ((self.store.base_dir(hk) / BASE_META).is_file() and not self._base_ready(hk)):
                shutil.rmtree(self.store.base_dir(hk), ignore_errors=True)  # an untrusted base is rebuilt
            if self._base_ready(hk):
                ready += [self._job(i, "use") for i in members]
                continue
            members.sort(key=lambda i: (_COST.get(self.cells[i].target, 1), i))
            ready.append(self._job(members[0], "build" if len(members) > 1 else None))
            if len(members) > 1:
                followers[hk] = members[1:]
        ready.sort(key=lambda j: not j.build_base)  # base builders first: their groups wait on them
        return ready, followers

    def _job(self, i: int, base: str | None) -> Job:
        c, key, hk = self.cells[i], self.keys[i][0], self.bases[i]
        job = Job(cell=c, key=key, bench=self.bench, index=i, build_base=base == "build")
        if not self.ray:
            job.out = str(self.store.cell_output(key))
            job.base = str(self.store.base_dir(hk)) if base else None
        elif base == "use":
            if hk not in self.base_refs:
                from .folders import pack

                self.base_refs[hk] = self.engine.ray.put(pack(self.store.base_dir(hk)))
            job.base_blob = self.base_refs[hk]
        return job

    # -- results ---------------------------------------------------------------------------------------
    def _from_cache(self, i: int, entry: dict) -> CellResult:
        c, key = self.cells[i], self.keys[i][0]
        dest = self.out / c.id
        reason = entry.get("reason")
        if current_key(dest) != key:
            held = (dest / KEY_FILE).read_text().strip() if (dest / KEY_FILE).is_file() else None
            why = untrusted(dest) if held == key else None
            materialize(self.store.cell_output(key), dest, key)
            if why:  # the copy in DIR was changed after it was written: replaced by the verified cache entry
                reason = "; ".join(filter(None, [reason, f"re-copied from the cache: the copy in {c.id} {why}"]))
        report = _read_report(dest)
        return _result(c, entry["status"], reason=reason, cache_key=key, from_cache=True,
                       report_path=f"{c.id}/report.json", worst=worst_metric(report),
                       bytes=artifact_bytes(report, c), latency=entry.get("latency"), seconds=entry.get("seconds"),
                       node=entry.get("node"), report=report)

    def _done(self, i: int, job: Job, res: dict) -> CellResult:
        """Record the result of `job` for cell `i` (the job's own cell first, then its twins)."""
        c = self.cells[i]
        key, inputs, uncacheable = self.keys[i]
        dest, staged = self.out / c.id, self.store.cell_output(key)
        last = i == ([job.index, *self.twins[job.index]][-1])  # the cache entry is dropped after the last copy
        if self.ray and i == job.index:
            if res.get("base_blob") and not self._base_ready(self.bases[i]):
                unpack(res["base_blob"], self.store.base_dir(self.bases[i]))
            if res.get("cell_blob"):
                unpack(res["cell_blob"], staged)
        extra = {"cache_key": key, "seconds": res.get("seconds"), "latency": res.get("latency"),
                 "node": res.get("node"), "resources": resources_for(c) if self.ray else None}
        report, status, reason = res.get("report"), res["status"], res.get("reason")
        if report is None:  # crashed, refused, or never ran (cluster without its resources)
            if last:
                self.store.drop(key)
            tb = None
            if res.get("traceback"):
                write_error(dest, res["traceback"])
                tb = f"{c.id}/{TRACEBACK}"
            return _result(c, status, reason=reason, traceback=tb, **extra)
        mismatch = trt_mismatch(c, inputs, report)
        if mismatch:
            status, reason = "failed", f"engine does not match its cell: {mismatch}"
        drift = toolchain_drift(inputs, report)
        if status == "passed":
            reason = drift or uncacheable
        if i in self.notes:
            reason = "; ".join(filter(None, [self.notes[i], reason]))
        if i == job.index:
            self.store.record(key, {"status": status, "reason": reason, "cell": c.to_dict(), "inputs": inputs,
                                    "seconds": res.get("seconds"), "latency": res.get("latency"),
                                    "node": res.get("node")})
        materialize(staged, dest, key)
        if last and (status != "passed" or uncacheable or drift):
            self.store.drop(key)  # never reused as passed (nor an unpinned TensorRT build, nor another toolchain's)
        report = {**report, "out_dir": str(dest)}
        return _result(c, status, reason=reason, report_path=f"{c.id}/report.json",
                       worst=worst_metric(report), bytes=artifact_bytes(report, c), report=report, **extra)


def _read_report(folder: Path) -> dict | None:
    import json

    try:
        return json.loads((folder / "report.json").read_text())
    except (OSError, ValueError):
        return None
