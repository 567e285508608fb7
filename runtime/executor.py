"""The executor: one rank carries out its program of a plan with torch and torch.distributed.

The C++ FSM (``runtime.FSM``) decides what happens next; the executor binds
each action to real work and reports back:

- RUN ``<layer>.<op>.fwd``: the forward of that task for one micro-batch, as
  its own piece of autograd graph (``runtime.backward_split``; what each op
  computes is the model family's binding, ``runtime.bindings``). A router forward also starts the
  exchange of per-expert token counts over the EP group.
- RUN ``.dgrad``: the task's backward for its inputs only; the weight half is
  kept as a job. RUN ``.wgrad`` (in place, or offered by a DEFER and run when
  DBO fills a slot with it or its deadline comes): that job, exactly once; its
  gradients are folded into ``param.grad`` in micro-batch order.
- COLLECTIVE All-to-All (dispatch, combine and their backward mirrors): an
  asynchronous ``all_to_all_single`` over the EP group with the real
  per-expert token counts (the router's counts from every EP rank give the
  split sizes, and DBO gets them through ``report_tokens`` before the
  All-to-All is issued). COLLECTIVE gradient reduction: an asynchronous
  all-reduce of the stage's gradients (non-expert parameters over the stage's
  EP × DP ranks, experts over its DP replicas).
- SEND/RECV: asynchronous point-to-point transfers of a stage's output
  activation or input gradient to the same EP/DP position of the peer stage.
- WAIT: block until that transfer or collective has finished.

Every operation in flight is polled before each ``advance()``; its completion
goes back to the FSM when it is seen (DBO measures the slots it filled by
them). Communication proceeds in torch.distributed's own threads while this
thread computes: on CPU with gloo that is the only overlap that does not fight
the GIL. On CUDA the same code issues compute on the current stream and NCCL
collectives on their own streams; a WAIT then makes the compute stream wait on
the collective's event instead of blocking the host.

A value a task needs but whose transfer the program did not wait for is waited
for at the point of use (counted as ``implicit_waits``): the data dependency is
never broken, whatever the program's order.
"""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Callable, Iterable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

import torch
import torch.distributed as dist

from runtime.backward_split import ForwardRunner, OrderedGradients, ParamSlot, TaskGraph, WeightGradJob, backward_data
from runtime.bindings import MOE_OPS, WEIGHTED_OPS, BindingError, ModelBinding, Routing, task_op
from runtime.bytecode import Collective, Payload
from runtime.layout import RankGrid, StageLayout
from runtime.reference import ActionKind, load_imbalance

_TRACE = bool(os.environ.get("TESSERA_TRACE"))
_POLL_INTERVAL_NS = 50_000
"""Completions are polled before an FSM step at most this often: the issues of a burst of transfers take
a few microseconds each, too little for an earlier transfer to finish in between, and each poll costs an
``is_completed()`` per operation in flight. A wait on an operation that already finished returns at once."""


class ExecutionError(RuntimeError):
    """The plan asked for something the model's state does not allow (a task before its inputs, ...)."""


class CommunicationError(RuntimeError):
    """A transfer or collective failed: usually another rank died (``runtime.health`` names it)."""


def _wait_work(work: Any, what: str) -> None:
    with _communication(what):
        work.wait()


_comm_cpu = threading.local()


def _comm_cpu_ns() -> int:
    """This thread's CPU time inside transfer and collective calls so far (issue and wait: gloo's own work)."""
    return int(getattr(_comm_cpu, "ns", 0))


@contextmanager
def _communication(what: str) -> Iterator[None]:
    """Starting or finishing a transfer: a transport error becomes a CommunicationError.

    A peer that died shows first as a broken connection, when an operation is
    issued as often as when it is waited for. The call's CPU time is counted
    as communication (``cpu_ns["comm"]``), not as the runtime's own.
    """
    start = time.thread_time_ns()
    try:
        yield
    except RuntimeError as err:
        raise CommunicationError(f"{what} failed: {err}") from err
    finally:
        _comm_cpu.ns = _comm_cpu_ns() + time.thread_time_ns() - start


@dataclass
class _InFlight:
    """An asynchronous operation the FSM issued and has not been told about yet."""

    action_id: int
    label: str
    works: list[Any]
    issued_ns: int
    on_done: Callable[[], None] | None = None
    done_ns: int = 0
    blocked_ns: int = 0
    waited: bool = False
    done_works: list[Any] = field(default_factory=list)  # seen complete by finished(), still to be waited for once

    def finished(self) -> bool:
        # Polled before every FSM step: drop each work once it is seen complete, so a
        # long-lived transfer costs one is_completed() per poll, not one per work.
        while self.works and self.works[-1].is_completed():
            self.done_works.append(self.works.pop())
        return not self.works

    def wait(self) -> None:
        # Exactly once: a second wait() on a gloo send or receive waits for another transfer.
        if not self.waited:
            self.waited = True
            for w in (*self.done_works, *self.works):
                _wait_work(w, self.label)


@dataclass
class ActionRecord:
    """What one action did and when (for the prediction ledger): times in ns of ``time.perf_counter_ns``."""

    kind: str  # run, send, recv, all_to_all, grad_reduce
    action: int  # the FSM's action id: the instruction index for the program's own instructions
    task: int  # task index, or -1
    mb: int
    vstage: int
    start_ns: int
    end_ns: int
    blocked_ns: int = 0  # time the training thread waited for it (exposed communication)
    filled: bool = False
    fallback: bool = False


@dataclass
class IterationResult:
    """One iteration on one rank."""

    losses: list[float]  # per micro-batch, unscaled (last pipeline stage only; empty elsewhere)
    loss_tensors: list[torch.Tensor]
    counters: dict[str, float]  # the FSM's counters and the executor's own
    records: list[ActionRecord]
    wall_ns: int
    compute_ns: int
    blocked_ns: int
    runtime_ns: int  # advance()/complete() and the executor's own bookkeeping
    # CPU time of the training thread (time.thread_time_ns), per phase: forward, dgrad and wgrad
    # tasks, and the rest (FSM, issuing and retiring transfers, bookkeeping); ``total`` is their sum.
    cpu_ns: dict[str, int] = field(default_factory=dict)


@dataclass
class _Parallel:
    grid: RankGrid
    rank: int
    pp_rank: int
    ep_rank: int
    dp_rank: int
    ep_group: Any = None
    dense_group: Any = None
    expert_group: Any = None
    pp_group: Any = None  # the pipeline ranks at this EP/DP position (for pipelining's point-to-point)


def create_groups(grid: RankGrid, rank: int, backend: str | None = None) -> _Parallel:
    """The process groups of the plan's layout; every rank must call this, in the same order."""
    pp_rank, ep_rank, dp_rank = grid.coords(rank)

    def mine(rank_lists: Iterable[list[int]]) -> Any:
        found = None
        for ranks in rank_lists:  # every rank creates every group, in the same order
            group = dist.new_group(ranks, backend=backend)
            if rank in ranks:
                found = group
        return found

    return _Parallel(
        grid, rank, pp_rank, ep_rank, dp_rank,
        ep_group=mine(grid.ep_group(p, d) for d in range(grid.dp) for p in range(grid.pp)),
        dense_group=mine(grid.dense_group(p) for p in range(grid.pp)),
        expert_group=mine(grid.expert_group(p, e) for p in range(grid.pp) for e in range(grid.ep)),
        pp_group=mine(grid.pp_group(e, d) for d in range(grid.dp) for e in range(grid.ep)),
    )


# Every value the executor keeps per (layer, name, micro-batch) (see _forward, _p2p and _all_to_all).
_VALUE_NAMES = ("x_recv", "out", "logits", "h", "n", "permuted", "weights", "order", "received", "expert_out", "returned", "shared")


def _grad_key(layer: str, name: str, mb: int) -> tuple[str, str, int]:
    """Gradients live beside the values of the same name, under their own key."""
    return (layer, "d/" + name, mb)


def _tag(payload: int, vstage: int, mb: int, stages: int, microbatches: int) -> int:
    return (payload * stages + vstage) * microbatches + mb


@dataclass
class _Stats:
    compute_ns: int = 0
    blocked_ns: int = 0
    implicit_waits: int = 0
    wgrad_run: int = 0
    wgrad_filled: int = 0
    wgrad_fallback: int = 0
    a2a_bytes: int = 0
    p2p_bytes: int = 0
    tokens_routed: int = 0
    max_imbalance: float = 1.0
    split_dedicated_ops: int = 0  # weight operations split by a dedicated rule (runtime.backward_split)
    split_general_ops: int = 0  # ... and by the general path (a small graph each)
    cpu_ns: dict[str, int] = field(default_factory=lambda: dict.fromkeys(("fwd", "dgrad", "wgrad"), 0))
    extra: dict[str, float] = field(default_factory=dict)


class StageExecutor:
    """Runs one rank's program of a plan, one iteration per ``run_iteration``.

    ``program`` is this rank's ``runtime.Program``; ``layout`` the plan's stage
    layout; ``binding`` the model (experts sharded to this EP rank) seen as
    tasks; ``parallel`` the process groups from ``create_groups``.
    """

    def __init__(
        self,
        program: Any,
        layout: StageLayout,
        binding: ModelBinding,
        parallel: _Parallel,
        *,
        dbo: bool = True,
        fsm_factory: Callable[..., Any] | None = None,
        device: torch.device | None = None,
        external_loss: bool = False,
    ):
        import runtime

        self.program = program
        self.plan = program.plan
        self.tasks = program.tasks
        self.layout = layout
        self.binding = binding
        self.par = parallel
        self.dbo = dbo
        # external_loss: the head task stops at the logits and the caller computes the loss
        # (torch.distributed.pipelining's loss_fn) and hands back its gradient (set_grad).
        self.external_loss = external_loss
        self.device = device or torch.device("cpu")
        self._fsm_factory = fsm_factory or runtime.FSM
        self.stages = self.plan.pp * self.plan.vpp
        self.microbatches = int(self.plan.microbatches)
        self.shards = parallel.grid.shards
        self.loss_divisor = self.microbatches * self.shards
        self._check_tasks()
        self.my_stages = layout.stages_of_rank(parallel.pp_rank)
        self.my_layers = [name for s in self.my_stages for name in layout.stage_layers[s]]
        self.slots: dict[tuple[str, str], tuple[ParamSlot, ...]] = {}
        for layer in self.my_layers:
            for op, slots in binding.layer_params(layer).items():
                self.slots[(layer, op)] = slots
        params: dict[str, torch.Tensor] = {}
        for slots in self.slots.values():
            for s in slots:
                params[s.key] = s.param
        self.params = params
        self.expert_keys = {s.key for (layer, op), slots in self.slots.items() if op == "expert_gemm" for s in slots}
        self.grads = OrderedGradients(params, self.microbatches)
        self.runner = ForwardRunner()
        self._fns: dict[tuple[str, str], Callable[..., tuple[torch.Tensor, ...]]] = {}
        self._assemble = binding.assemble_fn()
        # The tasks whose gradients of the post-mixer norm's output the mixer's dgrad sums, in this order.
        self._n_consumers = ("router", "dispatch") + (("shared_expert",) if binding.has_shared_expert else ())
        self._head = binding.logits_fn() if external_loss else binding.head_fn(self.loss_divisor)
        self._dispatch_of = {
            (t.layer, task_op(t.kind)[0], task_op(t.kind)[1]): i for i, t in enumerate(self.tasks)
            if task_op(t.kind)[0] in ("dispatch", "combine")
        }
        self.last_result: IterationResult | None = None

    # ------------------------------------------------------------ set-up checks

    def _check_tasks(self) -> None:
        known = WEIGHTED_OPS | {"dispatch", "combine"}
        for t in self.tasks:
            op, _ = task_op(t.kind)
            if op not in known:
                raise BindingError(f"plan task '{t.name}' has kind '{t.kind}', which this executor cannot run")
        for t in self.tasks:
            op, _ = task_op(t.kind)
            if t.layer in ("embed", "head") or not (op in MOE_OPS or op == "dense_mlp"):
                continue
            if self.binding.is_dense(t.layer) != (op == "dense_mlp"):
                raise BindingError(
                    f"plan task '{t.name}' is a {'dense' if op == 'dense_mlp' else 'MoE'} layer's, but layer {t.layer} of the "
                    f"model is {'a dense MLP' if self.binding.is_dense(t.layer) else 'a sparse MoE'} layer; compile the plan for this model"
                )
        planned = any(task_op(t.kind)[0] == "shared_expert" for t in self.tasks)
        if planned != self.binding.has_shared_expert:
            raise BindingError(
                "the plan has shared-expert tasks but the model has no shared expert" if planned else
                "the model has a shared expert but the plan has no shared-expert task; compile the plan for this model"
            )

    def parameters(self) -> list[torch.Tensor]:
        """The parameters this rank trains (its stages' layers; its own experts)."""
        return list(self.params.values())

    def _fn(self, layer: str, op: str) -> Callable[..., tuple[torch.Tensor, ...]]:
        key = (layer, op)
        fn = self._fns.get(key)
        if fn is None:
            b = self.binding
            fn = {
                "embedding": lambda: b.embedding_fn(),
                "mixer": lambda: b.mixer_fn(layer),
                "router": lambda: b.gate_fn(layer),
                "permute": lambda: b.permute_fn(),
                "expert_gemm": lambda: b.experts_fn(layer),
                "shared_expert": lambda: b.shared_fn(layer),
                "dense_mlp": lambda: b.dense_fn(layer),
            }[op]()
            self._fns[key] = fn
        return fn

    # ------------------------------------------------------------ one iteration

    def run_iteration(self, input_ids: torch.Tensor | None = None, labels: torch.Tensor | None = None) -> IterationResult:
        """Run the program once, as the FSM orders it. ``input_ids``/``labels``: [microbatches, batch, seq] of this rank's slice."""
        fsm = self._fsm_factory(self.program, dbo=self.dbo)
        self.begin_iteration(input_ids, labels, fsm)
        while True:
            self._poll()
            action = fsm.advance()
            kind = action.kind
            if _TRACE:
                print(f"[rank {self.par.rank}] {action!r}", flush=True)
            if kind == ActionKind.DONE:
                break
            if kind == ActionKind.WAIT:
                self.wait(action.wait_for)
            elif kind == ActionKind.RUN:
                self.run_task(action.task, action.mb, action.id, filled=bool(action.filled), fallback=bool(action.fallback))
            elif kind == ActionKind.SEND or kind == ActionKind.RECV:
                self._p2p(action)
            elif action.collective == Collective.GRAD_REDUCE:
                self.reduce_stage(action.vstage, action.id)
            else:
                self.issue_all_to_all(action.task, action.mb, action.id)
        return self.end_iteration(dict(fsm.counters))

    def begin_iteration(self, input_ids: torch.Tensor | None, labels: torch.Tensor | None, fsm: Any = None) -> None:
        """Start an iteration: fresh per-iteration state. ``fsm`` (optional) hears completions and token counts."""
        first, last = 0 in self.my_stages, self.stages - 1 in self.my_stages
        if first and input_ids is None:
            raise ExecutionError("this rank runs the first stage: the iteration needs input_ids")
        if last and labels is None and not self.external_loss:
            raise ExecutionError("this rank runs the last stage: the iteration needs labels")
        self.fsm = fsm
        self.input_ids, self.labels = input_ids, labels
        self.values: dict[tuple[str, str, int], Any] = {}
        self.pending: dict[tuple[str, str, int], _InFlight] = {}
        self.graphs: dict[tuple[str, str, int], TaskGraph] = {}
        self.jobs: dict[tuple[str, str, int], WeightGradJob] = {}
        self.grad_parts: dict[tuple[str, str, int], dict[str, torch.Tensor]] = {}
        self.routing: dict[tuple[str, int], Routing] = {}
        self.routing_pending: dict[tuple[str, int], tuple[Any, list[torch.Tensor]]] = {}
        self.inflight: dict[int, _InFlight] = {}
        self.records: list[ActionRecord] = []
        self.wgrad_ran: dict[tuple[str, str, int], int] = {}
        self.reduced: set[str] = set()
        self.loss_values: dict[int, torch.Tensor] = {}
        self.stats = _Stats()
        self.grads.begin_iteration()
        self._begin_ns = time.perf_counter_ns()
        self._begin_cpu_ns = time.thread_time_ns()
        self._begin_comm_ns = _comm_cpu_ns()
        self._polled_ns = 0

    def end_iteration(self, counters: dict[str, float] | None = None) -> IterationResult:
        """Finish an iteration: every transfer done, every weight gradient run and reduced, or an error."""
        for handle in list(self.inflight):
            self.wait(handle)
        wall = time.perf_counter_ns() - self._begin_ns
        self._finish_checks()
        cpu = dict(self.stats.cpu_ns)
        cpu["total"] = time.thread_time_ns() - self._begin_cpu_ns
        cpu["comm"] = _comm_cpu_ns() - self._begin_comm_ns
        cpu["other"] = max(0, cpu["total"] - cpu["fwd"] - cpu["dgrad"] - cpu["wgrad"] - cpu["comm"])
        counters = dict(counters or {})
        s = self.stats
        counters.update({
            "implicit_waits": s.implicit_waits, "wgrad_run": s.wgrad_run, "wgrad_filled": s.wgrad_filled,
            "wgrad_fallback": s.wgrad_fallback, "a2a_bytes": s.a2a_bytes, "p2p_bytes": s.p2p_bytes,
            "tokens_routed": s.tokens_routed, "max_imbalance": s.max_imbalance,
            "split_dedicated_ops": s.split_dedicated_ops, "split_general_ops": s.split_general_ops,
        })
        losses = [self.loss_values[m] for m in sorted(self.loss_values)]
        runtime_ns = max(0, wall - s.compute_ns - s.blocked_ns)
        result = IterationResult(
            [float(v) for v in losses], losses, counters, self.records, wall, s.compute_ns, s.blocked_ns, runtime_ns, cpu
        )
        self.last_result = result
        # Nothing of this iteration's graphs survives it.
        self.values, self.graphs, self.jobs, self.grad_parts = {}, {}, {}, {}
        self.fsm = None
        return result

    def _finish_checks(self) -> None:
        for (layer, op, mb), job in self.jobs.items():
            if not job.done:
                raise ExecutionError(f"the weight gradients of {layer}.{op} for micro-batch {mb} never ran")
        missing = self.grads.missing()
        if missing:
            key, mb = missing[0]
            raise ExecutionError(f"{len(missing)} parameter(s) lack weight gradients, first '{key}' from micro-batch {mb}")
        unreduced = sorted(set(self.params) - self.reduced)
        if unreduced:
            raise ExecutionError(f"the gradients of {len(unreduced)} parameter(s), first '{unreduced[0]}', were never reduced")

    # ------------------------------------------------------------ asynchronous work

    def _poll(self) -> None:
        if self.inflight:
            now = time.perf_counter_ns()
            if now - self._polled_ns < _POLL_INTERVAL_NS:
                return
            self._polled_ns = now
            for action_id in [i for i, f in self.inflight.items() if f.finished()]:
                self._retire(action_id)

    def _retire(self, action_id: int) -> None:
        flight = self.inflight.pop(action_id)
        flight.wait()
        flight.done_ns = time.perf_counter_ns()
        if flight.on_done is not None:
            flight.on_done()
        self._complete(action_id)

    def _complete(self, action_id: int) -> None:
        if self.fsm is not None:
            self.fsm.complete(action_id)

    def wait(self, action_id: int) -> None:
        """Block until the transfer or collective issued as ``action_id`` has finished."""
        flight = self.inflight.get(action_id)
        if flight is None:
            raise ExecutionError(f"the program waits on action {action_id}, which is not in flight")
        start = time.perf_counter_ns()
        flight.wait()
        blocked = time.perf_counter_ns() - start
        flight.blocked_ns += blocked
        self.stats.blocked_ns += blocked
        self._retire(action_id)

    def _resolve(self, key: tuple[str, str, int], needed_by: str) -> Any:
        flight = self.pending.get(key)
        if flight is not None and flight.action_id in self.inflight:
            self.stats.implicit_waits += 1
            self.wait(flight.action_id)
        if key not in self.values:
            layer, name, mb = key
            raise ExecutionError(f"{needed_by} needs {name} of layer {layer} for micro-batch {mb}, which no earlier action produced")
        return self.values[key]

    def _track(self, action_id: int, label: str, works: list[Any], on_done: Callable[[], None] | None, *keys: tuple[str, str, int]) -> _InFlight:
        flight = _InFlight(action_id, label, [w for w in works if w is not None], time.perf_counter_ns(), on_done)
        self.inflight[action_id] = flight
        for key in keys:
            self.pending[key] = flight
        return flight

    # ------------------------------------------------------------ RUN

    def run_task(self, task_index: int, mb: int, action_id: int, *, filled: bool = False, fallback: bool = False) -> None:
        """Run one compute task (forward, dgrad or wgrad) for micro-batch ``mb``, synchronously."""
        task = self.tasks[task_index]
        op, phase = task_op(task.kind)
        layer, mb = task.layer, int(mb)
        blocked_before = self.stats.blocked_ns
        start, start_cpu, start_comm = time.perf_counter_ns(), time.thread_time_ns(), _comm_cpu_ns()
        if phase == "fwd":
            self._forward(layer, op, mb)
        elif phase == "dgrad":
            self._dgrad(layer, op, mb)
        else:
            self._wgrad(layer, op, mb, filled, fallback)
        end = time.perf_counter_ns()
        self._task_cpu(phase, start_cpu, start_comm)
        blocked = self.stats.blocked_ns - blocked_before  # a transfer the task had to wait for (implicit wait)
        self.stats.compute_ns += end - start - blocked
        self.records.append(ActionRecord(
            "run", int(action_id), int(task_index), mb, self.layout.stage_of(layer), start, end, blocked, filled, fallback
        ))
        self._complete(action_id)

    def _task_cpu(self, phase: str, start_cpu: int, start_comm: int) -> None:
        """A task's CPU time goes to its phase, less what it spent inside transfer calls (an implicit
        wait, the count exchange a router's forward starts): that is communication, counted once."""
        self.stats.cpu_ns[phase] += time.thread_time_ns() - start_cpu - (_comm_cpu_ns() - start_comm)

    def _graph(self, layer: str, op: str, mb: int, fn: Callable[..., tuple[torch.Tensor, ...]], inputs: Sequence[torch.Tensor | None], extra: Sequence[Any] = ()) -> TaskGraph:
        key = (layer, op, mb)
        if key in self.graphs:
            raise ExecutionError(f"the forward of {layer}.{op} for micro-batch {mb} ran twice")
        graph = self.runner.run(f"{layer}.{op}[{mb}]", fn, inputs, self.slots.get((layer, op), ()), extra)
        self.graphs[key] = graph
        self.stats.split_general_ops += len(graph.general_ops)
        self.stats.split_dedicated_ops += len(graph.ops) - len(graph.general_ops)
        return graph

    def _forward(self, layer: str, op: str, mb: int) -> None:
        name = f"{layer}.{op}.fwd"
        if op == "embedding":
            assert self.input_ids is not None
            g = self._graph(layer, op, mb, self._fn(layer, op), [self.input_ids[mb]])
            self.values[(layer, "out", mb)] = g.outputs[0]
        elif op == "lm_head" and self.external_loss:
            g = self._graph(layer, op, mb, self._head, [self._layer_input(layer, mb, name)])
            self.values[(layer, "logits", mb)] = g.outputs[0]
        elif op == "lm_head":
            assert self.labels is not None
            x = self._layer_input(layer, mb, name)
            g = self._graph(layer, op, mb, self._head, [x], (self.labels[mb],))
            self.loss_values[mb] = g.outputs[1]
        elif op == "mixer":
            g = self._graph(layer, op, mb, self._fn(layer, op), [self._layer_input(layer, mb, name)])
            self.values[(layer, "h", mb)], self.values[(layer, "n", mb)] = g.outputs
        elif op == "router":
            n = self._resolve((layer, "n", mb), name)
            g = self._graph(layer, op, mb, self._fn(layer, op), [n])
            weights, order, counts = g.outputs
            # The permutation is a piece of its own: its backward runs with the dispatch's
            # backward, the gate's with the combine's (the plan's dependencies).
            p = self._graph(layer, "permute", mb, self._fn(layer, "permute"), [n], (order,))
            self.values[(layer, "permuted", mb)] = p.outputs[0]
            self.values[(layer, "weights", mb)] = weights
            self.values[(layer, "order", mb)] = order
            self._exchange_counts(layer, mb, counts)
        elif op == "expert_gemm":
            received = self._resolve((layer, "received", mb), name)
            index, inverse, per_expert = self._routing(layer, mb).regroup()
            g = self._graph(layer, op, mb, self._fn(layer, op), [received], (index, inverse, per_expert))
            self.values[(layer, "expert_out", mb)] = g.outputs[0]
        elif op == "shared_expert":
            g = self._graph(layer, op, mb, self._fn(layer, op), [self._resolve((layer, "n", mb), name)])
            self.values[(layer, "shared", mb)] = g.outputs[0]
        elif op == "dense_mlp":
            h, n = self._resolve((layer, "h", mb), name), self._resolve((layer, "n", mb), name)
            g = self._graph(layer, op, mb, self._fn(layer, op), [h, n])
            self.values[(layer, "out", mb)] = g.outputs[0]  # a dense layer's output needs no assembly
        else:
            raise BindingError(f"task '{name}' is a forward this executor does not run")

    # ------------------------------------------------------------ stage boundaries (for drivers other than the FSM)

    def stage_input(self, stage: int, mb: int, value: torch.Tensor) -> None:
        """The input of virtual stage ``stage`` (its first layer's) for ``mb``, received by the caller."""
        self.values[(self.layout.stage_layers[stage][0], "x_recv", mb)] = value

    def stage_output(self, stage: int, mb: int) -> torch.Tensor:
        """The output of virtual stage ``stage`` for ``mb``: its last layer's, or the logits with ``external_loss``."""
        last = self.layout.stage_layers[stage][-1]
        if self.external_loss and last == self.layout.layers[-1]:
            return self._resolve((last, "logits", mb), f"the output of stage {stage}")  # type: ignore[no-any-return]
        return self._layer_output(last, mb, f"the output of stage {stage}")

    def stage_output_grad(self, stage: int, mb: int, grad: torch.Tensor) -> None:
        """The gradient of stage ``stage``'s output for ``mb`` (received, or of the logits from the loss)."""
        last = self.layout.stage_layers[stage][-1]
        name = "logits" if self.external_loss and last == self.layout.layers[-1] else "g_out_recv"
        self._set_grad(last, name, mb, grad)

    def stage_input_grad(self, stage: int, mb: int) -> torch.Tensor | None:
        """The gradient of stage ``stage``'s input for ``mb`` (None for the first stage: token ids)."""
        if stage == 0:
            return None
        return self._grad(self.layout.stage_layers[stage][0], "x", mb, f"the input gradient of stage {stage}")

    def run_pending_wgrads(self, stage: int, mb: int) -> None:
        """Run the weight gradients of ``stage``'s tasks for ``mb`` that have not run yet."""
        for layer in self.layout.stage_layers[stage]:
            for op in self.binding.layer_params(layer):
                key = (layer, op, mb)
                if (key in self.jobs and not self.jobs[key].done) or (op == "embedding" and key in self.graphs):
                    self._wgrad(layer, op, mb, False, False)

    def _layer_input(self, layer: str, mb: int, needed_by: str) -> torch.Tensor:
        stage = self.layout.stage_of(layer)
        if self.layout.stage_layers[stage][0] == layer and stage > 0:
            return self._resolve((layer, "x_recv", mb), needed_by)
        prev = self.layout.previous(layer)
        if prev is None:
            raise ExecutionError(f"{needed_by}: layer {layer} has no input")
        return self._layer_output(prev, mb, needed_by)

    def _layer_output(self, layer: str, mb: int, needed_by: str) -> torch.Tensor:
        key = (layer, "out", mb)
        if key in self.values:
            return self.values[key]  # type: ignore[no-any-return]
        # A decoder layer's output is assembled when first needed (it has no task of its own).
        inputs = [self._resolve((layer, n, mb), needed_by) for n in self.binding.assemble_inputs()]
        g = self._graph(layer, "assemble", mb, self._assemble, inputs, (self._resolve((layer, "order", mb), needed_by),))
        self.values[key] = g.outputs[0]
        return g.outputs[0]

    # ------------------------------------------------------------ backward

    def _set_grad(self, layer: str, name: str, mb: int, grad: torch.Tensor | None, part: str = "") -> None:
        if grad is None:
            return
        parts = self.grad_parts.setdefault(_grad_key(layer, name, mb), {})
        if part in parts:
            raise ExecutionError(f"gradient {name} of layer {layer} for micro-batch {mb} from {part or 'its consumer'} arrived twice")
        parts[part] = grad

    def _grad(self, layer: str, name: str, mb: int, needed_by: str, parts: Sequence[str] = ("",)) -> torch.Tensor:
        key = _grad_key(layer, name, mb)
        flight = self.pending.get(key)
        if flight is not None and flight.action_id in self.inflight:
            self.stats.implicit_waits += 1
            self.wait(flight.action_id)
        got = self.grad_parts.get(key, {})
        missing = [p for p in parts if p not in got]
        if missing:
            whose = ", ".join(f"{p}.dgrad" if p else "its consumer" for p in missing)
            raise ExecutionError(
                f"{needed_by} needs the gradient of {name} of layer {layer} for micro-batch {mb} from {whose}, "
                "which has not run: the program breaks a dependency of the model"
            )
        total = got[parts[0]]
        for p in parts[1:]:
            total = total + got[p]  # two contributions (router and shared expert): the order cannot change the sum
        return total

    def _out_grad(self, layer: str, mb: int, needed_by: str) -> torch.Tensor:
        """Gradient of a layer's output: from the next layer's dgrad, or received from the next stage."""
        stage = self.layout.stage_of(layer)
        if self.layout.stage_layers[stage][-1] == layer and stage < self.stages - 1:
            return self._grad(layer, "g_out_recv", mb, needed_by)
        nxt = self.layout.next(layer)
        if nxt is None:
            raise ExecutionError(f"{needed_by}: layer {layer} has no consumer")
        return self._grad(nxt, "x", mb, needed_by)

    def _assembled_grads(self, layer: str, mb: int, needed_by: str) -> None:
        key = (layer, "assemble", mb)
        graph = self.graphs.get(key)
        if graph is None:
            raise ExecutionError(f"{needed_by}: the output of layer {layer} for micro-batch {mb} was never assembled")
        if graph.dgrad_done:
            return
        grads, _ = backward_data(graph, [self._out_grad(layer, mb, needed_by)])
        for name, g in zip(self.binding.assemble_inputs(), grads):
            self._set_grad(layer, name, mb, g)

    def _permute_grads(self, layer: str, mb: int, needed_by: str) -> None:
        """The permutation's backward: the returned gradient of the permuted tokens back in token order."""
        graph = self.graphs.pop((layer, "permute", mb), None)
        if graph is None:
            raise ExecutionError(f"{needed_by}: the tokens of layer {layer} for micro-batch {mb} were never permuted")
        (gn,), _ = backward_data(graph, [self._grad(layer, "permuted", mb, needed_by)])
        self._set_grad(layer, "n", mb, gn, "dispatch")

    def _dgrad(self, layer: str, op: str, mb: int) -> None:
        name = f"{layer}.{op}.dgrad"
        graph = self.graphs.get((layer, op, mb))
        if graph is None:
            raise ExecutionError(f"{name} for micro-batch {mb} runs before its forward")
        if op == "lm_head":
            grads = [self._grad(layer, "logits", mb, name)] if self.external_loss else [None, None]
            (gx,), job = backward_data(graph, grads)
            self._set_grad(layer, "x", mb, gx)
        elif op == "mixer" and self.binding.is_dense(layer):
            (gx,), job = backward_data(graph, [self._grad(layer, "h", mb, name), self._grad(layer, "n", mb, name, ("dense_mlp",))])
            self._set_grad(layer, "x", mb, gx)
        elif op == "mixer":
            self._assembled_grads(layer, mb, name)
            self._permute_grads(layer, mb, name)
            g_h = self._grad(layer, "h", mb, name)
            # The router's two contributions first, as autograd sums them inside the router.
            g_n = self._grad(layer, "n", mb, name, self._n_consumers)
            (gx,), job = backward_data(graph, [g_h, g_n])
            self._set_grad(layer, "x", mb, gx)
        elif op == "dense_mlp":
            (g_dense_h, g_dense_n), job = backward_data(graph, [self._out_grad(layer, mb, name)])
            self._set_grad(layer, "h", mb, g_dense_h)
            self._set_grad(layer, "n", mb, g_dense_n, "dense_mlp")
        elif op == "router":
            self._assembled_grads(layer, mb, name)
            g_w = self._grad(layer, "weights", mb, name)
            (gn,), job = backward_data(graph, [g_w, None, None])
            self._set_grad(layer, "n", mb, gn, "router")
        elif op == "shared_expert":
            self._assembled_grads(layer, mb, name)
            (gn,), job = backward_data(graph, [self._grad(layer, "shared", mb, name)])
            self._set_grad(layer, "n", mb, gn, "shared_expert")
        elif op == "expert_gemm":
            (g_recv,), job = backward_data(graph, [self._grad(layer, "expert_out", mb, name)])
            self._set_grad(layer, "received", mb, g_recv)
        else:
            raise BindingError(f"task '{name}' is a backward this executor does not run")
        self.jobs[(layer, op, mb)] = job
        self.graphs.pop((layer, op, mb), None)
        if op in ("mixer", "lm_head"):
            self._release(layer, mb)  # a layer's last backward task: its forward values are dead

    def _release(self, layer: str, mb: int) -> None:
        """Drop a layer's forward values for ``mb`` once its backward has run.

        Their autograd graphs go with them now, inside the backward that made them
        dead (as ``loss.backward()`` frees its graph as it goes), not all at once
        at the end of the iteration; and their memory is free for later micro-batches.
        """
        for name in _VALUE_NAMES:
            self.values.pop((layer, name, mb), None)
        self.graphs.pop((layer, "assemble", mb), None)

    def _wgrad(self, layer: str, op: str, mb: int, filled: bool, fallback: bool) -> None:
        name = f"{layer}.{op}.wgrad"
        key = (layer, op, mb)
        if op == "embedding" and key not in self.jobs:
            graph = self.graphs.pop(key, None)
            if graph is None:
                raise ExecutionError(f"{name} for micro-batch {mb} runs before the embedding's forward")
            _, self.jobs[key] = backward_data(graph, [self._grad(self.layout.next(layer) or layer, "x", mb, name)])
            self._release(layer, mb)
        job = self.jobs.get(key)
        if job is None:
            raise ExecutionError(f"{name} for micro-batch {mb} runs before {layer}.{op}.dgrad")
        self.wgrad_ran[key] = self.wgrad_ran.get(key, 0) + 1
        for param_key, grad in job.run().items():
            self.grads.add(param_key, mb, grad)
        self.stats.wgrad_run += 1
        self.stats.wgrad_filled += int(filled)
        self.stats.wgrad_fallback += int(fallback)

    # ------------------------------------------------------------ expert parallelism

    def _exchange_counts(self, layer: str, mb: int, counts: torch.Tensor) -> None:
        """Start sharing this rank's per-expert token counts with its EP group (asynchronously)."""
        counts = counts.to(torch.int64).cpu()
        if self.par.grid.ep == 1:
            self.routing_pending[(layer, mb)] = (None, [counts])
            return
        gathered = [torch.empty_like(counts) for _ in range(self.par.grid.ep)]
        with _communication(f"the token-count exchange of layer {layer} micro-batch {mb}"):
            work = dist.all_gather(gathered, counts, group=self.par.ep_group, async_op=True)
        self.routing_pending[(layer, mb)] = (work, gathered)

    def _routing(self, layer: str, mb: int) -> Routing:
        key = (layer, mb)
        routing = self.routing.get(key)
        if routing is not None:
            return routing
        entry = self.routing_pending.pop(key, None)
        if entry is None:
            raise ExecutionError(f"the All-to-All of layer {layer} for micro-batch {mb} runs before its router")
        work, gathered = entry
        if work is not None:
            start = time.perf_counter_ns()
            _wait_work(work, f"the token-count exchange of layer {layer} micro-batch {mb}")
            self.stats.blocked_ns += time.perf_counter_ns() - start
        routing = Routing(tuple(tuple(int(c) for c in g.tolist()) for g in gathered), self.par.grid.ep, self.par.ep_rank)
        self.routing[key] = routing
        tokens = routing.expert_tokens
        self.stats.tokens_routed += sum(tokens)
        for (task_layer, op, _phase), index in self._dispatch_of.items():
            if task_layer == layer and op in ("dispatch", "combine"):
                if self.fsm is not None:
                    self.fsm.report_tokens(index, mb, tokens)
        if self.par.grid.ep > 1:
            self.stats.max_imbalance = max(self.stats.max_imbalance, load_imbalance(tokens, self.par.grid.ep))
        return routing

    def issue_all_to_all(self, task_index: int, mb: int, action_id: int) -> None:
        """Start an All-to-All task (dispatch, combine or their backward mirrors) for ``mb``, asynchronously."""
        task = self.tasks[task_index]
        op, phase = task_op(task.kind)
        layer, mb = task.layer, int(mb)
        name = f"{layer}.{op}.{phase}"
        routing = self._routing(layer, mb)
        send, recv = routing.send_splits, routing.recv_splits
        # Forward dispatch and backward combine go token owners -> expert owners; the others come back.
        if (op, phase) == ("dispatch", "fwd"):
            tensor, splits, target = self._resolve((layer, "permuted", mb), name), (send, recv), (layer, "received", mb)
        elif (op, phase) == ("combine", "fwd"):
            tensor, splits, target = self._resolve((layer, "expert_out", mb), name), (recv, send), (layer, "returned", mb)
        elif (op, phase) == ("combine", "dgrad"):
            # The layer output's backward (assemble) is compute, the first the combine's backward needs.
            start, start_cpu, blocked_before = time.perf_counter_ns(), time.thread_time_ns(), self.stats.blocked_ns
            start_comm = _comm_cpu_ns()
            self._assembled_grads(layer, mb, name)
            self._task_cpu("dgrad", start_cpu, start_comm)
            self.stats.compute_ns += time.perf_counter_ns() - start - (self.stats.blocked_ns - blocked_before)
            tensor, splits, target = self._grad(layer, "returned", mb, name), (send, recv), (layer, "expert_out", mb)
        elif (op, phase) == ("dispatch", "dgrad"):
            tensor, splits, target = self._grad(layer, "received", mb, name), (recv, send), (layer, "permuted", mb)
        else:
            raise BindingError(f"task '{name}' is not an All-to-All this executor knows")
        grads = phase == "dgrad"
        self._all_to_all(action_id, task_index, tensor.detach(), splits, target, grads)

    def _all_to_all(self, action_id: int, task_index: int, tensor: torch.Tensor, splits: tuple[list[int], list[int]], target: tuple[str, str, int], grads: bool) -> None:
        layer, name, mb = target
        send, recv = splits
        start = time.perf_counter_ns()
        if self.par.grid.ep == 1:
            out = tensor
            work = None
        else:
            tensor = tensor.contiguous()
            out = tensor.new_empty((sum(recv), *tensor.shape[1:]))
            with _communication(f"the All-to-All {layer}.{name}[{mb}]"):
                work = dist.all_to_all_single(out, tensor, recv, send, group=self.par.ep_group, async_op=True)
            self.stats.a2a_bytes += tensor.numel() * tensor.element_size()

        def done() -> None:
            if grads:
                self._set_grad(layer, name, mb, out)
            else:
                self.values[(layer, name, mb)] = out
            record.end_ns = time.perf_counter_ns()
            record.blocked_ns = flight.blocked_ns

        record = ActionRecord("all_to_all", int(action_id), int(task_index), mb, self.layout.stage_of(layer), start, start)
        self.records.append(record)
        flight = self._track(int(action_id), f"{layer}.{name}[{mb}]", [work], done, _grad_key(*target) if grads else target)

    # ------------------------------------------------------------ pipeline transfers

    def _p2p(self, action: Any) -> None:
        mb, vstage, payload = int(action.mb), int(action.vstage), int(action.payload)
        grid = self.par.grid
        peer = grid.rank(int(action.peer), self.par.ep_rank, self.par.dp_rank)
        tag = _tag(payload, vstage, mb, self.stages, self.microbatches)
        layers = self.layout.stage_layers[vstage]
        sending = action.kind == ActionKind.SEND
        start = time.perf_counter_ns()
        if sending:
            where = f"send of stage {vstage} micro-batch {mb}"
            if payload == Payload.ACTIVATION:
                tensor = self._layer_output(layers[-1], mb, where)
            else:
                tensor = self._grad(layers[0], "x", mb, where)
            tensor = tensor.detach().contiguous()
            if _TRACE:
                print(f"[rank {self.par.rank}] isend to {peer} tag {tag} {tuple(tensor.shape)} {tensor.dtype}", flush=True)
            with _communication(f"the {where} to rank {peer}"):
                work = dist.isend(tensor, peer, tag=tag)
            self.stats.p2p_bytes += tensor.numel() * tensor.element_size()
            on_done: Callable[[], None] | None = None
            keys: tuple[tuple[str, str, int], ...] = ()
        else:
            shape = (self.plan.micro_batch_size, self.plan.seq_len, self.binding.hidden)
            buffer = torch.empty(shape, dtype=self._dtype(), device=self.device)
            if _TRACE:
                print(f"[rank {self.par.rank}] irecv from {peer} tag {tag} {tuple(buffer.shape)} {buffer.dtype}", flush=True)
            with _communication(f"the receive of stage {vstage} micro-batch {mb} from rank {peer}"):
                work = dist.irecv(buffer, peer, tag=tag)
            if payload == Payload.ACTIVATION:
                # Stage vstage's output is the input of stage vstage + 1's first layer.
                key = (self.layout.stage_layers[vstage + 1][0], "x_recv", mb)

                def on_done() -> None:
                    self.values[key] = buffer
            else:
                # Stage vstage's input gradient is the output gradient of stage vstage - 1's last layer.
                layer = self.layout.stage_layers[vstage - 1][-1]
                key = _grad_key(layer, "g_out_recv", mb)

                def on_done() -> None:
                    self._set_grad(layer, "g_out_recv", mb, buffer)

            keys = (key,)
        record = ActionRecord("send" if sending else "recv", int(action.id), -1, mb, vstage, start, start)
        self.records.append(record)

        def finish(callback: Callable[[], None] | None = on_done) -> None:
            if callback is not None:
                callback()
            record.end_ns = time.perf_counter_ns()
            record.blocked_ns = flight.blocked_ns

        flight = self._track(int(action.id), f"p2p stage {vstage} mb {mb}", [work], finish, *keys)

    def _dtype(self) -> torch.dtype:
        return next(iter(self.params.values())).dtype if self.params else torch.float32

    # ------------------------------------------------------------ gradient reduction

    def reduce_stage(self, vstage: int, action_id: int) -> None:
        """Start the gradient reduction of virtual stage ``vstage`` (its weight gradients must all have run)."""
        vstage = int(vstage)
        if self.plan.pp == 1:
            # One stage holds every layer (see StageLayout): reduce what is complete and not yet reduced.
            layers = list(self.layout.layers)
        else:
            layers = list(self.layout.stage_layers[vstage])
        keys = [s.key for layer in layers for op in self.binding.layer_params(layer) for s in self.slots.get((layer, op), ())]
        keys = [k for k in keys if k not in self.reduced and self.grads.complete(k)]
        if self.plan.pp > 1:
            pending = [k for layer in layers for op in self.binding.layer_params(layer)
                       for k in (s.key for s in self.slots.get((layer, op), ())) if not self.grads.complete(k)]
            if pending:
                raise ExecutionError(
                    f"the gradient reduction of stage {vstage} starts before every weight gradient of '{pending[0]}' ran"
                )
        start = time.perf_counter_ns()
        works: list[Any] = []
        finishers: list[Callable[[], None]] = []
        grid = self.par.grid
        for group_keys, group, size in (
            ([k for k in keys if k not in self.expert_keys], self.par.dense_group, grid.ep * grid.dp),
            ([k for k in keys if k in self.expert_keys], self.par.expert_group, grid.dp),
        ):
            if not group_keys:
                continue
            params = [self.params[k] for k in group_keys]
            for p in params:
                if p.grad is None:
                    p.grad = torch.zeros_like(p)
            if size == 1:
                continue
            flat = torch.cat([p.grad.reshape(-1) for p in params])  # type: ignore[union-attr]
            with _communication("the gradient all-reduce"):
                works.append(dist.all_reduce(flat, group=group, async_op=True))

            def unflatten(flat: torch.Tensor = flat, params: list[torch.Tensor] = params) -> None:
                offset = 0
                for p in params:
                    n = p.numel()
                    assert p.grad is not None
                    p.grad.copy_(flat[offset : offset + n].view_as(p))
                    offset += n

            finishers.append(unflatten)
        self.reduced.update(keys)
        record = ActionRecord("grad_reduce", int(action_id), -1, 0, vstage, start, start)
        self.records.append(record)

        def done() -> None:
            for f in finishers:
                f()
            record.end_ns = time.perf_counter_ns()

        self._track(int(action_id), f"gradient reduction of stage {vstage}", works, done)
