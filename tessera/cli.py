"""Command-line drivers: ``tessera-compile``, ``tessera-opt``, ``tessera-viz`` and ``tessera-dis``.

Every user-facing failure is a ``TesseraError``: it is printed as one line
(``tessera-compile: error: ...``) with exit status 1 and no traceback unless
``--debug`` is given. Output files are written only after everything
succeeded, each atomically, so a failed run leaves no partial file.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
import traceback
from collections.abc import Callable, Sequence
from pathlib import Path

from passes.manager import PASS_REGISTRY, ModulePass, PassManager, get_pass_class
from runtime.errors import PlanError
from tessera_ir.errors import TesseraError
from tessera_ir.model import Module
from tessera_ir.printer import print_module

EXIT_USER_ERROR = 1
EXIT_INTERNAL_ERROR = 2

def _recompute_modules(text: str) -> list[str]:
    """``--recompute`` value: a comma list of module names, or ``none``."""
    from tessera_ir.parallel import RECOMPUTE_MODULES

    names = [] if text.strip() == "none" else [n.strip() for n in text.split(",") if n.strip()]
    unknown = [n for n in names if n not in RECOMPUTE_MODULES]
    if unknown:
        raise argparse.ArgumentTypeError(
            f"unknown module(s) {', '.join(unknown)}; use a comma list of {', '.join(RECOMPUTE_MODULES)}, or none"
        )
    return names


PARALLEL_FLAGS: list[tuple[str, Callable[[str], object], str]] = [
    ("--pp", int, "pipeline-parallel size (devices in the pipeline)"),
    ("--vpp", int, "virtual pipeline stages (model chunks) per device"),
    ("--ep", int, "expert-parallel size"),
    ("--tp", int, "tensor-parallel size (with sequence parallelism)"),
    ("--dp", int, "data-parallel size: replicas of the dense layers, over which the distributed optimizer "
                  "shards their state (experts: over dp*cp*tp/ep)"),
    ("--cp", int, "context-parallel size: ranks the sequence is split over (long sequences)"),
    ("--microbatches", int, "micro-batches per iteration"),
    ("--micro-batch-size", int, "sequences per micro-batch"),
    ("--seq-len", int, "sequence length in tokens"),
    ("--dtype", str, "activation/weight dtype: bf16, fp16, fp32, fp8"),
    ("--recompute", _recompute_modules, "selective recomputation: comma list of core_attn, mla_up_proj, layernorm, "
                                        "moe_act, moe, shared_experts, mlp (Megatron-Core's module names), or none"),
]


def _run_tool(tool: str, argv: Sequence[str] | None, body: Callable[[argparse.Namespace], int], parser: argparse.ArgumentParser) -> int:
    args = parser.parse_args(argv)
    try:
        return body(args)
    except (TesseraError, PlanError) as err:
        if args.debug:
            raise
        print(f"{tool}: error: {err}", file=sys.stderr)
        return EXIT_USER_ERROR
    except KeyboardInterrupt:
        print(f"{tool}: interrupted; no output written", file=sys.stderr)
        return 130
    except Exception as err:  # a bug in Tessera, not the user's input
        if args.debug:
            raise
        where = traceback.extract_tb(err.__traceback__)[-1]
        print(
            f"{tool}: internal error: {type(err).__name__}: {err} (at {Path(where.filename).name}:{where.lineno}); "
            "rerun with --debug for the full traceback",
            file=sys.stderr,
        )
        return EXIT_INTERNAL_ERROR


def _dump_callback(spec: str | None, dump_dir: str | None) -> Callable[[ModulePass, Module], None] | None:
    """``--dump-after=all`` or a comma list of pass names: print the IR after those passes."""
    if not spec:
        return None
    wanted = None if spec == "all" else {s.strip() for s in spec.split(",")}
    if wanted:
        for name in wanted:
            get_pass_class(name)  # unknown names fail before any pass runs
    counter = [0]

    def dump(p: ModulePass, module: Module) -> None:
        counter[0] += 1
        if wanted is not None and p.name not in wanted:
            return
        text = print_module(module)
        if dump_dir:
            from tessera.io import write_atomic

            write_atomic(Path(dump_dir) / f"{counter[0]:02d}-{p.name}.tir", text)
        else:
            sys.stderr.write(f"// ----- IR dump after {p.spelling()} -----\n{text}")

    return dump


def _print_timing(manager_timings: list, extra: list[tuple[str, float]]) -> None:
    rows = extra + [(f"pass {t.name}", t.seconds) for t in manager_timings]
    parts = {f"pass {t.name}": t.parts for t in manager_timings}
    total = sum(s for _, s in rows)
    print("===-------------------------------------------===", file=sys.stderr)
    print("  Tessera execution timing report", file=sys.stderr)
    print("===-------------------------------------------===", file=sys.stderr)
    for name, seconds in rows:
        share = 100.0 * seconds / total if total else 0.0
        print(f"  {seconds:9.4f} s ({share:5.1f}%)  {name}", file=sys.stderr)
        for label, part_s in parts.get(name, []):  # what the pass timed inside itself
            print(f"  {part_s:9.4f} s           {label}", file=sys.stderr)
    print(f"  {total:9.4f} s (100.0%)  total", file=sys.stderr)


def _hardware_flag(p: argparse.ArgumentParser, default: str | None, help_text: str) -> None:
    from passes.costs.hardware import shipped_hardware

    p.add_argument("--hardware", default=default, metavar="|".join(shipped_hardware()) + "|PATH.json", help=help_text)


# ---------------------------------------------------------------- tessera-compile


def _compile_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="tessera-compile",
        description="Capture a model with torch.fx, lower it to Tessera IR and run the planning passes.",
    )
    p.add_argument("source", help="model.py with build_model(), hf:<model_type>, or a path to an HF config.json")
    p.add_argument("-o", "--output", help="output file ('-' for stdout)")
    p.add_argument("--emit", choices=["ir"], default="ir", help="what to write to -o: ir (textual Tessera IR)")
    p.add_argument("--summary-json", metavar="PATH", help="write the per-layer summary as JSON")
    p.add_argument("--partition-json", metavar="PATH", help="write the chosen partition as JSON (needs the partition pass)")
    p.add_argument("--report", action="store_true", help="print the report of where the time goes")
    p.add_argument("--passes", default=None, help="pass pipeline to run after capture, e.g. 'a,b{opt=v}' "
                   "(default: the planning pipeline; 'none' to only capture)")
    p.add_argument("--dump-after", metavar="PASSES", help="print the IR after these passes ('all' or a comma list)")
    p.add_argument("--dump-dir", metavar="DIR", help="write --dump-after dumps as files in DIR instead of stderr")
    p.add_argument("--no-verify", dest="verify", action="store_false", help="skip the verifier between passes")
    p.add_argument("--timing", action="store_true", help="print how long capture and each pass took")
    _hardware_flag(p, "h100", "target hardware the plan is for (default h100; cpu: this machine, calibrated once)")
    p.add_argument("--debug", action="store_true", help="show tracebacks")
    group = p.add_argument_group("parallel settings (override PARALLEL in model.py and the workload defaults)")
    for flag, typ, help_text in PARALLEL_FLAGS:
        group.add_argument(flag, type=typ, default=None, help=help_text)
    group.add_argument("--distributed-optimizer", action=argparse.BooleanOptionalAction, default=None,
                       help="shard optimizer state over the data-parallel replicas (default: on, as public recipes do)")
    return p


def _compile(args: argparse.Namespace) -> int:
    from passes.manager import parse_pipeline
    from tessera.api import DEFAULT_PIPELINE, capture, resolve_hardware, run_passes
    from tessera_ir.summary import summarize
    from tessera_ir.verifier import verify

    if not (args.output or args.summary_json or args.partition_json or args.report):
        raise TesseraError("nothing to do: give -o FILE, --summary-json FILE, --partition-json FILE or --report")
    if args.output and args.output.endswith(".tsb"):
        raise TesseraError(
            f"-o {args.output}: this version emits textual IR only (--emit ir); bytecode (.tsb) comes with the "
            "runtime; write the plan as .tir"
        )
    pipeline = DEFAULT_PIPELINE if args.passes is None else ("" if args.passes == "none" else args.passes)
    passes = parse_pipeline(pipeline) if pipeline.strip() else []  # a bad pipeline fails before the capture
    dump = _dump_callback(args.dump_after, args.dump_dir)
    names = [flag.lstrip("-").replace("-", "_") for flag, _, _ in PARALLEL_FLAGS] + ["distributed_optimizer"]
    parallel = {name: getattr(args, name) for name in names}
    resolve_hardware(args.hardware)  # so does a bad --hardware; cpu is calibrated here if it never was

    start = time.perf_counter()
    module = capture(args.source, **parallel)
    module.attrs["hardware"] = args.hardware  # the target every pass, the report and viz read
    capture_s = time.perf_counter() - start
    start = time.perf_counter()
    if args.verify:
        verify(module)
    verify_s = time.perf_counter() - start
    manager = run_passes(module, passes, verify=args.verify, dump_after=dump)

    # Render everything before writing anything, so a failure leaves no output at all.
    outputs: list[tuple[str, str]] = []
    if args.output:
        outputs.append((args.output, print_module(module)))
    if args.summary_json:
        outputs.append((args.summary_json, json.dumps(summarize(module), indent=2) + "\n"))
    if args.partition_json:
        from passes.partition import partition_to_json

        outputs.append((args.partition_json, json.dumps(partition_to_json(module), indent=2) + "\n"))
    report_text = None
    if args.report:
        from tessera.report import render_report

        report_text = render_report(module)
    from tessera.io import write_atomic

    for path, text in outputs:
        write_atomic(path, text)
    if report_text is not None:
        print(report_text)
    if args.timing:
        _print_timing(manager.timings, [("capture", capture_s), ("verify input", verify_s)])
    return 0


def compile_main(argv: Sequence[str] | None = None) -> int:
    return _run_tool("tessera-compile", argv, _compile, _compile_parser())


# ---------------------------------------------------------------- tessera-opt


def _opt_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="tessera-opt",
        description="Run passes on textual Tessera IR and print the result.",
    )
    p.add_argument("input", nargs="?", default="-", help="input .tir file ('-' or nothing for stdin)")
    p.add_argument("--passes", default="", help="comma-separated pass pipeline, e.g. 'verify' or 'a,b{opt=v}'")
    p.add_argument("-o", "--output", default="-", help="output file (default: stdout)")
    p.add_argument("--dump-after", metavar="PASSES", help="print the IR after these passes ('all' or a comma list)")
    p.add_argument("--dump-dir", metavar="DIR", help="write --dump-after dumps as files in DIR instead of stderr")
    p.add_argument("--no-verify", dest="verify", action="store_false", help="skip verifying input and pass results")
    p.add_argument("--timing", action="store_true", help="print how long parsing and each pass took")
    p.add_argument("--list-passes", action="store_true", help="list the registered passes with their options and exit")
    p.add_argument("--split-input-file", action="store_true",
                   help="run on each '// -----'-separated part of the input on its own; print the results joined alike")
    _hardware_flag(p, None, "target hardware, overriding the module's 'hardware' attribute")
    p.add_argument("--debug", action="store_true", help="show tracebacks")
    return p


def _list_passes() -> None:
    from passes.manager import describe_options

    for name in sorted(PASS_REGISTRY):
        cls = get_pass_class(name)
        print(f"{name}: {cls.summary}")
        for o in describe_options(cls):
            print(f"  {o.name}: {o.type} = {o.default}  -- {o.help}")


def _opt(args: argparse.Namespace) -> int:
    from passes.manager import parse_pipeline
    from tessera_ir.parser import parse_module
    from tessera_ir.verifier import verify

    if args.list_passes:
        _list_passes()
        return 0
    passes = parse_pipeline(args.passes) if args.passes.strip() else []  # bad pipelines fail before reading input
    dump = _dump_callback(args.dump_after, args.dump_dir)
    if args.hardware is not None:
        from tessera.api import resolve_hardware

        resolve_hardware(args.hardware)
    if args.input == "-":
        text, source = sys.stdin.read(), "<stdin>"
    else:
        path = Path(args.input)
        if not path.is_file():
            raise TesseraError(f"input file '{args.input}' does not exist")
        text, source = path.read_text(), str(path)

    def run(part: str) -> tuple[str, PassManager, float]:
        start = time.perf_counter()
        module = parse_module(part, source=source)
        parse_s = time.perf_counter() - start
        if args.hardware is not None:
            module.attrs["hardware"] = args.hardware
        if args.verify:
            verify(module)
        manager = PassManager(list(passes), verify_each=args.verify, dump_after=dump)
        manager.run(module)
        return print_module(module), manager, parse_s

    from tessera.io import write_atomic

    if not args.split_input_file:
        printed, manager, parse_s = run(text)
        write_atomic(args.output, printed)
        if args.timing:
            _print_timing(manager.timings, [("parse", parse_s)])
        return 0
    # Like mlir-opt: each part runs on its own; a failing part prints its error (on stderr,
    # in order with the output) and the others still run; the exit status reports failure,
    # and a file given by -o is written only when every part succeeded.
    outputs, failed = [], False
    for k, (line, part) in enumerate(_split_parts(text)):
        if k and args.output == "-":
            sys.stdout.write(SPLIT_MARKER + "\n")
            sys.stdout.flush()
        try:
            printed = run(part)[0]
        except TesseraError as err:
            if args.debug:
                raise
            printed, failed = "", True
            print(f"tessera-opt: error: {source}, part at line {line}: {err}", file=sys.stderr, flush=True)
        outputs.append(printed)
        if args.output == "-":
            sys.stdout.write(printed)
            sys.stdout.flush()
    if args.output != "-" and not failed:
        write_atomic(args.output, (SPLIT_MARKER + "\n").join(outputs))
    return EXIT_USER_ERROR if failed else 0


SPLIT_MARKER = "// -----"


def _split_parts(text: str) -> list[tuple[int, str]]:
    """The parts of ``text`` between ``// -----`` lines, each with its first line number; a part
    keeps blank lines in place of the lines before it, so parse errors name lines of the file."""
    lines = text.splitlines(keepends=True)
    parts: list[tuple[int, str]] = []
    begin = 0
    for i, line in enumerate(lines + [SPLIT_MARKER + "\n"]):
        if line.strip() == SPLIT_MARKER:
            parts.append((begin + 1, "\n" * begin + "".join(lines[begin:i])))
            begin = i + 1
    return parts


def opt_main(argv: Sequence[str] | None = None) -> int:
    return _run_tool("tessera-opt", argv, _opt, _opt_parser())


# ---------------------------------------------------------------- tessera-dis


def _dis_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="tessera-dis",
        description="Print a plan's bytecode (.tsb) as text, or assemble that text back into the identical bytes.",
    )
    p.add_argument("input", help="a .tsb plan (or, with --assemble, its text form; '-' for stdin)")
    p.add_argument("-o", "--output", default="-", help="output file (default: stdout)")
    p.add_argument("--assemble", action="store_true", help="read the text form and write the bytecode")
    p.add_argument("--debug", action="store_true", help="show tracebacks")
    return p


def _dis(args: argparse.Namespace) -> int:
    from codegen.disassembler import assemble, disassemble
    from tessera.io import write_atomic

    if args.input == "-":
        raw = sys.stdin.buffer.read()
    else:
        path = Path(args.input)
        if not path.is_file():
            raise TesseraError(f"input file '{args.input}' does not exist")
        raw = path.read_bytes()
    if args.assemble:
        try:
            text = raw.decode("utf-8")
        except UnicodeDecodeError:
            raise TesseraError(f"{args.input}: the text form is not UTF-8 (is it a .tsb? drop --assemble)") from None
        if args.output == "-" and sys.stdout.isatty():
            raise TesseraError("refusing to write bytecode to a terminal; give -o plan.tsb")
        write_atomic(args.output, assemble(text))
    else:
        write_atomic(args.output, disassemble(raw))
    return 0


def dis_main(argv: Sequence[str] | None = None) -> int:
    return _run_tool("tessera-dis", argv, _dis, _dis_parser())


def viz_main(argv: Sequence[str] | None = None) -> int:
    from tessera.viz import main

    return main(argv)


if __name__ == "__main__":  # pragma: no cover
    sys.exit(compile_main())
