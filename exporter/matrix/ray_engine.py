"""Cells as Ray tasks, on a local Ray instance (`--ray`) or an existing cluster (`--ray ADDRESS`).

Each cell declares what it needs (`resources_for`): 1 CPU; a TensorRT cell `GPU: 1` plus its plan's GPU
architecture label (`trt_arch: [sm_80]` -> custom resource `sm_80`); a CoreML cell with `coreml_mode: device`
the custom resource `macos`. Labels are requested as a small fraction (LABEL_SHARE), so they act as tags:
`ray start --num-gpus=1 --resources='{"sm_80": 1}'` on a GPU node, `ray start --resources='{"macos": 1}'`
on a Mac. Ray keeps a task that no node can take pending for ever, so the engine checks feasibility itself
(`ray.nodes()`): a cell whose resources no live node has, for `resource_timeout` seconds (before submission or
while pending), is cancelled and reported "unverified" with the missing resource named. It never hangs.

Workers need not share a filesystem with the driver: a task receives its checkpoint and labels file as bytes,
exports into its own temporary folder and returns it packed (with the verified base it built, if any) through Ray's
object store; the driver alone writes the cache and DIR. Verified bases go to the group's other cells the same
way (one `ray.put` per base, per checkpoint).
"""
from __future__ import annotations

import os
import tempfile
import time
from pathlib import Path

from ...errors import VitedgeError
from .engines import Job, crashed
from .plan import Cell

LABEL_SHARE = 0.01   # fraction of a custom label a cell requests (labels are tags, not capacities)


def resources_for(cell: Cell) -> dict:
    """Ray resources a cell needs, as its target's row declares them: {"CPU": 1} plus the row's whole resources
    ({"GPU": 1}) and its labels for this cell ("sm_80", "macos"), each at LABEL_SHARE."""
    from ...targets import row_of

    row = row_of(cell.target)
    need = {"CPU": 1.0, **{k: float(v) for k, v in row.ray_resources.items()}}
    for label in row.ray_labels(cell) if row.ray_labels else ():
        need[label] = LABEL_SHARE
    return need


def missing_resources(need: dict, nodes: list[dict]) -> str | None:
    """None if a live node has every resource of `need`, else what is missing (one line)."""
    alive = [n.get("Resources") or {} for n in nodes if n.get("Alive")]
    if any(all(r.get(k, 0) >= v for k, v in need.items()) for r in alive):
        return None
    absent = [k for k, v in need.items() if not any(r.get(k, 0) >= v for r in alive)]
    if absent:
        return f"no live node of the Ray cluster has {', '.join(absent)}"
    return f"no single live node has all of {', '.join(need)}"


def ray_cell(cell: dict, base_blob: bytes | None, build_base: bool, bench: bool, threads: int,
             checkpoint: bytes | None = None, labels: bytes | None = None) -> dict:
    """The Ray task: run the cell in a temporary folder and return the result with the folder packed (and the
    verified base it built when `build_base`: the first cell of its model and size). The checkpoint and labels
    files come as bytes (the driver's paths need not exist on this node)."""
    from .cell import configure_threads, run_cell
    from .folders import pack, unpack

    configure_threads(threads)
    with tempfile.TemporaryDirectory(prefix="vitedge-cell-") as d:
        out, base = Path(d) / "cell", Path(d) / "base"
        if checkpoint is not None:
            path = Path(d) / ("checkpoint" + Path(cell["checkpoint"]).suffix)
            path.write_bytes(checkpoint)
            cell = {**cell, "checkpoint": str(path)}
        if labels is not None:
            path = Path(d) / "labels.txt"
            path.write_bytes(labels)
            cell = {**cell, "options": {**cell["options"], "labels": str(path)}}
        if base_blob is not None:
            unpack(base_blob, base)
        result = run_cell(cell, str(out), str(base) if base_blob is not None or build_base else None, bench)
        result["cell_blob"] = pack(out) if out.is_dir() else None
        result["base_blob"] = pack(base) if build_base and result.get("base_stored") else None
    result["node"] = os.uname().nodename
    return result


class RayEngine:
    name = "ray"

    def __init__(self, address: str | bool | None, resource_timeout: float, max_inflight: int | None = None):
        try:
            import ray
        except ImportError:
            raise VitedgeError("--ray needs Ray: pip install 'vitedge[ray]'") from None
        self.ray, self.address, self.timeout = ray, address, resource_timeout
        self.max_inflight = max_inflight
        self.owned = False
        self.inflight: dict = {}   # ObjectRef -> (job, resources)
        self.waiting: list = []    # [job, resources, since]: not submitted, no node can take it yet
        self.blocked: dict = {}    # ObjectRef -> since: submitted, but no live node can take it any more
        self._nodes, self._nodes_at = [], 0.0
        self._files: dict = {}     # driver path -> ObjectRef of its bytes (checkpoints, labels: put once)

    def describe(self) -> str:
        where = "existing cluster " + str(self.address) if isinstance(self.address, str) else "local instance"
        cpus = int(self.ray.cluster_resources().get("CPU", 0))
        return f"Ray ({where}, {len(self.nodes())} node(s), {cpus} CPU)"

    def start(self) -> None:
        ray = self.ray
        if not ray.is_initialized():
            address = self.address if isinstance(self.address, str) else "local"
            try:
                ray.init(address=address, include_dashboard=False, log_to_driver=False,
                         logging_level="WARNING", configure_logging=True)
            except (ConnectionError, ValueError, RuntimeError) as e:
                first = (str(e).strip().splitlines() or [type(e).__name__])[0]
                raise VitedgeError(f"cannot connect to the Ray cluster at {address} ({first}); check --ray ADDRESS "
                                   "(e.g. HEAD_IP:6379) or start one with `ray start --head`") from None
            self.owned = True
        self.task = ray.remote(ray_cell)

    def nodes(self) -> list[dict]:
        if time.monotonic() - self._nodes_at > 0.5:  # one GCS query per poll round at most
            self._nodes, self._nodes_at = self.ray.nodes(), time.monotonic()
        return self._nodes

    def free(self) -> int:
        if self.max_inflight is None:
            return 1 << 30
        return max(0, self.max_inflight - len(self.inflight) - len(self.waiting))

    def running(self) -> int:
        return len(self.inflight) + len(self.waiting)

    def submit(self, job: Job) -> None:
        self.waiting.append([job, resources_for(job.cell), time.monotonic()])
        self._launch()

    def _launch(self) -> None:
        for item in list(self.waiting):
            job, need, _ = item
            if missing_resources(need, self.nodes()) is None:
                self.waiting.remove(item)
                custom = {k: v for k, v in need.items() if k not in ("CPU", "GPU")}
                args = (job.cell.to_dict(), job.base_blob, job.build_base, job.bench, 1,
                        self._file(job.cell.checkpoint), self._file(job.cell.options.get("labels")))
                ref = self.task.options(num_cpus=need["CPU"], num_gpus=need.get("GPU", 0), resources=custom,
                                        max_retries=0).remote(*args)
                self.inflight[ref] = (job, need)

    def _file(self, path: str | None):
        if path is None:
            return None
        if path not in self._files:
            self._files[path] = self.ray.put(Path(path).read_bytes())
        return self._files[path]

    def _unverified(self, why: str, waited: float) -> dict:
        return {"status": "unverified", "reason": f"{why} (waited {waited:.0f} s, --resource-timeout "
                                                  f"{self.timeout:g}); the cell did not run",
                "report": None, "traceback": None, "latency": None, "base_stored": False, "seconds": None}

    def poll(self, timeout: float) -> list[tuple[Job, dict]]:
        ray, done, now = self.ray, [], time.monotonic()
        self._launch()
        for item in list(self.waiting):
            job, need, since = item
            if now - since >= self.timeout:
                self.waiting.remove(item)
                done.append((job, self._unverified(missing_resources(need, self.nodes()), now - since)))
        refs = list(self.inflight)
        if not refs:
            if not done:
                time.sleep(min(timeout, 0.2))
            return done
        ready, _ = ray.wait(refs, num_returns=1, timeout=timeout)
        if ready:
            ready, _ = ray.wait(refs, num_returns=len(refs), timeout=0)
        for ref in ready:
            job, _ = self.inflight.pop(ref)
            self.blocked.pop(ref, None)
            try:
                done.append((job, ray.get(ref)))
            except ray.exceptions.TaskCancelledError:
                done.append((job, crashed("the Ray task was cancelled")))
            except ray.exceptions.RayError as e:  # a crashed worker or node: this cell only
                first = (str(e).strip().splitlines() or [type(e).__name__])[0]
                done.append((job, crashed(f"the Ray task failed: {type(e).__name__}: {first}")))
        self._check_blocked(done)
        return done

    def _check_blocked(self, done: list) -> None:
        """A pending task whose resources left the cluster (a node died) is cancelled after the timeout."""
        now = time.monotonic()
        for ref, (job, need) in list(self.inflight.items()):
            why = missing_resources(need, self.nodes())
            if why is None:
                self.blocked.pop(ref, None)
                continue
            since = self.blocked.setdefault(ref, now)
            if now - since >= self.timeout:
                self.ray.cancel(ref, force=True)
                del self.inflight[ref], self.blocked[ref]
                done.append((job, self._unverified(why, now - since)))

    def stop(self, interrupted: bool = False) -> None:
        for ref in list(self.inflight):
            try:
                self.ray.cancel(ref, force=True)
            except Exception:  # noqa: BLE001  (already finished or gone: nothing to stop)
                pass
        self.inflight.clear()
        self.waiting.clear()
        if self.owned:
            self.ray.shutdown()
