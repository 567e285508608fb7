"""The IR verifier: a registry of named checks, each an invariant every module keeps.

A check is a function ``(module) -> Iterable[VerifyError]``, registered under a
kebab-case name with :func:`check`. ``verify(module)`` raises the first error
found; ``collect_errors(module)`` returns all of them. Each error names the
entity at fault and, when the module came from text, its line and column.

The checks assume nothing the others establish: a module with dangling
references or a cycle still gets every other check run over it without a crash.
Every check is linear in the size of the module, except ``wgrad-after-gradient``,
which searches backwards from a wgrad task only when it has no direct edge to
the gradient it needs.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable, Iterator
from contextlib import contextmanager
from contextvars import ContextVar
from dataclasses import dataclass
from typing import TypeVar

from support.processes import beside
from tessera_ir import plan_ops
from tessera_ir.errors import VerifyError
from tessera_ir.kinds import (
    COMM_OPS,
    MIXER_OPS,
    WEIGHTED_OPS,
    WGRAD_FROM_OUTPUT_GRADIENT,
    FfnKind,
    LayerRole,
    MixerKind,
    Phase,
    Resource,
    TaskOp,
    resource_of,
)
from tessera_ir.model import MAX_VALUE_DEPTH, Attrs, Layer, Module, PlanOp, SymbolRef, Task, Value, value_depth
from tessera_ir.printer import spell_value
from tessera_ir.schedule_rules import at_least, violations

T = TypeVar("T")

CheckFn = Callable[[Module], Iterable[VerifyError]]


@dataclass(frozen=True)
class Check:
    name: str
    summary: str
    run: CheckFn


# Checks in the order they run; verify() reports the first failure of the first failing check.
CHECKS: dict[str, Check] = {}


def check(name: str, summary: str) -> Callable[[CheckFn], CheckFn]:
    """Register a verifier check under ``name``."""

    def register(fn: CheckFn) -> CheckFn:
        if name in CHECKS:
            raise ValueError(f"verifier check '{name}' is registered twice")
        CHECKS[name] = Check(name, summary, fn)
        return fn

    return register


# What the checks of one verifier run share (the module does not change while they run, so a
# result several checks derive from it, such as the parsed per-rank programs, is derived
# once per run); None outside a run.
_RUN_SHARED: ContextVar[dict[object, object] | None] = ContextVar("tessera_verifier_run", default=None)


def shared_in_run(key: object, derive: Callable[[], T]) -> T:
    """``derive()``, computed once per verifier run for ``key`` (every call outside a run)."""
    shared = _RUN_SHARED.get()
    if shared is None:
        return derive()
    if key not in shared:
        shared[key] = derive()
    return shared[key]  # type: ignore[return-value]


@contextmanager
def _one_run() -> Iterator[None]:
    token = _RUN_SHARED.set({})
    try:
        yield
    finally:
        _RUN_SHARED.reset(token)


def collect_errors(module: Module, checks: Iterable[str] | None = None) -> list[VerifyError]:
    """Every error of the named checks (all checks when ``checks`` is None)."""
    errors: list[VerifyError] = []
    with _one_run():
        for c in _selected(checks):
            errors.extend(c.run(module))
    return errors


def verify(module: Module, checks: Iterable[str] | None = None) -> None:
    """Raise the first VerifyError of the named checks (all checks when ``checks`` is None)."""
    with _one_run():
        for c in _selected(checks):
            for error in c.run(module):
                raise error


def verify_beside(module: Module) -> Callable[[], None]:
    """Start ``verify(module)`` in a forked process (``support.processes``) and return a function
    that waits for it and raises its first error, exactly as ``verify`` would have.

    For a caller with other work that only reads the module (printing it, rendering reports):
    the check runs on the other core meanwhile. The child sees the module as it is now, so it
    must not change before the wait. Where processes cannot fork, the module is verified now.
    """
    return beside(lambda: verify(module))


def _selected(checks: Iterable[str] | None) -> list[Check]:
    if checks is None:
        return list(CHECKS.values())
    selected = []
    for name in checks:
        if name not in CHECKS:
            raise ValueError(f"unknown verifier check '{name}'; known checks: {', '.join(CHECKS)}")
        selected.append(CHECKS[name])
    return selected


# ---------------------------------------------------------------------------
# Helpers


class _Reporter:
    """Builds errors of one check, with positions from ``module.locations``."""

    def __init__(self, check_name: str, module: Module):
        self.check = check_name
        self.module = module

    def error(self, message: str, location_key: str | None = None) -> VerifyError:
        line = column = None
        if location_key is not None and location_key in self.module.locations:
            line, column = self.module.locations[location_key]
        elif "module" in self.module.locations:
            line, column = self.module.locations["module"]
        return VerifyError(self.check, message, line, column, self.module.source)

    def task(self, task: Task, message: str) -> VerifyError:
        return self.error(f"task '@{task.name}' {message}", f"task:{task.name}")

    def layer(self, layer: Layer, message: str) -> VerifyError:
        return self.error(f"layer '@{layer.name}' {message}", f"layer:{layer.name}")

    def plan(self, op: PlanOp, message: str) -> VerifyError:
        return self.error(f"plan {op.op} '@{op.name}' {message}", f"plan:{op.name}")


def _kind(task: Task) -> str:
    try:
        return task.kind
    except AttributeError:  # op or phase is not an enum member: reported by other checks
        return f"{task.op}.{task.phase}"


def _is(task_field: object, member: object) -> bool:
    # Enum members compare equal to their strings (str-valued enums), so a task
    # built with plain strings still reads correctly.
    return task_field == member


def _walk_values(value: Value) -> Iterator[Value]:
    """Every value inside ``value``, each list once: a list built in Python may hold
    itself, or the same list many times over."""
    stack = [value]
    seen_lists: set[int] = set()
    while stack:
        v = stack.pop()
        if isinstance(v, list):
            if id(v) in seen_lists:
                continue
            seen_lists.add(id(v))
            stack.extend(v)
        yield v


# An attribute dictionary's owner, described only when a message needs it: a planned module has
# hundreds of thousands of plan entries, and spelling each one's description costs more than its check.
_Owner = tuple[str, str, PlanOp | None]  # (kind, name, the plan op of an entry)


def _all_attr_owners(module: Module) -> Iterator[tuple[_Owner, str, Attrs]]:
    """(owner, location key, attrs) of every attribute dictionary in the module; ``_owner_text``
    says the owner in words."""
    yield ("module", module.name, None), "module", module.attrs
    for layer in module.layers:
        yield ("layer", layer.name, None), f"layer:{layer.name}", layer.attrs
        for task in layer.tasks:
            yield ("task", task.name, None), f"task:{task.name}", task.attrs
    for op in module.plan:
        key = f"plan:{op.name}"
        yield ("plan", op.name, op), key, op.attrs
        for entry in op.entries:
            yield ("entry", entry.ref, op), key, entry.attrs


def _owner_text(owner: _Owner) -> str:
    kind, name, op = owner
    if kind == "module":
        return "the module header"
    if kind == "entry":
        assert op is not None
        return f"entry '@{name}' of plan {op.op} '@{op.name}'"
    if kind == "plan":
        assert op is not None
        return f"plan {op.op} '@{name}'"
    return f"{kind} '@{name}'"


# Attribute values that hold no reference, no list and no float: nothing inside them to check.
_PLAIN_SCALARS = (int, str, bool)


# ---------------------------------------------------------------------------
# Checks


_KIND_WORDS = {"layer": "layer", "task": "task", "plan": "plan op"}


@check("unique-names", "task, layer and plan op names are unique across the module")
def _unique_names(module: Module) -> Iterator[VerifyError]:
    r = _Reporter("unique-names", module)
    # One namespace: a SymbolRef must name exactly one entity.
    owner: dict[str, str] = {}
    count: dict[str, int] = {}

    def seen(kind: str, name: str) -> VerifyError | None:
        key = f"{kind}:{name}"
        count[key] = count.get(key, 0) + 1
        where = key if count[key] == 1 else f"{key}#{count[key]}"
        if name in owner:
            return r.error(
                f"{_KIND_WORDS[kind]} name '@{name}' is already used by a {_KIND_WORDS[owner[name]]}; rename one of them "
                "so that every reference names exactly one entity",
                where if where in module.locations else key,
            )
        owner[name] = kind
        return None

    for layer in module.layers:
        err = seen("layer", layer.name)
        if err:
            yield err
        for task in layer.tasks:
            err = seen("task", task.name)
            if err:
                yield err
    for op in module.plan:
        err = seen("plan", op.name)
        if err:
            yield err


@check("references-resolve", "task deps, @references in attributes and plan entries name existing entities")
def _references_resolve(module: Module) -> Iterator[VerifyError]:
    r = _Reporter("references-resolve", module)
    task_names = {t.name for t in module.tasks()}
    names = task_names | {layer.name for layer in module.layers} | {op.name for op in module.plan}
    for task in module.tasks():
        for dep in task.deps:
            if dep not in task_names:
                hint = "it names a layer or plan op, not a task" if dep in names else "no task has that name"
                yield r.task(task, f"depends on '@{dep}', but {hint}")
    for owner, key, attrs in _all_attr_owners(module):
        for attr_key, value in attrs.items():
            if type(value) in _PLAIN_SCALARS or type(value) is float:
                continue
            for v in _walk_values(value):
                if isinstance(v, SymbolRef) and v.name not in names:
                    yield r.error(
                        f"attribute '{attr_key}' of {_owner_text(owner)} refers to '@{v.name}', which is no task, "
                        "layer or plan op",
                        key,
                    )
    for op in module.plan:
        for entry in op.entries:
            if entry.ref not in names:
                yield r.plan(op, f"has an entry for '@{entry.ref}', which is no task, layer or plan op")


@check("acyclic-dependencies", "task dependencies form no cycle")
def _acyclic(module: Module) -> Iterator[VerifyError]:
    r = _Reporter("acyclic-dependencies", module)
    tasks = module.task_map()
    # Iterative depth-first search with colours; a grey successor closes a cycle.
    white, grey, black = 0, 1, 2
    colour = dict.fromkeys(tasks, white)
    for root in tasks:
        if colour[root] != white:
            continue
        path: list[str] = [root]
        iters: list[Iterator[str]] = [iter(tasks[root].deps)]
        colour[root] = grey
        while iters:
            dep = next(iters[-1], None)
            if dep is None:
                colour[path.pop()] = black
                iters.pop()
                continue
            if dep not in colour:
                continue  # dangling: references-resolve reports it
            if colour[dep] == grey:
                cycle = path[path.index(dep) :]
                chain = " -> ".join(f"@{n}" for n in [*cycle, dep])
                yield r.task(
                    tasks[dep],
                    f"is part of a dependency cycle: {chain} (each task depends on the next); "
                    "remove one of these dependencies",
                )
                return
            if colour[dep] == white:
                colour[dep] = grey
                path.append(dep)
                iters.append(iter(tasks[dep].deps))


@check("resource-matches-kind", "comm ops run on the comm stream, all others on compute")
def _resource_matches(module: Module) -> Iterator[VerifyError]:
    r = _Reporter("resource-matches-kind", module)
    for task in module.tasks():
        try:
            expected = resource_of(TaskOp(task.op))
        except ValueError:
            yield r.task(task, f"has unknown operation '{task.op}'")
            continue
        if not _is(task.resource, expected):
            got = task.resource.value if isinstance(task.resource, Resource) else task.resource
            yield r.task(task, f"of kind {_kind(task)} runs on '{got}' but must run on '{expected.value}'")


@check("phase-legal", "only ops that own weights have a wgrad task")
def _phase_legal(module: Module) -> Iterator[VerifyError]:
    r = _Reporter("phase-legal", module)
    for task in module.tasks():
        if not isinstance(task.phase, Phase):
            yield r.task(task, f"has unknown phase '{task.phase}'")
        elif _is(task.phase, Phase.WGRAD) and task.op not in WEIGHTED_OPS:
            yield r.task(task, f"is a wgrad of '{_op(task.op)}', which owns no weights and so has no weight gradient")


@check("movable-is-wgrad", "movable is true exactly for wgrad tasks")
def _movable(module: Module) -> Iterator[VerifyError]:
    r = _Reporter("movable-is-wgrad", module)
    for task in module.tasks():
        is_wgrad = _is(task.phase, Phase.WGRAD)
        if task.movable is not is_wgrad:
            if is_wgrad:
                yield r.task(task, "is a wgrad task but not movable; weight-gradient tasks are movable = true")
            else:
                yield r.task(task, f"is movable but is a {_kind(task)} task; only wgrad tasks may be movable")


@check("backward-mirrors-forward", "each layer's backward tasks mirror its forward tasks")
def _mirrors(module: Module) -> Iterator[VerifyError]:
    r = _Reporter("backward-mirrors-forward", module)
    for layer in module.layers:
        by_phase: dict[object, dict[object, Task]] = {Phase.FWD: {}, Phase.DGRAD: {}, Phase.WGRAD: {}}
        for task in layer.tasks:
            if task.phase in by_phase:
                by_phase[task.phase].setdefault(task.op, task)
        fwd, dgrad, wgrad = by_phase[Phase.FWD], by_phase[Phase.DGRAD], by_phase[Phase.WGRAD]
        for op, task in fwd.items():
            if op != TaskOp.EMBEDDING and op not in dgrad:
                yield r.task(task, f"has no {_op(op)}.dgrad task in layer '@{layer.name}'")
            if op in WEIGHTED_OPS and op not in wgrad:
                yield r.task(task, f"has no {_op(op)}.wgrad task in layer '@{layer.name}', though {_op(op)} owns weights")
        for phase_tasks in (dgrad, wgrad):
            for op, task in phase_tasks.items():
                if op not in fwd:
                    yield r.task(task, f"has no forward task {_op(op)}.fwd in layer '@{layer.name}' to mirror")


def _op(op: object) -> str:
    return op.value if isinstance(op, TaskOp) else str(op)


@check(
    "wgrad-after-gradient",
    "a wgrad task waits for the gradient it needs: its op's output gradient (what the dgrad waits for), and "
    "the dgrad itself for a block of several GEMMs",
)
def _wgrad_after_gradient(module: Module) -> Iterator[VerifyError]:
    r = _Reporter("wgrad-after-gradient", module)
    tasks = module.task_map()

    def reaches(start: Task, goal: Callable[[Task], bool]) -> bool:
        # Direct dependencies first: that is how every generated module spells it.
        for dep in start.deps:
            t = tasks.get(dep)
            if t is not None and goal(t):
                return True
        seen = {start.name}
        stack = list(start.deps)
        while stack:
            name = stack.pop()
            if name in seen or name not in tasks:
                continue
            seen.add(name)
            t = tasks[name]
            if goal(t):
                return True
            stack.extend(t.deps)
        return False

    for layer in module.layers:
        dgrads = {t.op: t for t in layer.tasks if _is(t.phase, Phase.DGRAD)}
        for task in layer.tasks:
            if not _is(task.phase, Phase.WGRAD):
                continue
            if _is(task.op, TaskOp.EMBEDDING):
                # The embedding has no dgrad of its own; its wgrad needs the gradient
                # flowing back from the first decoder layer.
                if not reaches(task, lambda t: _is(t.phase, Phase.DGRAD)):
                    yield r.task(task, "depends on no dgrad task; the embedding's weight gradient needs one")
                continue
            dgrad = dgrads.get(task.op)
            if dgrad is None:
                continue  # backward-mirrors-forward reports the missing dgrad
            if task.op not in WGRAD_FROM_OUTPUT_GRADIENT:
                if not reaches(task, _named(dgrad.name)):
                    yield r.task(
                        task,
                        f"does not depend, directly or transitively, on '@{dgrad.name}'; the weight gradient of a "
                        "block of several GEMMs needs the inner gradients its dgrad forms",
                    )
                continue
            # One GEMM: the output gradient (what the dgrad waits for) is enough, the dgrad too.
            for need in dgrad.deps:
                if need in tasks and not reaches(task, _named_any({need, dgrad.name})):
                    yield r.task(
                        task,
                        f"does not depend, directly or transitively, on '@{need}'; a weight gradient needs the "
                        f"gradient of its op's output, which '@{dgrad.name}' waits for",
                    )
                    break


def _named(name: str) -> Callable[[Task], bool]:
    return lambda t: t.name == name


def _named_any(names: set[str]) -> Callable[[Task], bool]:
    return lambda t: t.name in names


@check("forward-before-backward", "no forward task depends on a backward task")
def _forward_before_backward(module: Module) -> Iterator[VerifyError]:
    r = _Reporter("forward-before-backward", module)
    tasks = module.task_map()
    # A direct edge is enough: any fwd -> ... -> backward path has a direct fwd -> backward edge.
    for task in module.tasks():
        if not _is(task.phase, Phase.FWD):
            continue
        for dep in task.deps:
            d = tasks.get(dep)
            if d is not None and (_is(d.phase, Phase.DGRAD) or _is(d.phase, Phase.WGRAD)):
                yield r.task(task, f"is a forward task but depends on the backward task '@{dep}' ({_kind(d)})")


def _is_int(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _is_number(value: object) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


# Attributes passes attach, with the rule each must satisfy when present.
_PASS_ATTRS: dict[str, tuple[Callable[[Value], bool], str]] = {
    "duration_us": (lambda v: _is_number(v) and v >= 0, "a non-negative number of microseconds"),  # type: ignore[operator]
    "start": (lambda v: _is_number(v) and v >= 0, "a non-negative number"),  # type: ignore[operator]
    "deadline": (lambda v: _is_number(v) and v >= 0, "a non-negative number"),  # type: ignore[operator]
    "stream": (lambda v: v in ("compute", "comm"), 'either "compute" or "comm"'),
}


@check("attributes-legal", "core counts, shapes and well-known pass attributes have legal values")
def _attributes_legal(module: Module) -> Iterator[VerifyError]:
    r = _Reporter("attributes-legal", module)
    for task in module.tasks():
        for field_name in ("flops", "bytes", "param_bytes", "act_bytes"):
            value = getattr(task, field_name)
            if not _is_int(value) or value < 0:
                yield r.task(task, f"has {field_name} = {spell_value(value)}; it must be a non-negative integer")
        if task.op in COMM_OPS and task.flops != 0:
            yield r.task(task, f"is a communication task with flops = {task.flops}; comm tasks compute nothing (flops = 0)")
        shapes_ok = isinstance(task.shapes, list) and all(
            isinstance(s, list) and all(_is_int(d) and d > 0 for d in s) for s in task.shapes
        )
        if not shapes_ok:
            yield r.task(task, f"has shapes = {spell_value(task.shapes)}; shapes are lists of positive integers")
        if not isinstance(task.movable, bool):
            yield r.task(task, f"has movable = {spell_value(task.movable)}; it must be true or false")
    for owner, key, attrs in _all_attr_owners(module):
        pass_attrs = owner[0] == "task" or owner[0] == "entry"
        for attr_key, value in attrs.items():
            kind = type(value)
            if kind is float:
                if not math.isfinite(value):  # type: ignore[arg-type]
                    yield r.error(f"attribute '{attr_key}' of {_owner_text(owner)} is {value!r}; attribute floats must be finite", key)
                    continue
            elif kind not in _PLAIN_SCALARS:
                if isinstance(value, list) and value_depth(value) > MAX_VALUE_DEPTH:
                    # Checked first: the walk below and every message are safe, but printing is not.
                    yield r.error(
                        f"attribute '{attr_key}' of {_owner_text(owner)} nests lists more than {MAX_VALUE_DEPTH} deep, "
                        "the IR's limit; flatten it",
                        key,
                    )
                    continue
                bad = next((v for v in _walk_values(value) if isinstance(v, float) and not math.isfinite(v)), None)
                if bad is not None:
                    yield r.error(f"attribute '{attr_key}' of {_owner_text(owner)} is {bad!r}; attribute floats must be finite", key)
                    continue
            if pass_attrs and attr_key in _PASS_ATTRS:
                legal, rule = _PASS_ATTRS[attr_key]
                if not legal(value):
                    yield r.error(f"attribute '{attr_key}' of {_owner_text(owner)} is {spell_value(value)}; it must be {rule}", key)


@check("layer-order", "embedding first, decoders numbered 0..N-1 in order, head last")
def _layer_order(module: Module) -> Iterator[VerifyError]:
    r = _Reporter("layer-order", module)
    layers = module.layers
    next_index = 0
    for position, layer in enumerate(layers):
        if _is(layer.role, LayerRole.EMBEDDING) and position != 0:
            yield r.layer(layer, f"is an embedding layer at position {position}; the embedding layer must come first")
        if _is(layer.role, LayerRole.HEAD) and position != len(layers) - 1:
            yield r.layer(layer, f"is a head layer at position {position}; the head layer must come last")
        if _is(layer.role, LayerRole.DECODER):
            if layer.index != next_index:
                yield r.layer(
                    layer,
                    f"has decoder index {layer.index}, expected {next_index}; decoder layers are numbered "
                    "0, 1, 2, ... in order",
                )
            # Count by position, so one wrong index is one error, not one per later layer.
            next_index += 1
        elif layer.index is not None:
            role = layer.role.value if isinstance(layer.role, LayerRole) else layer.role
            yield r.layer(layer, f"is a {role} layer with index {layer.index}; only decoder layers have an index")


_MOE_OPS = (TaskOp.ROUTER, TaskOp.DISPATCH, TaskOp.EXPERT_GEMM, TaskOp.COMBINE)
_FFN_OPS = frozenset({*_MOE_OPS, TaskOp.SHARED_EXPERT, TaskOp.DENSE_MLP})
_MIXER_TASK_OPS = frozenset(MIXER_OPS.values())


@check("layer-kinds-match-tasks", "a layer's mixer and ffn kinds match the ops of its tasks")
def _layer_kinds(module: Module) -> Iterator[VerifyError]:
    r = _Reporter("layer-kinds-match-tasks", module)
    for layer in module.layers:
        ops = {t.op for t in layer.tasks}
        mixer_op = MIXER_OPS.get(layer.mixer)  # type: ignore[call-overload]
        mixer = layer.mixer.value if isinstance(layer.mixer, MixerKind) else layer.mixer
        ffn = layer.ffn.value if isinstance(layer.ffn, FfnKind) else layer.ffn
        if mixer_op is not None and mixer_op not in ops:
            yield r.layer(layer, f"has mixer = {mixer} but no {mixer_op.value} task")
        for op in sorted(str(_op(o)) for o in ops & _MIXER_TASK_OPS if o != mixer_op):
            yield r.layer(layer, f"has mixer = {mixer} but holds {op} tasks")
        if _is(layer.ffn, FfnKind.MOE):
            missing = [op.value for op in _MOE_OPS if op not in ops]
            if missing:
                yield r.layer(layer, f"has ffn = moe but lacks {', '.join(missing)} tasks")
            if TaskOp.DENSE_MLP in ops:
                yield r.layer(layer, "has ffn = moe but holds a dense_mlp task")
        elif _is(layer.ffn, FfnKind.DENSE):
            if TaskOp.DENSE_MLP not in ops:
                yield r.layer(layer, "has ffn = dense but no dense_mlp task")
            moe = sorted(_op(o) for o in ops & (_FFN_OPS - {TaskOp.DENSE_MLP}))
            if moe:
                yield r.layer(layer, f"has ffn = dense but holds MoE tasks ({', '.join(moe)})")
        else:
            ffn_ops = sorted(_op(o) for o in ops & _FFN_OPS)
            if ffn_ops:
                yield r.layer(layer, f"has ffn = {ffn} but holds feed-forward tasks ({', '.join(ffn_ops)})")


@check(
    "plan-ops-declared",
    "every plan op of a declared kind has its required attributes and entry attributes, of their declared types, "
    "its references name entities of the declared kinds, and it keeps its kind's own rules (tessera_ir/plan_ops.py)",
)
def _plan_ops_declared(module: Module) -> Iterator[VerifyError]:
    kind_of = plan_ops.entity_kinds(module)
    for op in module.plan:
        for problem in plan_ops.op_problems(op, kind_of):
            yield plan_ops.error_of(module, problem)


# Plan ops whose entries are a sequence, not a table: a program's instructions name a task once
# per micro-batch (tessera_ir/programs.py).
SEQUENCE_OPS = frozenset(kind for kind, definition in plan_ops.OP_DEFS.items() if definition.sequence)


@check("plan-entries-unique", "no plan op lists a task twice (programs, which are sequences, may)")
def _plan_entries_unique(module: Module) -> Iterator[VerifyError]:
    r = _Reporter("plan-entries-unique", module)
    for op in module.plan:
        if op.op in SEQUENCE_OPS:
            continue
        seen: set[str] = set()
        for entry in op.entries:
            if entry.ref in seen:
                yield r.plan(op, f"lists '@{entry.ref}' more than once; each entity gets one entry per plan op")
            seen.add(entry.ref)


# ---------------------------------------------------------------------------
# Pair schedules


# Times are compared as the overlap pass's checks compare them (tessera_ir.schedule_rules:
# within a 1e-6 us tolerance, decided exactly), since start times are sums of floats.
# A task attribute that fixes the task's duration when present; a schedule must use it.
TASK_DURATION_ATTR = "duration_us"


@dataclass
class _Slot:
    """One entry of a pair schedule, once its values are known to be legal."""

    task: Task
    start: float
    duration: float
    stream: str


def _side_layers(
    pair: PlanOp, side: str, layers: dict[str, Layer], ops: dict[str, PlanOp]
) -> tuple[list[Layer], str | None]:
    """The layers of a pair's ``side`` (``fwd`` or ``bwd``): its own list when it gives one, else
    the ``layers`` of the candidate its ``<side>_candidate`` names; or the reason they cannot be read."""
    value = pair.attrs.get(side)
    holder = f"pair '@{pair.name}'"
    if value is None:
        ref = pair.attrs.get(f"{side}_candidate")
        if ref is None:
            return [], None
        cand = ops.get(ref.name) if isinstance(ref, SymbolRef) else None
        if cand is None or cand.op != "candidate":
            return [], f"'{side}_candidate' of pair '@{pair.name}' is {spell_value(ref)}, which names no candidate"
        if "layers" not in cand.attrs:  # plan-ops-declared reports it
            return [], f"candidate '@{cand.name}' has no 'layers'"
        value, holder = cand.attrs["layers"], f"candidate '@{cand.name}'"
        side = "layers"
    if not isinstance(value, list) or not all(isinstance(v, SymbolRef) for v in value):
        return [], f"attribute '{side}' of {holder} must be a list of layers such as [@l0, @l1]"
    out: list[Layer] = []
    seen: set[str] = set()
    for ref in value:
        assert isinstance(ref, SymbolRef)
        if ref.name not in layers:
            return [], f"{holder} lists '@{ref.name}' under '{side}', which is no layer"
        if ref.name in seen:
            return [], f"{holder} lists layer '@{ref.name}' twice under '{side}'"
        seen.add(ref.name)
        out.append(layers[ref.name])
    return out, None


_SidesKey = tuple[tuple[str, ...], tuple[str, ...]]


def _pair_sides(
    pair: PlanOp, layers: dict[str, Layer], ops: dict[str, PlanOp],
    built: dict[_SidesKey, list[dict[str, Task]]] | None = None,
) -> tuple[list[dict[str, Task]], str | None]:
    """The two sides of a pair: the forward tasks of its forward layers and the dgrad and
    wgrad tasks of its backward layers, each by name; or the reason they cannot be built.
    ``built`` keeps the sides by their layers' names for the next pair of the same layers
    (thousands of pairs, one per pair of micro-batches, share a few dozen layer combinations)."""
    if not any(k in pair.attrs for k in ("fwd", "bwd", "fwd_candidate", "bwd_candidate")):
        return [], f"pair '@{pair.name}' names no layers (neither 'fwd'/'bwd' lists nor candidates)"
    side_layers: list[list[Layer]] = []
    for side in ("fwd", "bwd"):
        found, problem = _side_layers(pair, side, layers, ops)
        if problem is not None:
            return [], problem
        side_layers.append(found)
    key = (tuple(layer.name for layer in side_layers[0]), tuple(layer.name for layer in side_layers[1]))
    if built is not None and key in built:
        return built[key], None
    sides: list[dict[str, Task]] = []
    for found, phases in zip(side_layers, ((Phase.FWD,), (Phase.DGRAD, Phase.WGRAD))):
        tasks: dict[str, Task] = {}
        for layer in found:
            for task in layer.tasks:
                if task.phase in phases:
                    tasks.setdefault(task.name, task)
        sides.append(tasks)
    if built is not None:
        built[key] = sides
    return sides, None


def _entry_slot(r: _Reporter, sched: PlanOp, entry_attrs: Attrs, task: Task) -> tuple[_Slot | None, list[VerifyError]]:
    errors: list[VerifyError] = []
    numbers: dict[str, float] = {}
    where = f"entry:{sched.name}:{task.name}"  # where an error points (the entry's line)
    for name in ("start", "duration"):
        value = entry_attrs.get(name)
        if type(value) is float and value >= 0.0 and value != math.inf:  # the common case, first
            numbers[name] = value
        elif value is None:
            errors.append(r.error(f"entry '@{task.name}' of pair_schedule '@{sched.name}' has no '{name}'", where))
        elif not _is_number(value) or not math.isfinite(value) or value < 0:  # type: ignore[arg-type, operator]
            errors.append(
                r.error(
                    f"entry '@{task.name}' of pair_schedule '@{sched.name}' has {name} = {spell_value(value)}; "
                    "it must be a finite non-negative number of microseconds",
                    where,
                )
            )
        else:
            numbers[name] = float(value)  # type: ignore[arg-type]
    stream = entry_attrs.get("stream")
    resource = task.resource.value if isinstance(task.resource, Resource) else str(task.resource)
    if stream != resource:
        spelled = "no 'stream'" if stream is None else f"stream = {spell_value(stream)}"
        errors.append(
            r.error(
                f"entry '@{task.name}' of pair_schedule '@{sched.name}' has {spelled}, but the task runs on "
                f'"{resource}"; a task is scheduled on the stream of its resource',
                where,
            )
        )
    if errors:
        return None, errors
    slot = _Slot(task, numbers["start"], numbers["duration"], resource)
    fixed = task.attrs.get(TASK_DURATION_ATTR)
    if _is_number(fixed) and math.isfinite(fixed):  # type: ignore[arg-type]
        fixed_us = float(fixed)  # type: ignore[arg-type]
        if not (at_least(slot.duration, fixed_us) and at_least(fixed_us, slot.duration)):
            errors.append(
                r.error(
                    f"entry '@{task.name}' of pair_schedule '@{sched.name}' lasts {slot.duration} us, but the task's "
                    f"{TASK_DURATION_ATTR} is {fixed_us} us; rerun overlap-schedule after changing durations",
                    where,
                )
            )
    return slot, errors


@check(
    "schedules-valid",
    "every pair_schedule schedules its pair: each task once on its resource's stream, finite non-negative "
    "times, after its dependencies, one task at a time per stream, movable tasks by their deadline",
)
def _schedules_valid(module: Module) -> Iterator[VerifyError]:
    r = _Reporter("schedules-valid", module)
    ops: dict[str, PlanOp] = {}
    for op in module.plan:
        ops.setdefault(op.name, op)
    layers: dict[str, Layer] = {}
    for layer in module.layers:
        layers.setdefault(layer.name, layer)
    fix = "rerun the overlap-schedule pass to rebuild the schedule"
    built: dict[_SidesKey, list[dict[str, Task]]] = {}
    for sched in module.plan:
        if sched.op != "pair_schedule":
            continue
        pairs = sched.attrs.get("pairs")
        if not isinstance(pairs, list) or not pairs:
            yield r.plan(sched, "names no pair; a pair_schedule lists the pairs it schedules as pairs = [@pair.0, ...]")
            continue
        pair_ops: list[PlanOp] = []
        for ref in pairs:
            pair_op = ops.get(ref.name) if isinstance(ref, SymbolRef) else None
            if pair_op is None or pair_op.op != "pair":
                yield r.plan(sched, f"lists {spell_value(ref)} under 'pairs', which is no pair op")
                break
            pair_ops.append(pair_op)
        else:
            yield from _check_schedule(r, sched, pair_ops, layers, ops, fix, built)


def _check_schedule(
    r: _Reporter, sched: PlanOp, pair_ops: list[PlanOp], layers: dict[str, Layer], ops: dict[str, PlanOp], fix: str,
    built: dict[_SidesKey, list[dict[str, Task]]],
) -> Iterator[VerifyError]:
    # The entries name the tasks of the first pair; pairs that share the schedule have
    # identical DAGs, matched to it position by position.
    sides, problem = _pair_sides(pair_ops[0], layers, ops, built)
    if problem is not None:
        yield r.plan(sched, f"cannot be checked: {problem}")
        return
    task_count = sum(len(side) for side in sides)
    for other in pair_ops[1:]:
        other_sides, other_problem = _pair_sides(other, layers, ops, built)
        if other_problem is None and sum(len(side) for side in other_sides) != task_count:
            other_problem = f"pair '@{other.name}' has {sum(len(s) for s in other_sides)} tasks, not {task_count}"
        if other_problem is not None:
            yield r.plan(sched, f"is shared by pairs that differ: {other_problem}; {fix}")
    side_of = {name: k for k, side in enumerate(sides) for name in side}
    in_pair = {name: task for side in sides for name, task in side.items()}
    first = pair_ops[0].name
    slots: dict[str, _Slot] = {}
    counts: dict[str, int] = {}
    for entry in sched.entries:
        task = in_pair.get(entry.ref)
        if task is None:
            yield r.error(
                f"pair_schedule '@{sched.name}' has an entry for '@{entry.ref}', which is not a task of pair "
                f"'@{first}' (its forward layers' forward tasks and its backward layers' dgrad and wgrad tasks)",
                f"entry:{sched.name}:{entry.ref}",
            )
            continue
        counts[entry.ref] = counts.get(entry.ref, 0) + 1
        if counts[entry.ref] == 2:
            yield r.error(
                f"pair_schedule '@{sched.name}' places task '@{entry.ref}' more than once", f"entry:{sched.name}:{entry.ref}"
            )
        if counts[entry.ref] > 1:
            continue
        slot, errors = _entry_slot(r, sched, entry.attrs, task)
        yield from errors
        if slot is not None:
            slots[entry.ref] = slot
    missing = [name for name in in_pair if name not in counts]
    if missing:
        shown = ", ".join(f"@{name}" for name in missing[:5]) + (f" and {len(missing) - 5} more" if len(missing) > 5 else "")
        yield r.plan(sched, f"has no entry for {shown} of pair '@{first}'; every task of the pair is placed once; {fix}")

    def at(name: str) -> str:
        return f"entry:{sched.name}:{name}"

    # Dependencies, deadlines and one task at a time per stream: the conditions the overlap
    # pass checks every schedule against (tessera_ir.schedule_rules), on the entries' own values.
    names = list(slots)
    index = {name: k for k, name in enumerate(names)}
    found = violations(
        names,
        [slots[n].start for n in names],
        [slots[n].duration for n in names],
        [slots[n].stream for n in names],
        [slots[n].stream for n in names],
        [slots[n].duration for n in names],
        # A dependency outside the pair's side is ready when the pair starts.
        [[index[d] for d in slots[n].task.deps if d in index and side_of.get(d) == side_of[n]] for n in names],
        [_deadline(slots[n].task) for n in names],
    )
    for v in found:
        if v.rule == "dependency":
            dep, name = v.tasks
            before, slot = slots[dep], slots[name]
            yield r.error(
                f"pair_schedule '@{sched.name}' starts '@{name}' at {slot.start} us, before its dependency "
                f"'@{dep}' finishes at {before.start + before.duration} us; {fix}",
                at(name),
            )
        elif v.rule == "deadline":
            slot = slots[v.tasks[0]]
            yield r.error(
                f"pair_schedule '@{sched.name}' finishes movable task '@{v.tasks[0]}' at {slot.start + slot.duration} us, "
                f"after its deadline {_deadline(slot.task)} us; {fix}",
                at(v.tasks[0]),
            )
        elif v.rule == "exclusive":
            a, b = slots[v.tasks[0]], slots[v.tasks[1]]
            yield r.error(
                f"pair_schedule '@{sched.name}' runs '@{a.task.name}' [{a.start}, {a.start + a.duration}) and "
                f"'@{b.task.name}' [{b.start}, {b.start + b.duration}) us on the {a.stream} stream at once; "
                f"a stream runs one task at a time; {fix}",
                at(b.task.name),
            )
        else:  # stream, duration and non-negative were decided entry by entry above
            yield r.plan(sched, f"violates {v.rule} for {', '.join(v.tasks)}: {v.detail}; {fix}")


def _deadline(task: Task) -> float | None:
    deadline = task.attrs.get("deadline")
    if task.movable is True and _is_number(deadline) and math.isfinite(deadline):  # type: ignore[arg-type]
        return float(deadline)  # type: ignore[arg-type]
    return None


# Checks of plan ops that later passes add live in their own modules and register themselves here.
from tessera_ir import dbo_checks, program_checks  # noqa: E402, F401
