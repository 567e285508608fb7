"""Parser of the Tessera IR text form: ``parse_module(text) -> Module``.

``tessera_ir/printer.py`` defines the format and ``grammar.lark`` accepts it.
The grammar is compiled once into an LALR(1) parser whose transformer runs
inside the parser (each rule builds its model object as it is reduced), so no
parse tree is ever built: a 2,000-task module parses in a fraction of a second.

Every failure is a :class:`~tessera_ir.errors.ParseError` carrying the line and
column and saying what was found and what was expected there.
"""

from __future__ import annotations

import json
import math
import re
import sys
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from enum import Enum
from importlib import resources
from typing import Any, NoReturn, TypeVar

from lark import Lark, Token, Transformer
from lark.common import LexerConf
from lark.exceptions import LarkError, UnexpectedCharacters, UnexpectedEOF, UnexpectedInput, UnexpectedToken
from lark.lexer import Lexer, LexerState, PatternStr
from lark.parsers.lalr_analysis import Shift

from tessera_ir.errors import ParseError
from tessera_ir.kinds import FfnKind, LayerRole, MixerKind, Phase, Resource, TaskOp
from tessera_ir.line_parser import parse_lines
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
    Value,
)
from tessera_ir.printer import spell_value

_COUNTER_FIELDS = CORE_TASK_FIELDS[:4]

E = TypeVar("E", bound=Enum)


def _fail(message: str, token: Token | None) -> NoReturn:
    line = getattr(token, "line", None) if token is not None else None
    column = getattr(token, "column", None) if token is not None else None
    raise ParseError(message, line, column)


def _legal(enum: type[Enum]) -> str:
    return ", ".join(repr(member.value) for member in enum)  # type: ignore[var-annotated]


def _enum(enum: type[E], token: Token, what: str) -> E:
    try:
        return enum(str(token))
    except ValueError:
        _fail(f"unknown {what} '{token}'; use one of {_legal(enum)}", token)


# The transformer's intermediate results: an attribute list keeps its key tokens
# (for positions and the order of core task fields) until its owner turns it into a dict.
@dataclass
class _AttrList:
    pairs: list[tuple[Token, Value]]


@dataclass
class _Located:
    """A model object with the 1-based position where its definition starts."""

    obj: Any
    line: int
    column: int


_LARGEST_INT = int(sys.float_info.max)  # an integer past it cannot enter any computation with floats


def _number(token: Token) -> Value:
    text = str(token)
    try:
        if "." in text or "e" in text or "E" in text:
            value = float(text)
            if not math.isfinite(value):
                _fail(f"number {text} is too large for a 64-bit float", token)
            return value
        value = int(text)
        if abs(value) > _LARGEST_INT:
            _fail(f"integer {text[:20]}... ({len(text)} digits) is too large: past the largest 64-bit float", token)
        return value
    except ValueError:
        # Python refuses to convert integers of more than a few thousand digits.
        _fail(f"number {text[:20]}... has too many digits", token)


def _string(token: Token) -> str:
    try:
        value = json.loads(str(token))
    except ValueError as err:
        _fail(f"invalid string literal {str(token)[:40]}: {err.args[0].split(':')[0]}", token)
    assert isinstance(value, str)
    return value


_CONVERTERS: dict[str, Callable[[Token], Value]] = {
    "NUMBER": _number,
    "STRING": _string,
    "SYMBOL": lambda token: SymbolRef(str(token)[1:]),
    "TRUE": lambda token: True,
    "FALSE": lambda token: False,
}


def _convert(token: Token) -> Value:
    """The attribute value a NUMBER, STRING, SYMBOL, TRUE or FALSE token spells."""
    return _CONVERTERS[token.type](token)


def _attrs_dict(attrs: _AttrList | None) -> Attrs:
    if attrs is None:
        return {}
    return {str(key): value for key, value in attrs.pairs}


class _Builder(Transformer[Token, Module]):
    """Builds model objects rule by rule, inside the LALR parser."""

    # --- values -------------------------------------------------------------
    def list_value(self, children: list[Any]) -> Value:
        return children[0] if children[0] is not None else []

    def values(self, children: list[Any]) -> list[Value]:
        # Left-recursive: `values: v | values "," v` appends to the list built so far.
        last = children[-1]
        value = _convert(last) if type(last) is Token else last
        if len(children) == 1:
            return [value]
        children[0].append(value)
        return children[0]  # type: ignore[no-any-return]

    # Left-recursive repetitions of model objects.
    def _append(self, children: list[Any]) -> list[Any]:
        if len(children) == 1:
            return [children[0]]
        children[0].append(children[1])
        return children[0]  # type: ignore[no-any-return]

    attr_list = symbols = layers = plan_ops = tasks = entry_list = _append

    # --- attributes ---------------------------------------------------------
    def attr(self, children: list[Any]) -> tuple[Token, Value]:
        value = children[1]
        return (children[0], _convert(value) if type(value) is Token else value)

    def attrs(self, children: list[Any]) -> _AttrList:
        pairs: list[tuple[Token, Value]] = children[0] if children[0] is not None else []
        seen: set[str] = set()
        for key_token, _ in pairs:
            key = str(key_token)
            if key in seen:
                _fail(f"attribute '{key}' is given twice; each key may appear once in an attribute list", key_token)
            seen.add(key)
        return _AttrList(pairs)

    # --- tasks, layers, plan ops ---------------------------------------------
    def deps(self, children: list[list[Token]]) -> list[str]:
        return [str(t)[1:] for t in children[0]]

    def task(self, children: list[Any]) -> _Located:
        keyword, name_tok, kind_tok, resource_tok, deps, attrs = children
        name = str(name_tok)[1:]
        op_text, dot, phase_text = str(kind_tok).partition(".")
        if not dot or "." in phase_text:
            _fail(
                f"task kind '{kind_tok}' must be written operation.phase, such as 'attention.fwd'",
                kind_tok,
            )
        op = _enum(TaskOp, Token("WORD", op_text, line=kind_tok.line, column=kind_tok.column), "task operation")
        try:
            phase = Phase(phase_text)
        except ValueError:
            _fail(f"unknown task phase '{phase_text}' in '{kind_tok}'; use one of {_legal(Phase)}", kind_tok)
        resource = _enum(Resource, resource_tok, "resource")
        core, extra = _split_core(name, attrs, keyword)
        task = Task(
            name=name,
            op=op,
            phase=phase,
            resource=resource,
            deps=deps if deps is not None else [],
            flops=core["flops"],
            bytes=core["bytes"],
            param_bytes=core["param_bytes"],
            act_bytes=core["act_bytes"],
            shapes=core["shapes"],
            movable=core["movable"],
            attrs=extra,
        )
        return _Located(task, keyword.line, keyword.column)

    def layer(self, children: list[Any]) -> _Located:
        keyword, name_tok, role_tok, index_tok, path_tok, mixer_tok, ffn_tok, attrs, tasks = children
        tasks = tasks if tasks is not None else []
        index: int | None = None
        if index_tok is not None:
            if not re.fullmatch(r"[0-9]{1,9}", str(index_tok)):
                _fail(f"layer index '{str(index_tok)[:20]}' must be a non-negative integer below 10**9", index_tok)
            index = int(str(index_tok))
        layer = Layer(
            name=str(name_tok)[1:],
            role=_enum(LayerRole, role_tok, "layer role"),
            path=_string(path_tok),
            mixer=_enum(MixerKind, mixer_tok, "mixer kind"),
            ffn=_enum(FfnKind, ffn_tok, "ffn kind"),
            index=index,
            attrs=_attrs_dict(attrs),
            tasks=[located.obj for located in tasks],
        )
        return _Located((layer, tasks), keyword.line, keyword.column)

    def entry(self, children: list[Any]) -> _Located:
        ref_tok = children[0]
        return _Located(PlanEntry(str(ref_tok)[1:], _attrs_dict(children[1])), ref_tok.line, ref_tok.column)

    def entries(self, children: list[Any]) -> list[_Located]:
        return children[0] if children[0] is not None else []

    def plan_op(self, children: list[Any]) -> _Located:
        keyword, op_tok, name_tok, attrs, entries = children
        entries = entries if entries is not None else []
        op = PlanOp(str(op_tok), str(name_tok)[1:], _attrs_dict(attrs), [located.obj for located in entries])
        return _Located((op, entries), keyword.line, keyword.column)

    def module(self, children: list[Any]) -> Module:
        keyword, name_tok, attrs, layers, plan_ops = children
        module = Module(name=str(name_tok)[1:], attrs=_attrs_dict(attrs))
        module.locate("module", keyword.line, keyword.column)
        for item in layers or []:
            layer, tasks = item.obj
            module.layers.append(layer)
            module.locate(f"layer:{layer.name}", item.line, item.column)
            for task in tasks:
                module.locate(f"task:{task.obj.name}", task.line, task.column)
        for item in plan_ops or []:
            op, entries = item.obj
            module.plan.append(op)
            module.locate(f"plan:{op.name}", item.line, item.column)
            for entry in entries:
                module.locate(f"entry:{op.name}:{entry.obj.ref}", entry.line, entry.column)
        return module


def _split_core(task_name: str, attrs: _AttrList, anchor: Token) -> tuple[dict[str, Any], Attrs]:
    """Check the core fields lead the task's attributes in printed order; return (core, extra)."""
    pairs = attrs.pairs
    order = ", ".join(CORE_TASK_FIELDS)
    core: dict[str, Any] = {}
    for i, field_name in enumerate(CORE_TASK_FIELDS):
        if i >= len(pairs):
            _fail(
                f"task '@{task_name}' lacks the core attribute '{field_name}'; every task lists {order} first, in that order",
                anchor,
            )
        key, value = pairs[i]
        if key != field_name:
            _fail(
                f"expected the core attribute '{field_name}' of task '@{task_name}' but found '{key}'; "
                f"every task lists {order} first, in that order",
                key,
            )
        if field_name in _COUNTER_FIELDS:
            if isinstance(value, bool) or not isinstance(value, int):
                _fail(f"'{field_name}' of task '@{task_name}' must be an integer, not {spell_value(value)}", key)
        elif field_name == "shapes":
            if not isinstance(value, list) or not all(
                isinstance(shape, list) and all(isinstance(d, int) and not isinstance(d, bool) for d in shape)
                for shape in value
            ):
                _fail(
                    f"'shapes' of task '@{task_name}' must be a list of lists of integers, such as [[4, 1024], [4, 1024]]",
                    key,
                )
        elif not isinstance(value, bool):
            _fail(f"'movable' of task '@{task_name}' must be true or false, not {spell_value(value)}", key)
        core[field_name] = value
    extra: Attrs = {}
    for key, value in pairs[len(CORE_TASK_FIELDS) :]:
        extra[str(key)] = value
    return core, extra




# ---------------------------------------------------------------------------
# The lexer.


def _skip_pattern(ignored: dict[str, str]) -> str:
    """A pattern for any run of the ignored terminals that can split a text in only one way.

    The obvious ``(?:WS|COMMENT)*`` nests ``[ \t\r\n]+`` inside ``*``: a run of n
    blanks then splits in 2**n ways, and when no token follows the run (trailing
    blank lines, blanks before a stray character) the regex engine tries them
    all. Here blanks are one optional run, and each comment is taken to the end
    of its line (``(?![^\n])``) with the blanks after it, so there is nothing to
    retry: a failed match costs time linear in the run.
    """
    if set(ignored) != {"WS", "COMMENT"}:
        raise AssertionError(f"the lexer skips WS and COMMENT; the grammar ignores {sorted(ignored)}")
    blanks = f"(?:{ignored['WS']})?"
    return f"{blanks}(?:(?:{ignored['COMMENT']})(?![^\n]){blanks})*"


class _IRLexer(Lexer):
    """A lexer built from the grammar's own terminals, faster than lark's general one.

    All terminals are joined into one regular expression with a group per
    terminal, and whitespace and comments are skipped in the same match, so one
    ``re`` call yields each token. Keywords (``task``, ``on``, ``true``, ...) are
    words too: as in lark's contextual lexer, a word is a keyword only where the
    parser can accept that keyword. Where the parser can take an attribute, a
    word followed by ``=`` becomes one KEY_EQ token (name and ``=``), so
    ``{on = true}`` and ``{task = 1}`` are ordinary attributes.
    """

    __future_interface__ = 2

    def __init__(self, conf: LexerConf):
        ignore = set(conf.ignore)
        word_re: re.Pattern[str] | None = None
        regex_parts: list[str] = []
        literal_parts: list[tuple[str, str]] = []
        self._keywords: dict[str, str] = {}
        terminals = list(conf.terminals)
        for term in terminals:
            if term.name == "WORD":
                word_re = re.compile(term.pattern.to_regexp())
        assert word_re is not None, "the grammar must define WORD"
        for term in terminals:
            if term.name in ignore or term.name == "KEY_EQ":
                continue
            if isinstance(term.pattern, PatternStr):
                value = term.pattern.value
                if word_re.fullmatch(value):
                    self._keywords[value] = term.name
                else:
                    literal_parts.append((term.name, re.escape(value)))
            else:
                regex_parts.append(f"(?P<{term.name}>{term.pattern.to_regexp()})")
        # Longer literals first, so that no literal shadows a longer one it starts.
        literal_parts.sort(key=lambda part: -len(part[1]))
        skip = _skip_pattern({term.name: term.pattern.to_regexp() for term in terminals if term.name in ignore})
        alternatives = regex_parts + [f"(?P<{name}>{pattern})" for name, pattern in literal_parts]
        self._token_re = re.compile(f"{skip}(?:" + "|".join(alternatives) + ")")
        self._skip_re = re.compile(skip)
        self._equals_re = re.compile(f"{skip}=")

    def lex(self, lexer_state: LexerState, parser_state: Any) -> Iterator[Token]:
        text_slice = lexer_state.text
        text = text_slice.text
        pos = text_slice.start
        end = text_slice.end
        if not isinstance(text, str):
            raise TypeError("the IR parser reads str, not bytes")
        token_match = self._token_re.match
        equals_follows = self._equals_re.match
        keywords = self._keywords
        states = parser_state.parse_conf.states
        line = 1
        line_start = 0
        # Lists open at this point; checked here, before any list is built, so that
        # nothing downstream ever meets a value nested past the limit.
        list_depth = 0
        while True:
            m = token_match(text, pos, end)
            if m is None:
                skipped = self._skip_re.match(text, pos, end)
                assert skipped is not None  # matches the empty string at least
                ws = skipped.group()
                if ws:
                    newlines = ws.count("\n")
                    if newlines:
                        line += newlines
                        line_start = pos + ws.rfind("\n") + 1
                    pos = skipped.end()
                if pos >= end:
                    return
                raise UnexpectedCharacters(
                    text,
                    pos,
                    line,
                    pos - line_start + 1,
                    allowed={name for name in states[parser_state.position] if name.isupper()},
                    state=parser_state,
                )
            kind = m.lastgroup
            assert kind is not None
            start = m.start(kind)
            if start != pos:  # whitespace or comments were skipped
                newlines = text.count("\n", pos, start)
                if newlines:
                    line += newlines
                    line_start = text.rfind("\n", pos, start) + 1
            pos = m.end()
            value = text[start:pos]
            column = start - line_start + 1
            if kind == "WORD":
                accepted = states[parser_state.position]
                equals = equals_follows(text, pos, end) if "KEY_EQ" in accepted else None
                if equals is not None:
                    kind = "KEY_EQ"
                    token_line = line
                    newlines = text.count("\n", pos, equals.end())
                    if newlines:  # a comment or line break between the name and its '='
                        line += newlines
                        line_start = text.rfind("\n", pos, equals.end()) + 1
                    pos = equals.end()
                    yield Token(kind, value, start, token_line, column)
                    continue
                if value in keywords and keywords[value] in accepted:
                    kind = keywords[value]
            elif kind == "LSQB":
                list_depth += 1
                if list_depth > MAX_VALUE_DEPTH:
                    raise ParseError(
                        f"attribute value nests lists more than {MAX_VALUE_DEPTH} deep, the IR's limit; flatten it",
                        line,
                        column,
                    )
            elif kind == "RSQB":
                list_depth -= 1
            yield Token(kind, value, start, line, column)


# ---------------------------------------------------------------------------
# The parser object and error reporting.

_PARSER: Lark | None = None


def _parser() -> Lark:
    global _PARSER
    if _PARSER is None:
        grammar = resources.files("tessera_ir").joinpath("grammar.lark").read_text(encoding="utf-8")
        _PARSER = Lark(
            grammar,
            parser="lalr",
            start="module",
            strict=True,
            propagate_positions=True,
            maybe_placeholders=True,
            lexer=_IRLexer,
            transformer=_Builder(),
        )
    return _PARSER


def parse_module(text: str, source: str | None = None) -> Module:
    """Parse IR text into a Module; ``source`` (a file name) is used in error messages.

    Text in the printer's line layout is read by the fast path
    (:mod:`tessera_ir.line_parser`); anything else, and every error, goes
    through the grammar.
    """
    if not isinstance(text, str):
        raise TypeError(f"the IR parser reads str, not {type(text).__name__}")
    module = parse_lines(text)
    if module is None:
        return parse_with_grammar(text, source)
    module.source = source
    return module


def parse_with_grammar(text: str, source: str | None = None) -> Module:
    """Parse IR text with the LALR parser of ``grammar.lark``, whatever its layout."""
    parser = _parser()
    try:
        module = parser.parse(text)
    except ParseError as err:
        raise ParseError(err.message, err.line, err.column, source) from None
    except UnexpectedInput as err:
        try:
            line, column, message = _describe(text, err)
        except (LookupError, ValueError, TypeError, AttributeError):
            # Describing the error is best effort; the error itself is still a ParseError.
            line, column, message = getattr(err, "line", None), getattr(err, "column", None), f"syntax error: {err}"
        raise ParseError(message, line, column, source) from None
    except LarkError as err:  # any other failure inside lark is still malformed input
        raise ParseError(f"malformed IR: {err}", None, None, source) from None
    assert isinstance(module, Module)
    module.source = source
    return module


# Words for the grammar's terminals, used to say what the parser expected.
_TERMINAL_WORDS = {
    "SYMBOL": "a name starting with '@'",
    "WORD": "a word",
    "KEY_EQ": "an attribute name",
    "NUMBER": "a number",
    "STRING": "a quoted string",
    "KW_MODULE": "'module'",
    "KW_LAYER": "'layer'",
    "KW_TASK": "'task'",
    "KW_PLAN": "'plan'",
    "LBRACE": "'{'",
    "RBRACE": "'}'",
    "LSQB": "'['",
    "RSQB": "']'",
    "LPAR": "'('",
    "RPAR": "')'",
    "COMMA": "','",
    "EQUAL": "'='",
    "ON": "'on'",
    "AFTER": "'after'",
    "MIXER": "'mixer'",
    "FFN": "'ffn'",
    "TRUE": "'true'",
    "FALSE": "'false'",
    "$END": "the end of the text",
}

_VALUE_WORDS = "an attribute value (a number, a quoted string, true, false, an @name or a [list])"

# Tokens of the text before an error, to say what the parser had just read.
_TOKEN_RE = re.compile(
    r'"(?:[^"\\\n]|\\.)*"?|//[^\n]*|@[A-Za-z0-9_.\-]*|-?[0-9][0-9.eE+\-]*|[A-Za-z_][A-Za-z0-9_.\-]*|\S'
)


def _previous_tokens(text: str, offset: int, count: int = 4) -> list[str]:
    """The last ``count`` tokens before ``offset``, comments skipped (nearest last)."""
    found: list[str] = []
    end = offset
    while end > 0 and len(found) < count:
        start = text.rfind("\n", 0, end) + 1
        line_tokens = [t for t in _TOKEN_RE.findall(text, start, end) if not t.startswith("//")]
        found = line_tokens + found
        end = start - 1
    return found[-count:]


def _context_word(terminal: str, before: list[str]) -> str:
    """What a WORD, NUMBER or STRING means at this place of the grammar."""
    prev = before[-1] if before else ""
    prev2 = before[-2] if len(before) > 1 else ""
    prev3 = before[-3] if len(before) > 2 else ""
    if terminal == "WORD":
        if prev == "=" and prev2.startswith("@") and prev3 == "task":
            return "a task kind such as 'attention.fwd'"
        if prev == "on":
            return f"a resource ({_legal(Resource)})"
        if prev == "=" and prev2 == "mixer":
            return f"a mixer kind ({_legal(MixerKind)})"
        if prev == "=" and prev2 == "ffn":
            return f"an ffn kind ({_legal(FfnKind)})"
        if prev.startswith("@") and prev2 == "layer":
            return f"a layer role ({_legal(LayerRole)})"
        if prev == "plan":
            return "a plan op kind such as 'pair_schedule'"
        if prev in ("{", ","):
            return "an attribute name"
        return "a word"
    if terminal == "STRING" and "layer" in before[-4:-1]:
        return 'the layer\'s module path as a quoted string, such as "model.layers.0"'
    if terminal == "NUMBER" and prev3 == "layer":
        return "a decoder layer index"
    if terminal == "SYMBOL":
        if prev in ("module", "layer", "task"):
            return f"the {prev}'s name, such as '@l0'"
        if prev.isidentifier() and prev2 == "plan":
            return "the plan op's name, such as '@p0'"
    return _TERMINAL_WORDS.get(terminal, terminal)


def _expected_words(expected: Iterable[str], before: list[str]) -> str:
    names = set(expected)
    words: list[str] = []
    if {"NUMBER", "STRING", "TRUE", "FALSE"} <= names:
        words.append(_VALUE_WORDS)
        names -= {"NUMBER", "STRING", "TRUE", "FALSE", "SYMBOL", "LSQB"}
    # Punctuation and keywords first, then what needs describing, the end of the text last.
    words += sorted(
        (_context_word(name, before) for name in names),
        key=lambda w: (w == _TERMINAL_WORDS["$END"], not w.startswith("'"), w),
    )
    if not words:
        return "nothing more"
    if len(words) == 1:
        return words[0]
    return ", ".join(words[:-1]) + " or " + words[-1]


def _found(token: Token) -> str:
    if token.type == "$END":
        return "the end of the text"
    text = str(token)
    if len(text) > 40:
        text = text[:37] + "..."
    return f"'{text}'"


def _offset(text: str, line: int, column: int) -> int:
    start = 0
    for _ in range(line - 1):
        start = text.index("\n", start) + 1
    return start + column - 1


def _acceptable(parser_state: Any, terminals: Iterable[str]) -> set[str]:
    """The terminals the parser would really shift next.

    An LALR state lists every terminal of its merged lookahead sets, and some of
    them only lead to a reduction and then an error (after a `}` that closes an
    attribute list, `task` and `@name` are listed because other `}`s are
    followed by them). lark's ``accepts`` answers this by replaying the whole
    parser state, values and transformer included, once per terminal; here only
    the stack of state numbers is replayed.
    """
    candidates = {t for t in terminals if t.isupper()}
    try:
        states = parser_state.parse_conf.states
        end_state = parser_state.parse_conf.end_state
        stack0 = list(parser_state.state_stack)
    except AttributeError:  # not a LALR parser state: keep lark's list
        return candidates
    accepted = set()
    for terminal in candidates:
        stack = list(stack0)
        while True:
            action = states[stack[-1]].get(terminal)
            if action is None:
                break
            kind, arg = action
            if kind is Shift:
                accepted.add(terminal)
                break
            size = len(arg.expansion)
            if size:
                del stack[-size:]
            stack.append(states[stack[-1]][arg.origin.name][1])
            if terminal == "$END" and stack[-1] == end_state:
                accepted.add(terminal)
                break
    return accepted or candidates


def _describe(text: str, err: UnexpectedInput) -> tuple[int | None, int | None, str]:
    """Line, column and a message in words for a syntax error lark reported."""
    if isinstance(err, UnexpectedToken):
        token = err.token
        if token.type == "$END":
            line, column = _end_position(text)
            offset = len(text)
        else:
            line, column = token.line or 1, token.column or 1
            offset = token.start_pos if token.start_pos is not None else _offset(text, line, column)
        before = _previous_tokens(text, offset)
        after = f" after '{before[-1]}'" if before else ""
        expected = _expected_words(_acceptable(err.state, err.expected), before)
        return line, column, f"expected {expected}{after} but found {_found(token)}"
    if isinstance(err, UnexpectedCharacters):
        char_offset = err.pos_in_stream or 0
        before = _previous_tokens(text, char_offset)
        after = f" after '{before[-1]}'" if before else ""
        char = text[char_offset] if char_offset < len(text) else ""
        found = f"'{char}'" if char.isprintable() else repr(char)
        allowed = _acceptable(err.state, err.allowed or set())
        if char == '"':
            return err.line, err.column, f"unterminated or malformed string literal{after}"
        expected = _expected_words(allowed, before) if allowed else "a token of the IR"
        return err.line, err.column, f"expected {expected}{after} but found {found}"
    if isinstance(err, UnexpectedEOF):
        line, column = _end_position(text)
        return line, column, f"unexpected end of the text; expected {_expected_words(err.expected, [])}"
    return getattr(err, "line", None), getattr(err, "column", None), str(err)


def _end_position(text: str) -> tuple[int, int]:
    line = text.count("\n") + 1
    column = len(text) - (text.rfind("\n") + 1) + 1
    return line, column
