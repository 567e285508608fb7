"""The prediction ledger: what the plan predicted against what training observed, per iteration.

A plan is only as good as its costs. During training the executor records
when every action started and ended (``ActionRecord``); the ledger compares
that, each iteration, with what the plan predicts for the same work:

- ``task``: each compute task (mean over micro-batches): its plan duration
  against the time it ran;
- ``collective``: each All-to-All task (mean over micro-batches): predicted is
  its task duration, observed the time from issue to completion, with the part
  the training thread waited for (``exposed_us``);
- ``stage``: each virtual stage's forward or backward chunk (mean over
  micro-batches): the summed compute time of its tasks;
- ``split``: per iteration, what the backward split cost: the training
  thread's CPU time in forward, dgrad and wgrad tasks and in the runtime, and
  how many weight operations took a dedicated split or the general path;
- ``pair``: each forward/backward pair that meets on this rank (a forward
  chunk whose backward partner is the next chunk in program order, or whose
  tasks interleave with it): the time from its first task's start to its last
  task's end, less any time spent waiting for another stage's transfer (a
  pipeline bubble is not the pair's cost). Predicted: the same span on the
  program's static timeline, tasks at their plan durations on two streams
  (compute, communication), cross-stream waits as the program has them.

Per iteration it reports the mean and p95 of the relative error
``|observed - predicted| / predicted`` over those rows, and flags re-planning
when the mean error has stayed above ``threshold`` for ``window`` iterations
in a row: the profile the plan was built from is stale (new kernels, shapes,
routing). Rows are written as JSON lines, each with the hardware the plan was
costed for; ``tessera-compile --ledger`` folds them into the report, takes the
observed task durations as the tasks' isolated durations, and re-prices the
pairs they measured (by their layer names, which the rows carry).
"""

from __future__ import annotations

import json
import math
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from runtime.bytecode import Collective, Op, Stream

FORMAT = "tessera-ledger/1"


def _phase(kind: str) -> str:
    return kind.rpartition(".")[2]


@dataclass
class _Unit:
    """The compute tasks of one chunk (direction, virtual stage, micro-batch) in a program."""

    direction: str
    stage: int
    mb: int
    instrs: list[int] = field(default_factory=list)

    @property
    def first(self) -> int:
        return self.instrs[0]

    @property
    def last(self) -> int:
        return self.instrs[-1]


def static_timeline(program: Any) -> dict[int, tuple[float, float]]:
    """(start, end) in µs of every instruction that does work, tasks at their plan durations.

    The compute stream runs RUN and DEFER (a deferred task counted where it is
    offered), the comm stream All-to-Alls; a WAIT holds the compute stream
    until its target ends. Transfers and gradient reductions take no time
    here: their cost is another stage's or the network's, which a rank's plan
    does not predict.
    """
    tasks = program.tasks
    clock = {Stream.COMPUTE: 0.0, Stream.COMM: 0.0}
    span: dict[int, tuple[float, float]] = {}
    for i, ins in enumerate(program.instructions):
        op = Op(ins.op)
        if op in (Op.RUN, Op.DEFER):
            start = clock[Stream.COMPUTE]
            end = start + float(tasks[ins.a].duration_us)
            clock[Stream.COMPUTE] = end
            span[i] = (start, end)
        elif op == Op.COLLECTIVE and ins.aux == Collective.ALL_TO_ALL:
            start = max(clock[Stream.COMM], clock[Stream.COMPUTE])
            end = start + float(tasks[ins.a].duration_us)
            clock[Stream.COMM] = end
            span[i] = (start, end)
        elif op in (Op.SEND, Op.RECV, Op.COLLECTIVE):
            span[i] = (clock[Stream.COMPUTE], clock[Stream.COMPUTE])
        elif op == Op.WAIT and ins.a in span:
            clock[Stream(ins.stream)] = max(clock[Stream(ins.stream)], span[ins.a][1])
    return span


def program_units(program: Any, stage_of: dict[str, int]) -> list[_Unit]:
    """The chunks of a program in order of their first task (weight gradients left out: they move)."""
    tasks = program.tasks
    units: dict[tuple[str, int, int], _Unit] = {}
    for i, ins in enumerate(program.instructions):
        if ins.op != Op.RUN:
            continue
        t = tasks[ins.a]
        phase = _phase(t.kind)
        if phase == "wgrad":
            continue
        key = ("fwd" if phase == "fwd" else "bwd", stage_of[t.layer], int(ins.mb))
        units.setdefault(key, _Unit(*key)).instrs.append(i)
    return sorted(units.values(), key=lambda u: u.first)


def program_pairs(units: Sequence[_Unit]) -> list[tuple[_Unit, _Unit]]:
    """(forward, backward) chunks that meet: interleaved, or the backward right after the forward."""
    pairs = []
    for a, b in zip(units, units[1:]):
        if a.direction == "fwd" and b.direction == "bwd":
            pairs.append((a, b))
    for i, a in enumerate(units):  # interleaved chunks that are not neighbours in the order of first tasks
        for b in units[i + 2 :]:
            if b.first > a.last:
                break
            if {a.direction, b.direction} == {"fwd", "bwd"}:
                pair = (a, b) if a.direction == "fwd" else (b, a)
                if pair not in pairs:
                    pairs.append(pair)
    return pairs


def relative_error(predicted: float, observed: float) -> float | None:
    if predicted <= 0 or not math.isfinite(predicted) or not math.isfinite(observed):
        return None
    return abs(observed - predicted) / predicted


def p95(values: Sequence[float]) -> float:
    ordered = sorted(values)
    if not ordered:
        return 0.0
    return ordered[min(len(ordered) - 1, math.ceil(0.95 * len(ordered)) - 1)]


@dataclass
class IterationSummary:
    iteration: int
    rows: int
    mean_abs_error: float
    p95_abs_error: float
    replan: bool


class PredictionLedger:
    """Observed against predicted for one rank, iteration after iteration."""

    def __init__(
        self,
        program: Any,
        stage_layers: Sequence[Sequence[str]],
        rank: int,
        *,
        threshold: float = 0.25,
        window: int = 3,
    ):
        self.program = program
        self.tasks = program.tasks
        self.rank = rank
        self.stage_layers = [list(s) for s in stage_layers]
        self.stage_of = {layer: s for s, layers in enumerate(self.stage_layers) for layer in layers}
        self.threshold, self.window = threshold, window
        plan = program.plan
        # What the observed times depend on besides the hardware: a planner folds them only into the same settings.
        self.settings = {name: getattr(plan, name) for name in ("model", "ep", "tp", "micro_batch_size", "seq_len", "dtype")}
        self.timeline = static_timeline(program)
        self.units = program_units(program, self.stage_of)
        self.pairs = program_pairs(self.units)
        self.rows: list[dict[str, Any]] = []
        self.summaries: list[IterationSummary] = []
        self._above = 0

    @classmethod
    def for_executor(cls, executor: Any, **kwargs: Any) -> PredictionLedger:
        return cls(executor.program, executor.layout.stage_layers, executor.par.rank, **kwargs)

    # ------------------------------------------------------------ recording

    def record(self, iteration: int, result: Any) -> IterationSummary:
        """Add one iteration's rows (``result`` is the executor's ``IterationResult``)."""
        by_action = {r.action: r for r in result.records}
        rows = (self._task_rows(result.records) + self._collective_rows(result.records) + self._stage_rows(by_action)
                + self._pair_rows(result.records, by_action))
        errors = []
        hardware = str(self.program.plan.hardware)
        for row in rows:
            row.update({"format": FORMAT, "iteration": iteration, "rank": self.rank, "hardware": hardware,
                        "settings": self.settings})
            err = relative_error(row["predicted_us"], row["observed_us"])
            row["error"] = err
            if err is not None:
                errors.append(err)
        mean = sum(errors) / len(errors) if errors else 0.0
        self._above = self._above + 1 if mean > self.threshold else 0
        summary = IterationSummary(iteration, len(rows), mean, p95(errors), self._above >= self.window)
        self.rows.extend(rows)
        self.rows.append({
            "format": FORMAT, "kind": "summary", "iteration": iteration, "rank": self.rank, "hardware": hardware,
            "settings": self.settings, "rows": len(rows),
            "mean_abs_error": mean, "p95_abs_error": summary.p95_abs_error, "replan": summary.replan,
            "threshold": self.threshold, "window": self.window,
        })
        self.rows.extend(self._split_rows(iteration, result, hardware))
        self.summaries.append(summary)
        return summary

    def _split_rows(self, iteration: int, result: Any, hardware: str) -> list[dict[str, Any]]:
        """What the backward split cost this iteration: the training thread's CPU per phase, and how ops were split.

        ``cpu_us``: forward, dgrad and wgrad tasks, the transfer and collective calls
        (``comm``: issue and wait) and the rest (the runtime's own), summed over the iteration; ``dedicated_ops``/``general_ops``:
        weight operations split by a dedicated rule or by the general path
        (``runtime.backward_split``). No prediction: the plan costs tasks, not phases.
        """
        cpu = getattr(result, "cpu_ns", None) or {}
        if not cpu:
            return []
        counters = result.counters
        return [{
            "format": FORMAT, "kind": "split", "name": "backward split", "iteration": iteration, "rank": self.rank,
            "hardware": hardware, "settings": self.settings,
            "cpu_us": {phase: cpu[phase] / 1e3 for phase in ("fwd", "dgrad", "wgrad", "comm", "other", "total") if phase in cpu},
            "dedicated_ops": int(counters.get("split_dedicated_ops", 0)),
            "general_ops": int(counters.get("split_general_ops", 0)),
            "wgrad_tasks": int(counters.get("wgrad_run", 0)),
        }]

    def _task_rows(self, records: Iterable[Any]) -> list[dict[str, Any]]:
        times: dict[int, list[float]] = {}
        for r in records:
            if r.kind == "run":
                times.setdefault(r.task, []).append((r.end_ns - r.start_ns - r.blocked_ns) / 1e3)
        rows = []
        for task, values in sorted(times.items()):
            t = self.tasks[task]
            rows.append({
                "kind": "task", "name": t.name, "layers": [t.layer], "stage": self.stage_of[t.layer],
                "predicted_us": float(t.duration_us), "observed_us": sum(values) / len(values), "samples": len(values),
            })
        return rows

    def _collective_rows(self, records: Iterable[Any]) -> list[dict[str, Any]]:
        spans: dict[int, list[tuple[float, float]]] = {}
        for r in records:
            if r.kind == "all_to_all":
                spans.setdefault(r.task, []).append(((r.end_ns - r.start_ns) / 1e3, r.blocked_ns / 1e3))
        rows = []
        for task, values in sorted(spans.items()):
            t = self.tasks[task]
            rows.append({
                "kind": "collective", "name": t.name, "layers": [t.layer], "stage": self.stage_of[t.layer],
                "predicted_us": float(t.duration_us),
                "observed_us": sum(v[0] for v in values) / len(values),
                "exposed_us": sum(v[1] for v in values) / len(values),
                "samples": len(values),
            })
        return rows

    def _stage_rows(self, by_action: dict[int, Any]) -> list[dict[str, Any]]:
        sums: dict[tuple[str, int], list[tuple[float, float]]] = {}
        for unit in self.units:
            observed = predicted = 0.0
            seen = False
            for i in unit.instrs:
                r = by_action.get(i)
                if r is None:
                    continue
                seen = True
                observed += (r.end_ns - r.start_ns - r.blocked_ns) / 1e3
                predicted += float(self.tasks[self.program.instructions[i].a].duration_us)
            if seen:
                sums.setdefault((unit.direction, unit.stage), []).append((predicted, observed))
        rows = []
        for (direction, stage), values in sorted(sums.items(), key=lambda kv: (kv[0][1], kv[0][0])):
            rows.append({
                "kind": "stage", "name": f"stage {stage} {direction}", "stage": stage, "direction": direction,
                "layers": self.stage_layers[stage],
                "predicted_us": sum(v[0] for v in values) / len(values),
                "observed_us": sum(v[1] for v in values) / len(values),
                "samples": len(values),
            })
        return rows

    def _pair_rows(self, records: Sequence[Any], by_action: dict[int, Any]) -> list[dict[str, Any]]:
        bubbles = [(r.start_ns, r.end_ns, r.blocked_ns) for r in records if r.kind in ("send", "recv") and r.blocked_ns]
        groups: dict[tuple[int, int], list[tuple[float, float]]] = {}
        for fwd, bwd in self.pairs:
            instrs = fwd.instrs + bwd.instrs
            observed_records = [by_action[i] for i in instrs if i in by_action]
            if len(observed_records) != len(instrs):
                continue
            begin = min(r.start_ns for r in observed_records)
            end = max(r.end_ns for r in observed_records)
            waited = sum(blocked for start, stop, blocked in bubbles if begin <= stop and start <= end)
            observed = max(0.0, (end - begin - waited) / 1e3)
            spans = [self.timeline[i] for i in instrs]
            predicted = max(s[1] for s in spans) - min(s[0] for s in spans)
            groups.setdefault((fwd.stage, bwd.stage), []).append((predicted, observed))
        rows = []
        for (fs, bs), values in sorted(groups.items()):
            rows.append({
                "kind": "pair", "name": f"pair fwd {fs} / bwd {bs}", "fwd_stage": fs, "bwd_stage": bs,
                "fwd_layers": self.stage_layers[fs], "bwd_layers": self.stage_layers[bs],
                "predicted_us": sum(v[0] for v in values) / len(values),
                "observed_us": sum(v[1] for v in values) / len(values),
                "samples": len(values),
            })
        return rows

    # ------------------------------------------------------------ output

    @staticmethod
    def write(path: str | Path, rows: Iterable[dict[str, Any]]) -> None:
        """Write rows as JSON lines (atomically: a failed write leaves no partial file)."""
        target = Path(path)
        tmp = target.with_name(target.name + ".tmp")
        with tmp.open("w") as out:
            for row in rows:
                out.write(json.dumps(row, sort_keys=True) + "\n")
        tmp.replace(target)


def read_ledger(path: str | Path) -> list[dict[str, Any]]:
    """The rows of a ledger file; a line that is not a ledger row is refused naming its line."""
    rows = []
    for n, line in enumerate(Path(path).read_text().splitlines(), start=1):
        if not line.strip():
            continue
        try:
            row = json.loads(line)
        except json.JSONDecodeError as err:
            raise ValueError(f"{path}:{n}: not JSON ({err.msg})") from None
        if not isinstance(row, dict) or row.get("format") != FORMAT or "kind" not in row:
            raise ValueError(f"{path}:{n}: not a row of a Tessera ledger ({FORMAT})")
        rows.append(row)
    return rows


def summarize(rows: Iterable[dict[str, Any]]) -> dict[str, Any]:
    """Per kind (task, pair, stage, collective): rows, mean and p95 relative error; whether any rank flagged re-planning."""
    errors: dict[str, list[float]] = {}
    replan = False
    for row in rows:
        if row["kind"] == "summary":
            replan = replan or bool(row.get("replan"))
        elif row.get("error") is not None:
            errors.setdefault(row["kind"], []).append(float(row["error"]))
    return {
        "kinds": {k: {"rows": len(v), "mean_abs_error": sum(v) / len(v), "p95_abs_error": p95(v)} for k, v in sorted(errors.items())},
        "replan": replan,
    }
