"""Command-line drivers: ``tessera-compile``, ``tessera-opt`` and ``tessera-viz``.

Every tool runs on the shared driver (:mod:`tessera.driver`): a user-facing failure
is one line (``tessera-compile: error: ...``) with exit status 1 and no traceback
unless ``--debug`` is given; outputs are checked before the work starts and written
only after everything succeeded, all together, so a failed run leaves no file.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from collections.abc import Callable, Sequence

from passes.manager import PASS_REGISTRY, ModulePass, get_pass_class
from tessera.driver import Run, run_tool, tool_parser
from tessera_ir.errors import TesseraError
from tessera_ir.model import Module
from tessera_ir.printer import print_module

PARALLEL_FLAGS = [
    ("--pp", int, "pipeline-parallel size (devices in the pipeline)"),
    ("--vpp", int, "virtual pipeline stages (model chunks) per device"),
    ("--ep", int, "expert-parallel size"),
    ("--tp", int, "tensor-parallel size"),
    ("--microbatches", int, "micro-batches per iteration"),
    ("--micro-batch-size", int, "sequences per micro-batch"),
    ("--seq-len", int, "sequence length in tokens"),
    ("--dtype", str, "activation/weight dtype: bf16, fp16, fp32, fp8"),
]


def _ir_output(run: Run, path: str | None, flag: str = "-o") -> str | None:
    """Declare an output file for textual IR; bytecode does not exist yet."""
    if path is None:
        return None
    if path.endswith(".tsb"):
        raise TesseraError(
            f"{flag} {path}: this version writes textual IR only; bytecode (.tsb) comes with the runtime; "
            "write the plan as .tir"
        )
    return run.output_file(path, flag)


def _dump_callback(run: Run, spec: str | None, dump_dir: str | None) -> Callable[[ModulePass, Module], None] | None:
    """``--dump-after=all`` or a comma list of pass names: print the IR after those passes."""
    if not spec:
        if dump_dir:
            raise TesseraError("--dump-dir needs --dump-after (all or a comma list of passes)")
        return None
    wanted = None if spec == "all" else {s.strip() for s in spec.split(",")}
    if wanted:
        for name in wanted:
            get_pass_class(name)  # unknown names fail before any pass runs
    folder = run.output_folder(dump_dir, "--dump-dir") if dump_dir else None
    counter = [0]

    def dump(p: ModulePass, module: Module) -> None:
        counter[0] += 1
        if wanted is not None and p.name not in wanted:
            return
        text = print_module(module)
        if folder is not None:
            run.write_now(folder, f"{counter[0]:02d}-{p.name}.tir", text)
        else:
            sys.stderr.write(f"// ----- IR dump after {p.spelling()} -----\n{text}")

    return dump


def _print_timing(manager_timings: list, extra: list[tuple[str, float]]) -> None:
    rows = extra + [(f"pass {t.name}", t.seconds) for t in manager_timings]
    total = sum(s for _, s in rows)
    print("===-------------------------------------------===", file=sys.stderr)
    print("  Tessera execution timing report", file=sys.stderr)
    print("===-------------------------------------------===", file=sys.stderr)
    for name, seconds in rows:
        share = 100.0 * seconds / total if total else 0.0
        print(f"  {seconds:9.4f} s ({share:5.1f}%)  {name}", file=sys.stderr)
    print(f"  {total:9.4f} s (100.0%)  total", file=sys.stderr)


# ---------------------------------------------------------------- tessera-compile


def _compile_parser() -> argparse.ArgumentParser:
    p = tool_parser(
        "tessera-compile", "Capture a model with torch.fx, lower it to Tessera IR and run the planning passes."
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
    group = p.add_argument_group("parallel settings (override PARALLEL in model.py and the workload defaults)")
    for flag, typ, help_text in PARALLEL_FLAGS:
        group.add_argument(flag, type=typ, default=None, help=help_text)
    return p


def _compile(args: argparse.Namespace, run: Run) -> int:
    from tessera.api import DEFAULT_PIPELINE, capture, run_passes
    from tessera_ir.summary import summarize
    from tessera_ir.verifier import verify

    if not (args.output or args.summary_json or args.partition_json or args.report):
        raise TesseraError("nothing to do: give -o FILE, --summary-json FILE, --partition-json FILE or --report")
    output = _ir_output(run, args.output)
    summary = run.output_file(args.summary_json, "--summary-json") if args.summary_json else None
    partition = run.output_file(args.partition_json, "--partition-json") if args.partition_json else None
    pipeline = DEFAULT_PIPELINE if args.passes is None else ("" if args.passes == "none" else args.passes)
    dump = _dump_callback(run, args.dump_after, args.dump_dir)
    parallel = {flag.lstrip("-").replace("-", "_"): getattr(args, flag.lstrip("-").replace("-", "_")) for flag, _, _ in PARALLEL_FLAGS}

    start = time.perf_counter()
    module = capture(args.source, **parallel)
    capture_s = time.perf_counter() - start
    start = time.perf_counter()
    if args.verify:
        verify(module)
    verify_s = time.perf_counter() - start
    manager = run_passes(module, pipeline, verify=args.verify, dump_after=dump)

    # Render everything before writing anything, so a failure leaves no output at all.
    if output:
        run.add(output, print_module(module))
    if summary:
        run.add(summary, json.dumps(summarize(module), indent=2) + "\n")
    if partition:
        from passes.partition import partition_to_json

        run.add(partition, json.dumps(partition_to_json(module), indent=2) + "\n")
    report_text = None
    if args.report:
        from tessera.report import render_report

        report_text = render_report(module)
    run.commit()
    if report_text is not None:
        print(report_text)
    if args.timing:
        _print_timing(manager.timings, [("capture", capture_s), ("verify input", verify_s)])
    return 0


def compile_main(argv: Sequence[str] | None = None) -> int:
    return run_tool("tessera-compile", _compile_parser(), _compile, argv)


# ---------------------------------------------------------------- tessera-opt


def _opt_parser() -> argparse.ArgumentParser:
    p = tool_parser("tessera-opt", "Run passes on textual Tessera IR and print the result.")
    p.add_argument("input", nargs="?", default="-", help="input .tir file ('-' or nothing for stdin)")
    p.add_argument("--passes", default="", help="comma-separated pass pipeline, e.g. 'verify' or 'a,b{opt=v}'")
    p.add_argument("-o", "--output", default="-", help="output file (default: stdout)")
    p.add_argument("--dump-after", metavar="PASSES", help="print the IR after these passes ('all' or a comma list)")
    p.add_argument("--dump-dir", metavar="DIR", help="write --dump-after dumps as files in DIR instead of stderr")
    p.add_argument("--no-verify", dest="verify", action="store_false", help="skip verifying input and pass results")
    p.add_argument("--timing", action="store_true", help="print how long parsing and each pass took")
    p.add_argument("--list-passes", action="store_true", help="list the registered passes and exit")
    return p


def _opt(args: argparse.Namespace, run: Run) -> int:
    from passes.manager import PassManager, parse_pipeline
    from tessera_ir.verifier import verify

    if args.list_passes:
        for name in sorted(PASS_REGISTRY):
            print(f"{name:20s} {get_pass_class(name).summary}")
        return 0
    passes = parse_pipeline(args.passes) if args.passes.strip() else []  # bad pipelines fail before reading input
    output = _ir_output(run, args.output)
    dump = _dump_callback(run, args.dump_after, args.dump_dir)
    start = time.perf_counter()
    module = run.parse_ir(args.input)
    parse_s = time.perf_counter() - start
    if args.verify:
        verify(module)
    manager = PassManager(passes, verify_each=args.verify, dump_after=dump)
    manager.run(module)
    assert output is not None
    run.add(output, print_module(module))
    run.commit()
    if args.timing:
        _print_timing(manager.timings, [("read and parse", parse_s)])
    return 0


def opt_main(argv: Sequence[str] | None = None) -> int:
    return run_tool("tessera-opt", _opt_parser(), _opt, argv)


def viz_main(argv: Sequence[str] | None = None) -> int:
    from tessera.viz import main

    return main(argv)


if __name__ == "__main__":  # pragma: no cover
    sys.exit(compile_main())
