"""Pass infrastructure: the pass base class, typed options, the registry, pipeline parsing, the manager.

A pass is a frozen dataclass whose fields are its options; ``name`` is its kebab-case
command-line name. Option types say what a value may be: ``bool``, ``int``, ``float``,
``str``, ``Literal[...]`` for a fixed set of choices, a union of those (``float |
Literal["auto"]``), and ``... | None`` for an option that may be left unset (its default
is then None, never a magic 0 or ""). Declare an option with ``option(default, help)``.

A pipeline is spelled ``a,b{opt=v other=w},c`` (options separated by spaces or commas;
a value with spaces or braces in double quotes). It is parsed by a small grammar
(``PIPELINE_GRAMMAR``, lark) and every option is converted and checked against its type
when the pipeline is parsed, before any pass runs.

The manager verifies the module after every pass that changed it and, on failure, names
the pass that failed and the ones that ran before it.
"""

from __future__ import annotations

import dataclasses
import importlib
import time
import types
from abc import ABC, abstractmethod
from collections.abc import Callable, Iterable, Sequence
from contextvars import ContextVar
from dataclasses import dataclass, field
from functools import cache
from typing import Any, ClassVar, Literal, Union, get_args, get_origin, get_type_hints

from support.collector import frozen_heap
from tessera_ir.errors import TesseraError
from tessera_ir.model import Module


class PassError(TesseraError):
    """A pass could not run, or left an invalid module, or a pipeline that cannot be built."""


def option(default: Any, help: str) -> Any:  # noqa: A002 (the word every CLI uses)
    """A pass option: its default and a one-line help text (``tessera-opt --list-passes`` shows both)."""
    return field(default=default, metadata={"help": help})


class ModulePass(ABC):
    """Base class of every pass. Subclasses are frozen dataclasses; their fields are options.

    Option values are checked against their types on construction; a subclass with further
    rules (ranges, combinations) checks them in ``check()``, raising ``PassError``.
    """

    name: ClassVar[str]
    summary: ClassVar[str]
    # The plan op kinds the pass reads and those it adds (as torch.fx pass infra's requires and
    # ensures): a pipeline is refused, before any pass runs, when a pass needs a kind that neither
    # the module holds nor a pass before it makes (check_pipeline).
    requires: ClassVar[tuple[str, ...]] = ()
    produces: ClassVar[tuple[str, ...]] = ()

    def __post_init__(self) -> None:
        hints = _option_types(type(self))
        for f in dataclasses.fields(self):  # type: ignore[arg-type]
            value = getattr(self, f.name)
            if not _conforms(value, hints[f.name]):
                raise PassError(
                    f"option '{_spell(f.name)}' of pass '{self.name}' is {value!r}; it takes {type_text(hints[f.name])}"
                )
        self.check()

    def check(self) -> None:  # noqa: B027 (optional hook: most passes have no further rules)
        """Further rules on the options (called on construction); raise ``PassError``."""

    @abstractmethod
    def apply(self, module: Module) -> bool:
        """Rewrite ``module`` in place; return whether anything changed."""

    def spelling(self) -> str:
        """The pipeline text that recreates this pass with its options."""
        opts = []
        for f in dataclasses.fields(self):  # type: ignore[arg-type]
            value = getattr(self, f.name)
            if value != f.default:
                opts.append(f"{_spell(f.name)}={_value_text(value)}")
        return self.name + ("{" + " ".join(opts) + "}" if opts else "")


def _spell(field_name: str) -> str:
    return field_name.replace("_", "-")


def _value_text(value: Any) -> str:
    if isinstance(value, bool):
        return str(value).lower()
    text = str(value)
    return f'"{text}"' if any(c.isspace() or c in ',{}="' for c in text) else text


# name -> "module:Class". Lazy, so that listing passes imports no solver.
PASS_REGISTRY: dict[str, str] = {
    "verify": "passes.verify_pass:VerifyPass",
    "candidates": "passes.candidates:CandidatesPass",
    "wgrad-deadlines": "passes.wgrad_deadlines:WgradDeadlinesPass",
    "overlap-schedule": "passes.overlap_schedule:OverlapSchedulePass",
    "profile": "passes.profile:ProfilePass",
    "partition": "passes.partition:PartitionPass",
    "refine-bottleneck": "passes.refine_bottleneck:RefineBottleneckPass",
    "dbo-slots": "passes.dbo_slots:DboSlotsPass",
    "measured-durations": "passes.measured_durations:MeasuredDurationsPass",
    "measured-pairs": "passes.measured_pairs:MeasuredPairsPass",
    "pipeline": "passes.pipeline:PipelinePass",
}


def get_pass_class(name: str) -> type[ModulePass]:
    if name not in PASS_REGISTRY:
        known = ", ".join(sorted(PASS_REGISTRY))
        raise PassError(f"unknown pass '{name}'; known passes: {known}")
    module_name, class_name = PASS_REGISTRY[name].split(":")
    cls = getattr(importlib.import_module(module_name), class_name)
    assert issubclass(cls, ModulePass)
    return cls


# ---------------------------------------------------------------------------- option types


@cache
def _option_types(cls: type) -> dict[str, Any]:
    return get_type_hints(cls)


def _union_members(typ: Any) -> tuple[Any, ...] | None:
    if get_origin(typ) in (Union, types.UnionType):
        return get_args(typ)
    return None


def _conforms(value: Any, typ: Any) -> bool:
    members = _union_members(typ)
    if members is not None:
        return any(_conforms(value, m) for m in members)
    if typ is type(None):
        return value is None
    if get_origin(typ) is Literal:
        return value in get_args(typ)
    if typ is bool:
        return isinstance(value, bool)
    if typ is int:
        return isinstance(value, int) and not isinstance(value, bool)
    if typ is float:
        return isinstance(value, (int, float)) and not isinstance(value, bool)
    if typ is str:
        return isinstance(value, str)
    return True  # a type this checker does not know: trust the pass


def type_text(typ: Any) -> str:
    """How an option's type reads: ``int``, ``window|global``, ``float or auto``, ``float (optional)``."""
    members = _union_members(typ)
    if members is not None:
        shown = [type_text(m) for m in members if m is not type(None)]
        text = " or ".join(shown)
        return f"{text} (optional)" if type(None) in members else text
    if get_origin(typ) is Literal:
        return "|".join(str(a) for a in get_args(typ))
    return getattr(typ, "__name__", str(typ))


def _convert(text: str, typ: Any) -> Any:
    """``text`` as a value of ``typ``; ValueError when it is none."""
    members = _union_members(typ)
    if members is not None:
        # Fixed choices first, so that "auto" in `float | Literal["auto"]` is the choice.
        ordered = sorted((m for m in members if m is not type(None)), key=lambda m: get_origin(m) is not Literal)
        for m in ordered:
            try:
                return _convert(text, m)
            except ValueError:
                continue
        raise ValueError(text)
    if get_origin(typ) is Literal:
        for choice in get_args(typ):
            if text == str(choice):
                return choice
        raise ValueError(text)
    if typ is bool:
        if text.lower() in ("true", "1", "yes", "on"):
            return True
        if text.lower() in ("false", "0", "no", "off"):
            return False
        raise ValueError(text)
    if typ in (int, float, str):
        return typ(text)
    raise ValueError(text)


@dataclass(frozen=True)
class OptionInfo:
    """One option as ``--list-passes`` shows it."""

    name: str  # as spelled on the command line
    type: str
    default: str
    help: str


def describe_options(cls: type[ModulePass]) -> list[OptionInfo]:
    hints = _option_types(cls)
    return [
        OptionInfo(
            _spell(f.name), type_text(hints[f.name]), "unset" if f.default is None else _value_text(f.default),
            f.metadata.get("help", ""),
        )
        for f in dataclasses.fields(cls)  # type: ignore[arg-type]
    ]


def instantiate_pass(name: str, options: dict[str, str]) -> ModulePass:
    """The pass ``name`` with options given as text, each converted to its option's type."""
    cls = get_pass_class(name)
    hints = _option_types(cls)
    fields = {f.name: f for f in dataclasses.fields(cls)}  # type: ignore[arg-type]
    kwargs = {}
    for raw_key, text in options.items():
        key = raw_key.replace("-", "_")
        if key not in fields:
            known = ", ".join(_spell(k) for k in fields) or "none"
            raise PassError(f"pass '{name}' has no option '{raw_key}'; its options: {known}")
        try:
            kwargs[key] = _convert(text, hints[key])
        except ValueError:
            raise PassError(
                f"option '{_spell(key)}' of pass '{name}' takes {type_text(hints[key])}, got '{text}'"
            ) from None
    return cls(**kwargs)


# ---------------------------------------------------------------------------- pipeline text

PIPELINE_GRAMMAR = r"""
    pipeline: pass_spec ("," pass_spec)*
    pass_spec: NAME options?
    options: "{" (option (","? option)*)? "}"
    option: KEY "=" (WORD | STRING)

    NAME: /[A-Za-z][A-Za-z0-9_-]*/
    KEY: /[A-Za-z_][A-Za-z0-9_-]*/
    WORD: /[^\s,{}="]+/
    STRING: /"[^"]*"/

    %import common.WS
    %ignore WS
"""

_EXPECTED_WORDS = {
    "NAME": "a pass name", "KEY": "an option name", "WORD": "a value", "STRING": "a value", "COMMA": "','",
    "LBRACE": "'{'", "RBRACE": "'}'", "EQUAL": "'='", "$END": "the end",
}


@cache
def _pipeline_parser() -> Any:
    from lark import Lark

    return Lark(PIPELINE_GRAMMAR, start="pipeline", parser="lalr")


def parse_pipeline(spec: str, available: Iterable[str] | None = None) -> list[ModulePass]:
    """Parse ``a,b{opt=v other=w}`` into pass instances, every option converted and checked.

    ``available``: the plan op kinds the module it will run on holds (none, for a module just
    captured), when known now: a pass that needs ops no pass before it makes is then refused
    here (:func:`check_pipeline`); otherwise the pass manager checks that before its first pass.
    """
    from lark import Token, Tree
    from lark.exceptions import UnexpectedCharacters, UnexpectedInput, UnexpectedToken

    try:
        tree = _pipeline_parser().parse(spec)
    except UnexpectedInput as err:
        column = err.column if isinstance(err.column, int) and err.column > 0 else len(spec) + 1
        if isinstance(err, UnexpectedToken) and err.token.type == "$END":
            found, column = "the end", len(spec) + 1
        elif isinstance(err, UnexpectedCharacters) and err.pos_in_stream is not None:
            found = repr(spec[err.pos_in_stream])
        else:
            found = repr(str(getattr(err, "token", "")))
        terminals = getattr(err, "expected", None) or getattr(err, "allowed", None) or ()
        expected = sorted({_EXPECTED_WORDS.get(t, t) for t in terminals})
        raise PassError(
            f"pipeline '{spec}': found {found} at column {column}, expected {' or '.join(expected) or 'something else'}; "
            "write passes as name{option=value ...} separated by commas"
        ) from None
    passes = []
    for spec_tree in tree.children:
        assert isinstance(spec_tree, Tree)
        name = str(spec_tree.children[0])
        options: dict[str, str] = {}
        if len(spec_tree.children) > 1:
            for opt in spec_tree.children[1].children:  # type: ignore[union-attr]
                key, value = opt.children  # type: ignore[union-attr]
                assert isinstance(key, Token) and isinstance(value, Token)
                if str(key) in options:
                    raise PassError(f"pass '{name}' sets option '{key}' twice in pipeline '{spec}'")
                options[str(key)] = value[1:-1] if value.type == "STRING" else str(value)
        passes.append(instantiate_pass(name, options))
    if available is not None:
        check_pipeline(passes, available, spec)
    return passes


def check_pipeline(passes: Sequence[ModulePass], available: Iterable[str], spec: str | None = None) -> None:
    """Refuse ``passes`` when one of them needs a plan op kind (its ``requires``) that neither the
    module (holding the kinds ``available``) nor a pass before it (their ``produces``) provides;
    the error names the pass, the missing kind and the pass that makes it."""
    have = set(available)
    for k, p in enumerate(passes):
        missing = [kind for kind in p.requires if kind not in have]
        if missing:
            kind = missing[0]
            later = [q.name for q in passes[k + 1:] if kind in q.produces]
            if later:
                fix = f"'{later[0]}' makes them, but runs after it here: move '{later[0]}' before '{p.name}'"
            else:
                makers = [n for n in sorted(PASS_REGISTRY) if kind in get_pass_class(n).produces]
                fix = f"run {' or '.join(repr(n) for n in makers) or 'the planning passes'} before it"
            text = spec if spec is not None else ",".join(q.spelling() for q in passes)
            raise PassError(
                f"pipeline '{text}': pass '{p.name}' needs the plan's '{kind}' ops, but the module holds no {kind} op "
                f"and no pass before it makes one; {fix}"
            )
        have.update(p.produces)


# ---------------------------------------------------------------------------- running


@dataclass
class PassTiming:
    name: str
    seconds: float
    modified: bool
    parts: list[tuple[str, float]] = field(default_factory=list)  # what the pass timed inside itself
    verify_seconds: float = 0.0  # the verifier's run on the pass's result
    finish_seconds: float = 0.0  # waiting, after the last pass, for work the pass left running (finish_later)


_TIMING_PARTS: ContextVar[list[tuple[str, float]] | None] = ContextVar("tessera_pass_timing_parts", default=None)


def without_cache(p: ModulePass) -> ModulePass:
    """``p`` with its ``cache`` option off when it has one (``--no-cache``), else ``p`` itself."""
    if "cache" in {f.name for f in dataclasses.fields(p)}:  # type: ignore[arg-type]
        return dataclasses.replace(p, cache=False)  # type: ignore[type-var]
    return p


def _nothing() -> None:
    pass


@dataclass
class _Unfinished:
    label: str
    finish: Callable[[], None]
    cancel: Callable[[], None]


_UNFINISHED: ContextVar[list[_Unfinished] | None] = ContextVar("tessera_unfinished_work", default=None)


def finish_later(label: str, finish: Callable[[], None], cancel: Callable[[], None]) -> None:
    """Let the running pass manager call ``finish`` after the last pass instead of now.

    For a pass's own checks that can run in the background while later passes go on (their
    results change nothing in the IR): ``finish`` waits for them and raises what they found,
    as the pass would have; ``cancel`` stops them when the pipeline fails first. Outside a pass
    manager ``finish`` runs at once, so the pass keeps its meaning when applied on its own.
    """
    unfinished = _UNFINISHED.get()
    if unfinished is None:
        finish()
    else:
        unfinished.append(_Unfinished(label, finish, cancel))


def note_time(label: str, seconds: float) -> None:
    """Record how long a part of the running pass took (``--timing`` shows it under the pass).

    Timings stay out of the IR, so that the same compile prints the same text every time.
    """
    parts = _TIMING_PARTS.get()
    if parts is not None:
        parts.append((label, seconds))


@dataclass
class PassManager:
    """Runs passes in order on a module.

    ``verify_each``: the verifier runs after every pass that changed the module, so a broken
    invariant is pinned on the pass that broke it (what tests and ``--verify-each`` want).
    ``verify_end``: it runs once on the result instead (what a compile needs: the same
    guarantee on what is written, at a fraction of the time). Work a pass left running in the
    background (:func:`finish_later`) is finished after the last pass, before the final check.
    """

    passes: list[ModulePass]
    verify_each: bool = True
    dump_after: Callable[[ModulePass, Module], None] | None = None
    timings: list[PassTiming] = field(default_factory=list)
    verify_end: bool = False
    verify_end_seconds: float = 0.0

    def run(self, module: Module) -> Module:
        from tessera_ir.verifier import verify

        check_pipeline(self.passes, {op.op for op in module.plan})
        ran: list[str] = []
        unfinished: list[_Unfinished] = []
        owners: list[int] = []  # for each unfinished work, the index of the pass that left it
        token = _UNFINISHED.set(unfinished)
        try:
            for p in self.passes:
                self._apply(p, module, ran)
                owners += [len(ran) - 1] * (len(unfinished) - len(owners))
            for work, owner in zip(unfinished, owners):
                start = time.perf_counter()
                work.cancel = _nothing  # finish() waits for it, whatever it raises
                try:
                    work.finish()
                except TesseraError as err:
                    p = self.passes[owner]
                    raise PassError(self._context(p, ran[:owner]) + str(err)) from err
                finally:
                    self.timings[owner].finish_seconds += time.perf_counter() - start
        finally:
            _UNFINISHED.reset(token)
            for work in unfinished:
                work.cancel()
        if self.verify_end and not self.verify_each and self.passes:
            start = time.perf_counter()
            try:
                verify(module)
            except TesseraError as err:
                raise PassError(
                    f"the module after passes {','.join(ran)} is invalid (verify after each pass to find the pass "
                    f"that broke it: --verify-each): {err}"
                ) from err
            self.verify_end_seconds = time.perf_counter() - start
        return module

    def _apply(self, p: ModulePass, module: Module, ran: list[str]) -> None:
        from tessera_ir.verifier import verify

        parts: list[tuple[str, float]] = []
        token = _TIMING_PARTS.set(parts)
        start = time.perf_counter()
        try:
            with frozen_heap():
                modified = p.apply(module)
        except TesseraError as err:
            raise PassError(self._context(p, ran) + str(err)) from err
        finally:
            _TIMING_PARTS.reset(token)
        seconds = time.perf_counter() - start
        self.timings.append(PassTiming(p.name, seconds, bool(modified), parts))
        if self.verify_each and modified:
            start = time.perf_counter()
            try:
                verify(module)
            except TesseraError as err:
                raise PassError(self._context(p, ran) + "left an invalid module: " + str(err)) from err
            self.timings[-1].verify_seconds = time.perf_counter() - start
        ran.append(p.spelling())
        if self.dump_after is not None:
            self.dump_after(p, module)

    @staticmethod
    def _context(p: ModulePass, ran: list[str]) -> str:
        before = ",".join(ran) if ran else "(none)"
        return f"pass '{p.spelling()}' failed (passes run before it: {before}): "
