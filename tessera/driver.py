"""The one driver behind every command-line tool (tessera-compile, tessera-opt, tessera-viz, tessera-dis).

A tool is an argument parser and a body ``(args, run) -> exit status``; :func:`run_tool`
gives every tool the same behaviour:

- A user error (any :class:`~tessera_ir.errors.TesseraError`, and a bad command line)
  is one line on stderr, ``<tool>: error: <what, where, how to fix>``, exit status 1.
  ``--debug`` shows the traceback instead.
- A bug in Tessera is one line, ``<tool>: internal error: ...`` with the file and line
  where it was raised, exit status 2; ``--debug`` shows the traceback.
- Ctrl-C stops the run with exit status 130.
- Outputs are declared through :class:`Run` before the work starts, so a path that
  cannot be written fails in the first second, and written all together only after the
  whole run succeeded: a failed run leaves no output file and no existing file changed.
  ``--dump-dir`` dumps are the exception: they are written as each pass finishes, so
  the passes before a failure can be inspected.
- ``tessera-compile`` and ``tessera-opt``, the executables that plan and parse large modules,
  run through :func:`run_executable`: the garbage collector collects only young objects (a
  one-run process keeps what it builds to the end), and they leave through :func:`leave`: the
  exit handlers run and the output is flushed, but the interpreter does not free the heap one
  object at a time (after a large compile that took seconds).
"""

from __future__ import annotations

import argparse
import atexit
import os
import sys
import traceback
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import NoReturn

from runtime.errors import PlanError
from support import collector
from tessera.io import (
    check_output_file,
    check_output_folder,
    check_outputs_apart,
    read_text,
    write_atomic,
    write_files,
)
from tessera_ir.errors import TesseraError
from tessera_ir.model import Module
from tessera_ir.parser import parse_module

EXIT_USER_ERROR = 1
EXIT_INTERNAL_ERROR = 2
EXIT_INTERRUPTED = 130
# Longer messages are cut in the middle: a message may quote the user's input, and a
# 100,000-character option is still one readable line.
MAX_MESSAGE_CHARS = 2000


class UsageError(TesseraError):
    """A command line the tool's argument parser refuses."""


class ArgumentParser(argparse.ArgumentParser):
    """argparse, with a bad command line reported like every other user error (one line, exit 1)."""

    def error(self, message: str) -> NoReturn:
        raise UsageError(f"{message}; see {self.prog} --help")


class Run:
    """One run of a tool: where its outputs go, checked up front and written at the end."""

    def __init__(self, tool: str):
        self.tool = tool
        self._files: dict[str, bytes | None] = {}  # absolute path or "-" -> data (None until added)
        self._folders: dict[str, tuple[Path, bool]] = {}  # absolute path -> (as given, exists)
        self._inputs: dict[str, str | None] = {}  # what names each input -> its path

    def keep_apart(self, inputs: dict[str, str | None], outputs: dict[str, str | None]) -> None:
        """Refuse now an output that names an input or another output (:func:`check_outputs_apart`);
        files later written into an output folder are checked against the same inputs."""
        check_outputs_apart(inputs, outputs)
        self._inputs = dict(inputs)

    def note(self, message: str) -> None:
        print(f"{self.tool}: {message}", file=sys.stderr)

    def read_text(self, path: str, what: str = "input file") -> str:
        return read_text(path, what)

    def parse_ir(self, path: str) -> Module:
        """Read and parse an IR file (``-``: standard input).

        A tool owns its process, so it pauses the cyclic garbage collector while the
        module is built: parsing makes an acyclic tree of a million objects, in which
        the collector finds nothing to free, yet its full passes over the growing heap
        take about 45% of the parse of a 50 MB module (bench/bench_parse.py). The
        library's parse_module leaves the collector alone.
        """
        text = read_text(path)
        with collector.paused():
            return parse_module(text, source="<stdin>" if path == "-" else path)

    def output_file(self, path: str, flag: str) -> str:
        """Declare an output file (``-``: standard output); refused now if it cannot be written."""
        check_output_file(path, flag)
        key = _key(path)
        if key in self._files:
            raise TesseraError(f"{flag} {path}: another output of this run goes to the same file")
        self._files[key] = None
        return path

    def output_folder(self, path: str | Path, flag: str) -> Path:
        """Declare a folder of outputs; refused now if it cannot be used, created when written."""
        folder = Path(path)
        self._folders[_key(folder)] = (folder, check_output_folder(folder, flag))
        return folder

    def add(self, path: str | Path, data: str | bytes) -> None:
        """Give the contents of a declared output file, or of a file in a declared folder."""
        key = _key(path)
        if key not in self._files:
            folder = self._folders.get(os.path.dirname(key))
            if folder is None:
                raise AssertionError(f"output {path} was not declared before the work started")
            if folder[1]:  # in a folder that exists already: checked once its name is known
                check_output_file(str(path), "output")
                check_outputs_apart(self._inputs, {"output": str(path)})
        self._files[key] = data.encode() if isinstance(data, str) else data

    def write_now(self, folder: Path, name: str, data: str) -> Path:
        """Write one file into a declared folder at once (dumps that must survive a failure)."""
        self._make(_key(folder))
        path = folder / name
        check_outputs_apart(self._inputs, {"output": str(path)})
        write_atomic(path, data)
        return path

    def commit(self) -> None:
        """Write every output given, files all together, then standard output."""
        files = [(Path(key), data) for key, data in self._files.items() if key != "-" and data is not None]
        for key in sorted({os.path.dirname(str(path)) for path, _ in files}):
            self._make(key)
        write_files(files)
        stdout = self._files.get("-")
        if stdout is not None:
            write_atomic("-", stdout)

    def _make(self, key: str) -> None:
        if key in self._folders and not self._folders[key][1]:
            folder = self._folders[key][0]
            folder.mkdir()
            self._folders[key] = (folder, True)
            self.note(f"created folder {folder}")


def _key(path: str | Path) -> str:
    return "-" if str(path) == "-" else os.path.abspath(path)


def tool_parser(prog: str, description: str) -> ArgumentParser:
    """The argument parser of a tool, with the options every tool has."""
    parser = ArgumentParser(prog=prog, description=description)
    parser.add_argument("--debug", action="store_true", help="show the traceback of an error")
    return parser


Body = Callable[[argparse.Namespace, Run], int]


def run_tool(tool: str, parser: argparse.ArgumentParser, body: Body, argv: Sequence[str] | None = None) -> int:
    """Run ``body`` as the command-line tool ``tool`` (see the module docstring)."""
    debug = "--debug" in (sys.argv[1:] if argv is None else argv)
    try:
        args = parser.parse_args(argv)
        return body(args, Run(tool))
    except (TesseraError, PlanError) as err:  # PlanError: a plan the runtime refuses
        if debug:
            raise
        _say(f"{tool}: error: {err}")
        return EXIT_USER_ERROR
    except KeyboardInterrupt:
        _say(f"{tool}: interrupted; no output written")
        return EXIT_INTERRUPTED
    except BrokenPipeError:
        # The reader of standard output went away (`tessera-opt x.tir | head`): nothing to say.
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return EXIT_USER_ERROR
    except Exception as err:  # a bug in Tessera, not the user's input
        if debug:
            raise
        where = traceback.extract_tb(err.__traceback__)[-1]
        _say(
            f"{tool}: internal error: {type(err).__name__}: {err} (at {Path(where.filename).name}:{where.lineno}); "
            "rerun with --debug for the full traceback"
        )
        return EXIT_INTERNAL_ERROR




def run_executable(main: Callable[[], int]) -> NoReturn:
    """Run a tool's ``main`` as the executable: with the executables' collector thresholds
    (:data:`support.collector.EXECUTABLE_GC_THRESHOLDS`), ending
    through :func:`leave`. Only for the ``*_command`` entry points: a caller that goes on (a test,
    a trainer importing the API) keeps its own collector settings."""
    collector.use_executable_thresholds()
    leave(main())


def leave(status: int) -> NoReturn:
    """End the process with ``status`` as ``sys.exit`` would, less the interpreter's teardown.

    For the executables only (the ``*_command`` entry points), never for a caller that goes on:
    after a compile of the trillion-scale model, freeing the module, torch and the transformers
    modules object by object took 2.7 s of a 31 s run. Everything a tool writes is committed
    before its body returns; the exit handlers still run (multiprocessing's, logging's,
    temporary files'), then the standard streams are flushed and the process ends.
    """
    run_exit_handlers = getattr(atexit, "_run_exitfuncs", None)
    if run_exit_handlers is None:  # an interpreter without it: the ordinary exit
        sys.exit(status)
    run_exit_handlers()
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except (OSError, ValueError):  # a closed pipe or stream: nothing more can reach it
            status = status or EXIT_USER_ERROR
    os._exit(status)


def _say(message: str) -> None:
    line = " ".join(message.splitlines())
    if len(line) > MAX_MESSAGE_CHARS:
        cut = len(line) - MAX_MESSAGE_CHARS
        line = f"{line[: MAX_MESSAGE_CHARS // 2]} ...[{cut} characters]... {line[-MAX_MESSAGE_CHARS // 2 :]}"
    print(line, file=sys.stderr)
