"""The ``refine-bottleneck`` pass: exact schedules for the pairs that set each device's worst cost.

The partition only cares about the worst pair on each device. After it is chosen, this pass
re-schedules those pairs with CP-SAT (``scheduling.exact``, one deterministic worker,
``time-limit`` deterministic seconds per pair, the current schedule as the starting point),
keeps the better schedule, and re-runs the partition (``partitioning.plan.choose_partition``)
if a pair's cost changed, since another partition may now be better. The pairs that set the
new partition's bottleneck are refined in turn, up to ``rounds`` times.

Before: a planned module (``candidates, overlap-schedule, profile, partition``). After::

    plan pair_schedule @sched.41 {..., makespan = 21293.6, method = "exact", proven_bound = 21293.6,
                                  refined = "optimal", status = "optimal", ...} { ... }
    plan partition @partition {..., bottleneck_us = 21904.2, refined_from_us = 22310.7,
                               refined_pairs = 3, refined_proven = 3, refined_rounds = 1, ...}

- A refined ``pair_schedule`` records what the solver proved: ``refined`` is ``optimal``
  (no schedule of the pair is shorter, within CP-SAT's rounding to nanoseconds), ``feasible``
  or ``timeout`` (not proven; ``proven_bound`` is the best lower bound it proved), whether or
  not the schedule changed; ``method`` becomes ``exact`` only when it did.
- Pairs sharing a changed schedule get its new ``makespan``; with an analytic profile
  (``profile_mode = "analytic"``) their ``post_overlap_us``, ``serial_us`` and ``overlap_us``
  are re-timed by the contention model as ``profile`` does. Measured costs cannot be redone
  here: a changed schedule of a measured pair is an error that says so.
- The partition op keeps its figures for the final partition and adds ``refined_from_us`` (the
  bottleneck before refinement), ``refined_pairs`` (schedules refined), ``refined_proven``
  (of those, proven optimal) and ``refined_rounds``. ``refined_from_us - bottleneck_us`` is
  how much the bottleneck moved; it is 0 when the heuristic's schedules of the bottleneck
  pairs were already optimal.

The partition is re-run with the search and solver the partition op records and its memory
capacity; ``wgrad-headroom``, ``reserved-gib`` and ``partition-time-limit`` must match the
options the ``partition`` pass ran with (they are not recorded in the IR; the defaults match).
"""

from __future__ import annotations

from dataclasses import dataclass

from passes.costs.contention import ContentionParams
from passes.costs.pair_costs import analytic_cost, contended_tasks
from passes.manager import ModulePass, PassError, note_time, option
from passes.partitioning.memory import GIB
from passes.partitioning.plan import PartitionSettings, choose_partition
from passes.plan_view import PlanView
from passes.scheduling.check import check_schedule, entries_of
from passes.scheduling.exact import exact
from passes.scheduling.schedule import EPS, PairSchedule, schedule_op
from tessera_ir.errors import TesseraError
from tessera_ir.model import Module, PlanOp, Value
from tessera_ir.plan_ops import PairScheduleOp
from tessera_ir.run_settings import RunSettings

# Plan ops derived from the partition, which a re-partition would leave stale.
LATER_OPS = ("dbo_slot", "dbo_pool", "program")


@dataclass(frozen=True)
class RefineBottleneckPass(ModulePass):
    name = "refine-bottleneck"
    summary = "Re-schedule with CP-SAT the pairs that set each device's worst cost; re-partition if a cost changed."
    requires = ("partition", "pair_schedule")

    time_limit: float = option(10.0, "CP-SAT deterministic seconds per refined pair")
    near: float = option(0.0, "also refine pairs within this fraction of their device's worst cost (0: only the worst)")
    rounds: int = option(3, "refine, re-partition and refine the new bottleneck pairs at most this many times")
    partition_time_limit: float = option(60.0, "re-partition: as the partition pass's time-limit (seconds per MILP)")

    def check(self) -> None:
        if self.time_limit <= 0:
            raise PassError(f"refine-bottleneck: time-limit must be positive, got {self.time_limit}")
        if not 0.0 <= self.near < 1.0:
            raise PassError(f"refine-bottleneck: near is a fraction in [0, 1), got {self.near}")
        if self.rounds < 1:
            raise PassError(f"refine-bottleneck: rounds must be at least 1, got {self.rounds}")
        if self.partition_time_limit <= 0:
            raise PassError(f"refine-bottleneck: partition-time-limit must be positive, got {self.partition_time_limit}")

    def apply(self, module: Module) -> bool:
        view = PlanView(module)
        part = view.partition
        if part is None:
            raise PassError("refine-bottleneck: the module holds no partition; run the planning passes (…, partition) first")
        later = sorted({op.op for op in module.plan if op.op in LATER_OPS})
        if later:
            raise PassError(
                f"refine-bottleneck: the module already holds {', '.join(later)} ops, which a new partition would "
                "invalidate; run refine-bottleneck right after partition"
            )
        before = part.op.attrs.get("bottleneck_us")
        start_us = float(before) if isinstance(before, (int, float)) else None
        refined: dict[str, str] = {}  # schedule op name -> proof status
        rounds = 0
        try:
            while rounds < self.rounds:
                targets = [s for s in self._bottleneck_schedules(view) if s.name not in refined]
                if not targets:
                    break
                rounds += 1
                changed = [op for op in targets if self._refine(module, view, op, refined)]
                if not changed:
                    break
                view = PlanView(module)  # costs changed: read them afresh
                old = view.partition
                assert old is not None
                settings, capacity = self._settings(old.op, view)
                new = choose_partition(
                    module, view.parallel, view.candidate_table(), view.duration, capacity, settings, note_time
                )
                module.plan[module.plan.index(old.op)] = new
                view = PlanView(module)
        except TesseraError as err:
            raise PassError(f"refine-bottleneck: {err}") from None
        final = view.partition
        assert final is not None
        final.op.attrs.update(
            refined_from_us=start_us if start_us is not None else final.op.attrs.get("bottleneck_us", 0.0),
            refined_pairs=len(refined),
            refined_proven=sum(status == "optimal" for status in refined.values()),
            refined_rounds=rounds,
        )
        return True

    def _bottleneck_schedules(self, view: PlanView) -> list[PlanOp]:
        """The schedule ops of the pairs at (or within ``near`` of) each device's worst cost, in plan order."""
        names: set[str] = set()
        for device, meetings in sorted(view.meetings().items()):
            costed = [(m.pair, m.pair.cost()) for m in meetings if m.pair is not None]
            costs = [(pair, c[0]) for pair, c in costed if c is not None]
            if not costs:
                continue
            worst = max(c for _, c in costs)
            for pair, cost in costs:
                if cost >= worst * (1.0 - self.near) - EPS:
                    if pair.schedule is None:
                        raise PassError(
                            f"refine-bottleneck: pair @{pair.name} (device {device}) has no schedule; "
                            "run overlap-schedule before partition"
                        )
                    names.add(pair.schedule.name)
        return [op for op in view.module.plan if op.op == "pair_schedule" and op.name in names]

    def _refine(self, module: Module, view: PlanView, op: PlanOp, refined: dict[str, str]) -> bool:
        """Solve one schedule's DAG exactly and keep the shorter schedule; True if the op changed.

        The partition reads the post-overlap cost, which re-times the schedule under contention:
        a shorter makespan could in principle cost more there, so a new schedule that does is
        not kept (the op still records the proof)."""
        read = view.schedule(op.name)
        dag = view.pair_dag(view.pair(read.dag.name))  # the plan's durations, as overlap-schedule used
        current = PairSchedule(dag, read.start, read.method, read.status)
        result = exact(dag, self.time_limit, "cpsat", upper_bound=current)
        refined[op.name] = result.status
        proof: dict[str, Value] = {"refined": result.status}
        if result.bound is not None:
            proof["proven_bound"] = result.bound
        op.attrs.update(proof)
        if not result.makespan < current.makespan - EPS * max(1.0, current.makespan):
            return False
        verified = op.attrs.get("verified") is True
        check_schedule(dag, entries_of(result), f"pair_schedule @{op.name}", prove=verified)
        pairs = PairScheduleOp(op).pairs  # the pairs it serves, as its declaration reads them
        new = schedule_op(result, op.name, pairs, verified)
        new.attrs.update(proof)
        kept_attrs, kept_entries = dict(op.attrs), list(op.entries)
        kept_costs = {p.name: dict(p.op.attrs) for p in view.pairs if p.schedule is op}
        op.attrs.clear()
        op.attrs.update(new.attrs)
        op.entries[:] = new.entries
        if self._recost(module, kept_costs):
            return True
        op.attrs.clear()
        op.attrs.update(kept_attrs)
        op.entries[:] = kept_entries
        op.attrs.update(proof)
        for p in view.pairs:
            if p.name in kept_costs:
                p.op.attrs.clear()
                p.op.attrs.update(kept_costs[p.name])
        return False

    @staticmethod
    def _recost(module: Module, pairs: dict[str, dict]) -> bool:
        """New makespan (and, under an analytic profile, post-overlap cost) of the ``pairs`` whose
        schedule just changed; False if the post-overlap cost of any got worse."""
        view = PlanView(module)
        analytic = module.attrs.get("profile_mode") == "analytic"
        contention = ContentionParams.from_hardware(view.hardware, view.parallel.ep)
        better = True
        for name, old in pairs.items():
            pair = view.pair(name)
            assert pair.schedule is not None
            pair.op.attrs["makespan"] = pair.schedule.attrs["makespan"]
            if "post_overlap_us" not in pair.op.attrs:
                continue
            if not analytic:
                raise PassError(
                    f"refine-bottleneck: pair @{name} has a shorter exact schedule but its cost was "
                    f"{pair.op.attrs.get('cost_source', 'measured')}; refine before a measured profile, or profile "
                    "analytically (profile{mode=analytic})"
                )
            tasks = contended_tasks(view.scheduled_tasks(pair), view.duration, view.utilisation)
            contended, free = analytic_cost(tasks, contention)
            pair.op.attrs.update(
                post_overlap_us=contended.makespan, serial_us=contended.isolated_sum, overlap_us=free.makespan
            )
            previous = old.get("post_overlap_us")
            if isinstance(previous, (int, float)) and contended.makespan > previous + EPS * max(1.0, previous):
                better = False
        return better

    def _settings(self, op: PlanOp, view: PlanView) -> tuple[PartitionSettings, float]:
        """The partition's search settings and capacity (GiB), as the partition op records them, with
        the memory reservations the module header sets (the partition planned with the same)."""
        capacity = op.attrs.get("memory_capacity_bytes")
        run = RunSettings.from_attrs(view.module.attrs)
        settings = PartitionSettings(
            search=str(op.attrs.get("search", "window")),
            solver=str(op.attrs.get("solver", "cbc")),
            time_limit=self.partition_time_limit,
            wgrad_headroom=run.wgrad_headroom,
            reserved_gib=run.reserved_gib,
        )
        return settings, capacity / GIB if isinstance(capacity, int) else view.hardware.memory_gib
