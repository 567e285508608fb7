"""The fast path of the IR parser: text laid out line by line as the printer writes it.

``parse_lines(text)`` returns the module, or ``None`` as soon as the text
leaves the layout it knows; ``parse_module`` then runs the grammar parser
(``grammar.lark``), which stays the definition of the language: it parses
whatever this path declines and reports every error with its line and column.
This path never reports an error, and it accepts only text the grammar accepts,
building the identical module (values, types, key order, locations);
``tests/ir/test_fuzz.py`` holds the two parsers to that over thousands of
mutated files.

The layout: one construct per line (module header, layer header, task, plan op,
plan entry, closing ``}``), blank lines and whole-line ``//`` comments between
them, blanks or tabs between tokens. Each line is matched by one regular
expression. The attribute dictionaries, which are most of the text, are joined
and decoded in one call of the standard library's JSON decoder (C), after two
substitutions turn ``key = `` into ``"key": `` and ``@name`` into
``{"@": "name"}``. What JSON would take and the grammar would not is ruled out
first, outside string literals: a ``:``, a ``{`` or ``}`` inside a dictionary,
the bare word ``null``; ``NaN`` and ``Infinity`` are refused by the decoder's
``parse_constant``, numbers too large for a float by ``parse_float`` and
``parse_int`` (an integer past the largest float is refused as the grammar parser
refuses it: no pass could compute with it), keys
given twice by counting keys. Everything else the grammar forbids, JSON forbids
too (numbers with leading zeros, trailing or missing commas, bare words,
unknown escapes, control characters in strings).

The printer's own spelling of a task's core fields and of a schedule entry (most
of a planned module) is read by a regular expression without the JSON decoder.

Measured on modules of 2 to 50 MB (``bench/bench_parse.py``), this path reads
ten to twenty times faster than the grammar parser, which lark drives token by
token in Python. It leaves the garbage collector alone; the command-line tools
pause it around the parse (``tessera.driver.Run.parse_ir``), where it would
otherwise take close to half the time of a large module.
"""

from __future__ import annotations

import json
import math
import re
import sys
from typing import Any

from tessera_ir.kinds import FfnKind, LayerRole, MixerKind, Phase, Resource, TaskOp
from tessera_ir.model import (
    CORE_TASK_FIELDS,
    MAX_VALUE_DEPTH,
    Attrs,
    Layer,
    Module,
    PlanEntry,
    PlanOp,
    SymbolRef,
    Task,
    value_depth,
)

# The grammar's terminals (grammar.lark), as this path needs them.
_NAME = r"@([A-Za-z0-9_][A-Za-z0-9_.\-]*)"
_WORD = r"[A-Za-z_][A-Za-z0-9_.\-]*"
_STRING_PATTERN = r'"(?:[^"\\\x00-\x1f]|\\[^\x00-\x1f])*"'
_GAP = r"[ \t]+"
_OPT = r"[ \t]*"
_DICT = r"(\{.*\})"
# Blanks before a line's first token (group 1: its column) and after its last.
_LEAD = r"([ \t\r]*)"
_TAIL = r"[ \t\r]*"

_MODULE_LINE = re.compile(rf"{_LEAD}module{_GAP}{_NAME}(?:{_OPT}{_DICT})?{_OPT}\{{{_TAIL}")
_LAYER_LINE = re.compile(
    rf"{_LEAD}layer{_GAP}{_NAME}{_GAP}({_WORD})(?:{_GAP}([0-9]+))?{_GAP}({_STRING_PATTERN}){_GAP}"
    rf"mixer{_OPT}={_OPT}({_WORD}){_GAP}ffn{_OPT}={_OPT}({_WORD})(?:{_OPT}{_DICT})?{_OPT}\{{{_TAIL}"
)
_TASK_LINE = re.compile(
    rf"{_LEAD}task{_GAP}{_NAME}{_OPT}={_OPT}({_WORD}){_GAP}on{_GAP}({_WORD})"
    rf"(?:{_GAP}after{_OPT}\({_OPT}(@[^)]*?){_OPT}\))?{_OPT}{_DICT}{_TAIL}"
)
_PLAN_LINE = re.compile(rf"{_LEAD}plan{_GAP}({_WORD}){_GAP}{_NAME}{_OPT}{_DICT}(?:{_OPT}(\{{))?{_TAIL}")
_ENTRY_LINE = re.compile(rf"{_LEAD}{_NAME}{_OPT}{_DICT}{_TAIL}")
_DEPS = re.compile(rf"{_NAME}(?:{_OPT},{_OPT}{_NAME})*")
_DEP_SPLIT = re.compile(rf"{_OPT},{_OPT}@")

_STRING = re.compile(_STRING_PATTERN)
# A key and its '=', after the '{' or ',' before it (kept). Every key of a dictionary
# follows one of the two, and starting from them lets the regex engine skip to the next
# one in C and try each word once, not once per character.
_KEY = re.compile(rf"([{{,]{_OPT})({_WORD}){_OPT}=")
_SYMBOL = re.compile(_NAME)
# ``null`` as a value (JSON would read None); inside a name or as a key it is harmless.
_NULL = re.compile(r"(?<![A-Za-z0-9_.\-@])null(?![A-Za-z0-9_.\-]|[ \t]*=)")
_QUOTED_KEY = '"{}": '.format
_SYMBOL_OBJECT = '{{"@": "{}"}}'.format

# The printer's own spelling of a task's core fields and of a schedule entry, read without
# the JSON decoder or any key rewriting (the bulk of a planned module). Anything spelled
# otherwise takes the general path.
_INT = r"-?[0-9]+"
_NUMBER = r"-?[0-9]+(?:\.[0-9]+)?(?:[eE][+-]?[0-9]+)?"
_CORE_FIELDS = re.compile(
    rf"\{{flops = ({_INT}), bytes = ({_INT}), param_bytes = ({_INT}), act_bytes = ({_INT}), "
    rf"shapes = (\[[-0-9, \[\]]*\]), movable = (true|false)(?=[,}}])"
)
_ENTRY_FIELDS = re.compile(
    rf'\{{duration = ({_NUMBER}), (?:order = ({_INT}), )?start = ({_NUMBER}), stream = "(compute|comm)"\}}'
)

_KINDS = {f"{op.value}.{phase.value}": (op, phase) for op in TaskOp for phase in Phase}
_RESOURCES = {member.value: member for member in Resource}
_ROLES = {member.value: member for member in LayerRole}
_MIXERS = {member.value: member for member in MixerKind}
_FFNS = {member.value: member for member in FfnKind}
_CORE_COUNT = len(CORE_TASK_FIELDS)


# Placeholders of objects made before their attributes are decoded; each is replaced.
# A task whose attrs are _NO_ATTRS gets its core fields from its decoded dictionary; one
# whose attrs are _EXTRAS_PENDING had them read from the line and waits for the rest.
_NO_SHAPES: list[list[int]] = []
_NO_ATTRS: Attrs = {}
_EXTRAS_PENDING: Attrs = {}
_CORE_SET = frozenset(CORE_TASK_FIELDS)


class _Declined(Exception):
    """The text leaves the layout this path reads; the grammar parser takes over."""


def parse_lines(text: str) -> Module | None:
    """The module ``text`` spells, if it is laid out as the printer lays it out; else None."""
    try:
        return _Reader(text).module()
    except _Declined:
        return None


# Where the reader is in the module.
_BEFORE, _LAYERS, _TASKS, _PLAN, _ENTRIES, _AFTER = range(6)


class _Reader:
    """Reads the structure line by line, building every object with empty attributes and
    collecting the attribute texts; then decodes those at once and fills them in."""

    def __init__(self, text: str):
        self.text = text
        self.bodies: list[str] = []  # every attribute dictionary's text, in order
        # What each of them belongs to: a Task (core fields and attributes), or a Module,
        # Layer, PlanOp or PlanEntry (attributes). Objects, not tuples: hundreds of
        # thousands of tuples would cost the garbage collector more than the objects.
        self.owners: list[Task | Module | Layer | PlanOp | PlanEntry] = []
        # Shapes of the tasks whose core fields were read from the line, decoded together.
        self.shapes: list[str] = []
        self.shaped: list[Task] = []
        # Numbers of the entries read from the line (duration, start; order or null), decoded together.
        self.numbers: list[str] = []
        self.orders: list[str] = []
        self.streams: list[str] = []
        self.numbered: list[PlanEntry] = []

    def module(self) -> Module:
        module = self._lines()
        self._fill_shapes()
        self._fill_entries()
        bodies, self.bodies = self.bodies, []
        dicts = _decode(bodies)
        for owner, attrs in zip(self.owners, dicts):
            if type(owner) is Task:
                if owner.attrs is _EXTRAS_PENDING:
                    if not _CORE_SET.isdisjoint(attrs):
                        raise _Declined  # a core field given twice: the grammar parser names it
                    owner.attrs = attrs
                else:
                    _fill_task(owner, attrs)
            else:
                owner.attrs = attrs
        return module

    def _core_fields(self, task: Task, body: str) -> str | None:
        """Read the core fields of ``task`` if ``body`` spells them as the printer does;
        returns what is left of the dictionary (``{...}``), None when nothing is."""
        match = _CORE_FIELDS.match(body)
        if match is None:
            return body
        flops, nbytes, param_bytes, act_bytes, shapes, movable = match.groups()
        if max(len(flops), len(nbytes), len(param_bytes), len(act_bytes)) > _FLOAT_DIGITS:
            raise _Declined  # past the largest float, or more digits than Python converts: the grammar parser says
        task.flops, task.bytes, task.param_bytes, task.act_bytes = int(flops), int(nbytes), int(param_bytes), int(act_bytes)
        task.movable = movable == "true"
        self.shapes.append(shapes)
        self.shaped.append(task)
        rest = body[match.end() :]
        if rest == "}":
            task.attrs = {}
            return None
        extras = rest[1:]  # what follows the ',' after movable
        if extras.lstrip(" \t").startswith("}"):
            raise _Declined  # a trailing comma: the grammar parser reports it
        task.attrs = _EXTRAS_PENDING
        return "{" + extras

    def _fill_entries(self) -> None:
        if not self.numbered:
            return
        try:
            numbers = _NUMBERS.decode("[" + ",".join(self.numbers) + "]")
            orders = _NUMBERS.decode("[" + ",".join(self.orders) + "]")
        except (ValueError, RecursionError):  # leading zeros, more digits than Python converts
            raise _Declined from None
        if len(numbers) != 2 * len(self.numbered) or len(orders) != len(self.numbered):
            raise _Declined
        try:
            finite = math.isfinite(sum(numbers))  # one pass in C; an infinity anywhere makes the sum one
        except OverflowError:  # an integer past the largest float: the grammar parser reports it
            raise _Declined from None
        if not finite:
            raise _Declined  # too large a float: the grammar parser reports it
        for entry, duration, start, order, stream in zip(self.numbered, numbers[0::2], numbers[1::2], orders, self.streams):
            if order is None:
                entry.attrs = {"duration": duration, "start": start, "stream": stream}
            else:
                entry.attrs = {"duration": duration, "order": order, "start": start, "stream": stream}

    def _fill_shapes(self) -> None:
        if not self.shapes:
            return
        try:
            decoder = _SIZED_DECODER if max(map(len, self.shapes)) >= _FLOAT_DIGITS else _DECODER
            decoded = decoder.decode("[" + ",".join(self.shapes) + "]")
        except (ValueError, RecursionError):
            raise _Declined from None
        if len(decoded) != len(self.shaped):
            raise _Declined  # a shapes text that was more than one value
        for task, shapes in zip(self.shaped, decoded):
            _check_shapes(shapes)
            task.shapes = shapes

    def _lines(self) -> Module:
        bodies, owners = self.bodies, self.owners
        task_line, entry_line, entry_fields = _TASK_LINE.fullmatch, _ENTRY_LINE.fullmatch, _ENTRY_FIELDS.fullmatch
        state = _BEFORE
        module: Module | None = None
        layer: Layer | None = None
        op: PlanOp | None = None
        locations: dict[str, tuple[int, int]] = {}
        entry_prefix = ""
        for number, raw in enumerate(self.text.split("\n"), 1):
            if state == _TASKS:
                match = task_line(raw)
                if match is not None:
                    assert module is not None and layer is not None
                    lead, name, kind, resource_text, deps_text, body = match.groups()
                    op_phase = _KINDS.get(kind)
                    resource = _RESOURCES.get(resource_text)
                    if op_phase is None or resource is None:
                        raise _Declined
                    deps: list[str] = []
                    if deps_text is not None:
                        if not _DEPS.fullmatch(deps_text):
                            raise _Declined
                        # The printer's ", @" between names: a split in C; else the general one.
                        if deps_text.count(",") == deps_text.count(", @"):
                            deps = deps_text[1:].split(", @")
                        else:
                            deps = _DEP_SPLIT.split(deps_text[1:])
                    # Core fields and attributes come with the decoded dictionaries; the
                    # placeholders spare two allocations per task.
                    task = Task(name, op_phase[0], op_phase[1], resource, deps, 0, 0, 0, 0, _NO_SHAPES, False, _NO_ATTRS)
                    layer.tasks.append(task)
                    key = "task:" + name
                    if key in locations:
                        module.locate(key, number, len(lead) + 1)
                    else:
                        locations[key] = (number, len(lead) + 1)
                    rest = self._core_fields(task, body)
                    if rest is not None:
                        bodies.append(rest)
                        owners.append(task)
                    continue
            elif state == _ENTRIES:
                match = entry_line(raw)
                if match is not None:
                    assert module is not None and op is not None
                    lead, ref, body = match.groups()
                    fields = entry_fields(body)
                    entry = PlanEntry(ref, _NO_ATTRS)
                    if fields is None:
                        bodies.append(body)
                        owners.append(entry)
                    else:
                        duration, order, start, stream = fields.groups()
                        self.numbers += (duration, start)
                        self.orders.append(order or "null")
                        self.streams.append(stream)
                        self.numbered.append(entry)
                    op.entries.append(entry)
                    key = entry_prefix + ref
                    if key in locations:
                        module.locate(key, number, len(lead) + 1)
                    else:
                        locations[key] = (number, len(lead) + 1)
                    continue
            line = raw.strip(" \t\r")
            if not line or line.startswith("//"):
                continue
            if state in (_TASKS, _ENTRIES):
                if line != "}":
                    raise _Declined
                state = _LAYERS if state == _TASKS else _PLAN
            elif state in (_LAYERS, _PLAN):
                assert module is not None
                if line == "}":
                    state = _AFTER
                elif line.startswith("plan"):
                    op, opens = self._plan_op(raw, number, module)
                    entry_prefix = f"entry:{op.name}:"
                    state = _ENTRIES if opens else _PLAN
                elif state == _LAYERS and line.startswith("layer"):
                    layer = self._layer(raw, number, module)
                    state = _TASKS
                else:
                    raise _Declined
            elif state == _BEFORE:
                module = self._module(raw, number)
                locations = module.locations
                state = _LAYERS
            else:  # after the module's closing brace: only blank lines and comments
                raise _Declined
        if state != _AFTER or module is None:
            raise _Declined
        return module

    def _module(self, raw: str, number: int) -> Module:
        match = _MODULE_LINE.fullmatch(raw)
        if match is None:
            raise _Declined
        lead, name, body = match.groups()
        module = Module(name)
        module.locate("module", number, len(lead) + 1)
        if body is not None:
            self.bodies.append(body)
            self.owners.append(module)
        return module

    def _layer(self, raw: str, number: int, module: Module) -> Layer:
        match = _LAYER_LINE.fullmatch(raw)
        if match is None:
            raise _Declined
        lead, name, role_text, index_text, path_text, mixer_text, ffn_text, body = match.groups()
        role, mixer, ffn = _ROLES.get(role_text), _MIXERS.get(mixer_text), _FFNS.get(ffn_text)
        if role is None or mixer is None or ffn is None:
            raise _Declined
        index = None
        if index_text is not None:
            if len(index_text) > 9:
                raise _Declined
            index = int(index_text)
        try:
            path = json.loads(path_text)
        except ValueError:
            raise _Declined from None
        layer = Layer(name, role, path, mixer, ffn, index)
        module.layers.append(layer)
        module.locate(f"layer:{name}", number, len(lead) + 1)
        if body is not None:
            self.bodies.append(body)
            self.owners.append(layer)
        return layer

    def _plan_op(self, raw: str, number: int, module: Module) -> tuple[PlanOp, bool]:
        """The plan op of the line, and whether the line opens its entries."""
        match = _PLAN_LINE.fullmatch(raw)
        if match is None:
            raise _Declined
        lead, kind, name, body, opens = match.groups()
        op = PlanOp(kind, name)
        module.plan.append(op)
        module.locate(f"plan:{name}", number, len(lead) + 1)
        self.bodies.append(body)
        self.owners.append(op)
        return op, opens is not None


def _fill_task(task: Task, attrs: Attrs) -> None:
    """Set the core fields of ``task`` from the head of its attribute dictionary; what is
    left of the dictionary (the same object, no copy) becomes the task's attributes."""
    if tuple(attrs)[:_CORE_COUNT] != CORE_TASK_FIELDS:
        raise _Declined
    flops, nbytes, param_bytes, act_bytes = attrs.pop("flops"), attrs.pop("bytes"), attrs.pop("param_bytes"), attrs.pop("act_bytes")
    shapes, movable = attrs.pop("shapes"), attrs.pop("movable")
    if type(flops) is not int or type(nbytes) is not int or type(param_bytes) is not int or type(act_bytes) is not int:
        raise _Declined
    if type(movable) is not bool:
        raise _Declined
    _check_shapes(shapes)
    task.flops, task.bytes, task.param_bytes, task.act_bytes = flops, nbytes, param_bytes, act_bytes
    task.shapes, task.movable, task.attrs = shapes, movable, attrs  # type: ignore[assignment]


def _check_shapes(shapes: object) -> None:
    if type(shapes) is not list:
        raise _Declined
    for shape in shapes:
        if type(shape) is not list:
            raise _Declined
        for dim in shape:
            if type(dim) is not int:
                raise _Declined


def _decode(bodies: list[str]) -> list[Attrs]:
    """Decode every attribute dictionary with one call of the JSON decoder.

    Empties ``bodies``: on a large module each copy of the text is tens of megabytes,
    so every one is dropped as soon as the next is made.
    """
    count = len(bodies)
    may_be_deep = [k for k, body in enumerate(bodies) if body.count("[") > MAX_VALUE_DEPTH]
    sized = max(map(len, bodies), default=0) >= _FLOAT_DIGITS  # may hold an integer past the largest float
    joined = ",".join(bodies)
    bodies.clear()
    if "\x00" in joined:
        raise _Declined  # the rewriting below uses it as a separator; the IR never holds it raw
    strings, outside = _split_strings(joined)
    del joined
    # Outside strings, braces only open and close the dictionaries themselves.
    if outside.count("{") != count or outside.count("}") != count or ":" in outside:
        raise _Declined
    if "null" in outside and _NULL.search(outside):
        raise _Declined
    keys = 0
    if "=" in outside:
        pieces = _KEY.split(outside)  # text, separator, key, text, separator, key, ..., text
        keys = len(pieces) // 3
        pieces[2::3] = map(_QUOTED_KEY, pieces[2::3])
        outside = "".join(pieces)
    decoder = _SIZED_DECODER if sized else _DECODER
    if "@" in outside:
        decoder = _SIZED_DECODER_WITH_SYMBOLS if sized else _DECODER_WITH_SYMBOLS
        pieces = _SYMBOL.split(outside)
        pieces[1::2] = map(_SYMBOL_OBJECT, pieces[1::2])
        outside = "".join(pieces)
    document: list[str] = [""] * (2 * len(strings) + 1)
    document[0::2] = f"[{outside}]".split("\x00")
    del outside
    document[1::2] = strings
    del strings
    text = '"'.join(document)
    del document
    try:
        dicts = decoder.decode(text)
    except (ValueError, RecursionError):  # JSONDecodeError is a ValueError; so are over-long integers
        raise _Declined from None
    del text
    if len(dicts) != count or not all(type(d) is dict for d in dicts) or sum(map(len, dicts)) != keys:
        raise _Declined  # a key given twice (the last one won), or a dictionary split apart
    for k in may_be_deep:
        if any(isinstance(v, list) and value_depth(v) > MAX_VALUE_DEPTH for v in dicts[k].values()):
            raise _Declined
    return dicts  # type: ignore[no-any-return]


def _split_strings(joined: str) -> tuple[list[str], str]:
    """The string literals' contents (escapes kept) and the text outside them, where each
    literal is replaced by a NUL."""
    if "\\" not in joined:
        # Without backslashes every '"' opens or closes a string literal.
        pieces = joined.split('"')
        if len(pieces) % 2 == 0:
            raise _Declined  # an unterminated string
        return pieces[1::2], "\x00".join(pieces[0::2])
    strings: list[str] = []
    outside: list[str] = []
    pos = 0
    while True:
        quote = joined.find('"', pos)
        if quote < 0:
            outside.append(joined[pos:])
            return strings, "\x00".join(outside)
        literal = _STRING.match(joined, quote)
        if literal is None:
            raise _Declined  # no string literal starts here, and nothing else of the IR holds a '"'
        outside.append(joined[pos:quote])
        strings.append(joined[quote + 1 : literal.end() - 1])
        pos = literal.end()


def _symbol_or_dict(value: dict[str, Any]) -> Any:
    """A decoded object: the ``{"@": name}`` the rewriting made from ``@name`` is a SymbolRef."""
    if len(value) == 1 and "@" in value:
        return SymbolRef(value["@"])
    return value


def _finite_float(text: str) -> float:
    value = float(text)
    if not math.isfinite(value):
        raise ValueError(text)  # the grammar parser reports the overflow with its position
    return value


# The largest integer a float holds, and the digits of the shortest integer past it.
_LARGEST_INT = int(sys.float_info.max)
_FLOAT_DIGITS = len(str(_LARGEST_INT))


def _float_sized_int(text: str) -> int:
    value = int(text)
    if len(text) >= _FLOAT_DIGITS and abs(value) > _LARGEST_INT:
        raise ValueError(text)  # the grammar parser reports it with its position
    return value


def _no_constant(text: str) -> Any:
    raise ValueError(text)  # NaN, Infinity: not in the IR


_DECODER = json.JSONDecoder(parse_float=_finite_float, parse_constant=_no_constant)
_DECODER_WITH_SYMBOLS = json.JSONDecoder(object_hook=_symbol_or_dict, parse_float=_finite_float, parse_constant=_no_constant)
# For dictionaries long enough to hold an integer past the largest float (no printed module has
# one: a check of every integer would cost a twentieth of the parse).
_SIZED_DECODER = json.JSONDecoder(parse_float=_finite_float, parse_int=_float_sized_int, parse_constant=_no_constant)
_SIZED_DECODER_WITH_SYMBOLS = json.JSONDecoder(
    object_hook=_symbol_or_dict, parse_float=_finite_float, parse_int=_float_sized_int, parse_constant=_no_constant
)
# Numbers the line regex found (no keys, no symbols): floats in C, checked afterwards.
_NUMBERS = json.JSONDecoder(parse_constant=_no_constant)
