"""Command-line drivers: ``tessera-compile``, ``tessera-opt``, ``tessera-viz`` and ``tessera-dis``.

Every tool runs on the shared driver (:mod:`tessera.driver`): a user-facing failure
is one line (``tessera-compile: error: ...``) with exit status 1 and no traceback
unless ``--debug`` is given; outputs are checked before the work starts and written
only after everything succeeded, all together, so a failed run leaves no file.
"""

from __future__ import annotations

import argparse
import base64
import json
import sys
import time
import warnings
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import NoReturn

from passes.costs.profile_cache import ProfileCacheWarning
from passes.manager import PASS_REGISTRY, ModulePass, PassManager, get_pass_class
from passes.scheduling.cache import ScheduleCacheWarning
from passes.simulation.routing import DEFAULT_ZIPF_S, ROUTING_KINDS, RoutingSpec
from tessera.compile_cache import CompileCache, CompileCacheWarning, RenderedOutputs, file_digest
from tessera.driver import EXIT_USER_ERROR, Run, run_executable, run_tool, tool_parser
from tessera.io import check_input_name
from tessera_ir.errors import TesseraError
from tessera_ir.model import Module
from tessera_ir.parser import parse_module
from tessera_ir.printer import print_module
from tessera_ir.run_settings import set_run_settings


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


def _plan_output(run: Run, path: str | None, emit: str = "ir", flag: str = "-o") -> str | None:
    """Declare the output file of the plan: textual IR, or with ``emit="tsb"`` its bytecode."""
    if path is None:
        return None
    if emit == "ir" and path.endswith(".tsb"):
        raise TesseraError(
            f"{flag} {path}: this writes textual IR only; bytecode comes from tessera-compile -o plan.tsb "
            "(or --emit tsb); name the output .tir"
        )
    if emit == "tsb" and path == "-" and sys.stdout.isatty():
        raise TesseraError("refusing to write bytecode to a terminal; give -o plan.tsb")
    return run.output_file(path, flag)


def _render_plan(module: Module, emit: str) -> str | bytes:
    """The module as textual IR, or (``emit="tsb"``) its per-rank programs as bytecode."""
    if emit == "tsb":
        from codegen.emit import plan_bytes

        return plan_bytes(module)
    return print_module(module)


def _as_bytes(data: str | bytes) -> bytes:
    return data.encode() if isinstance(data, str) else data


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


def _print_timing(
    manager_timings: list, extra: list[tuple[str, float]], after: Sequence[tuple[str, float]] = (),
    verify_end_seconds: float = 0.0, after_parts: dict[str, list[tuple[str, float]]] | None = None,
) -> None:
    """Capture (or the cache) and the rest of ``extra``, each pass with what it timed inside
    itself, the verifier's runs between passes, then ``after`` (printing and writing, with
    ``after_parts`` under the row they belong to)."""
    rows = extra + [(f"pass {t.name}", t.seconds) for t in manager_timings]
    verified = sum(t.verify_seconds for t in manager_timings)
    if verified:
        rows.append(("verify after each pass", verified))
    finished = sum(t.finish_seconds for t in manager_timings)
    if finished:
        rows.append(("waiting for the passes' background checks", finished))
    if verify_end_seconds:
        rows.append(("verify the planned module", verify_end_seconds))
    rows += list(after)
    parts = {f"pass {t.name}": t.parts for t in manager_timings} | (after_parts or {})
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


# How --timing names the artefacts rendered after the passes.
_ARTEFACT_LABELS = {
    "capacity": "the capacity report (simulated iterations)", "report": "the report", "summary": "the summary JSON",
    "partition": "the partition JSON", "bytecode": "the plan",
}


def _hardware_flag(p: argparse.ArgumentParser, default: str | None, help_text: str) -> None:
    from passes.costs.hardware import shipped_hardware

    p.add_argument("--hardware", default=default, metavar="|".join(shipped_hardware()) + "|PATH.json", help=help_text)


def _settings_flags(p: argparse.ArgumentParser) -> None:
    """The run-wide settings (tessera_ir.run_settings): recorded in the module header, read by every
    pass that needs them; unset, the header's value (its default when it has none)."""
    from tessera_ir.run_settings import RunSettings

    default = RunSettings()
    group = p.add_argument_group("run-wide settings (recorded in the module header; read by every pass that needs them)")
    group.add_argument("--memory-gib", type=float, default=None,
                       help="device memory capacity in GiB (default: the target hardware's)")
    group.add_argument("--reserved-gib", type=float, default=None,
                       help="memory per device no model tensor uses: CUDA context, communication buffers "
                            f"(default {default.reserved_gib:g})")
    group.add_argument("--wgrad-headroom", action=argparse.BooleanOptionalAction, default=None,
                       help="reserve one more micro-batch of activations for deferred weight gradients (default: on)")
    group.add_argument("--dbo-memory-budget", type=_dbo_budget, default=None, metavar="headroom|SHARE",
                       help="what the DBO's pool of deferred weight gradients may hold: 'headroom' (device memory "
                            "less the stage's static peak and --dbo-memory-margin) or a share of device memory "
                            f"in [0, 1] (default {default.dbo_memory_budget})")
    group.add_argument("--dbo-memory-margin", type=float, default=None, metavar="SHARE",
                       help="share of device memory the headroom budget leaves free beside the static peak "
                            f"(default {default.dbo_memory_margin:g})")
    group.add_argument("--combined-1f1b", dest="combined", action=argparse.BooleanOptionalAction, default=None,
                       help="Megatron-Core's combined-1F1B pipeline order (default: on whenever --ep > 1)")


def _dbo_budget(text: str) -> float | str:
    if text == "headroom":
        return text
    try:
        return float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"'headroom' or a share of device memory in [0, 1], got '{text}'") from None


def _settings(args: argparse.Namespace) -> dict[str, object]:
    """The run-wide settings the command line gives (unset ones left out)."""
    names = ("memory_gib", "reserved_gib", "wgrad_headroom", "dbo_memory_budget", "dbo_memory_margin", "combined")
    return {name: getattr(args, name) for name in names if getattr(args, name) is not None}


# ---------------------------------------------------------------- tessera-compile


def _compile_parser() -> argparse.ArgumentParser:
    p = tool_parser(
        "tessera-compile", "Capture a model with torch.fx, lower it to Tessera IR and run the planning passes."
    )
    p.add_argument("source", help="model.py with build_model(), hf:<model_type>, or a path to an HF config.json")
    p.add_argument("-o", "--output", help="output file ('-' for stdout)")
    p.add_argument("--emit", choices=["ir", "tsb"], default=None,
                   help="what to write to -o: ir (textual Tessera IR) or tsb (the plan's bytecode, for the runtime); "
                   "default: tsb when -o ends in .tsb, else ir")
    p.add_argument("--summary-json", metavar="PATH", help="write the per-layer summary as JSON")
    p.add_argument("--partition-json", metavar="PATH", help="write the chosen partition as JSON (needs the partition pass)")
    p.add_argument("--report", action="store_true", help="print the report of where the time goes")
    p.add_argument("--passes", default=None, help="pass pipeline to run after capture, e.g. 'a,b{opt=v}' "
                   "(default: the planning pipeline; 'none' to only capture)")
    p.add_argument("--dump-after", metavar="PASSES", help="print the IR after these passes ('all' or a comma list)")
    p.add_argument("--dump-dir", metavar="DIR", help="write --dump-after dumps as files in DIR instead of stderr")
    p.add_argument("--no-verify", dest="verify", action="store_false",
                   help="skip the verifier (on the captured module and on the planned one)")
    p.add_argument("--verify-each", action="store_true",
                   help="run the verifier after every pass instead of once at the end, so a broken invariant names "
                   "the pass that broke it (slower)")
    p.add_argument("--timing", action="store_true", help="print how long capture and each pass took")
    p.add_argument("--no-cache", dest="cache", action="store_false",
                   help="neither read nor write the compile and schedule caches (passes' cache=false)")
    p.add_argument("--ledger", metavar="RUN.jsonl",
                   help="a training run's prediction ledger: its observed task durations and pair costs replace the "
                        "estimates (measured-durations first, measured-pairs after profile), and the capacity report shows "
                        "its error per kind and the pairs it re-priced")
    _hardware_flag(p, "h100", "target hardware the plan is for (default h100; cpu: this machine, calibrated once)")
    _settings_flags(p)
    p.add_argument("--layer-kind", action="append", default=[], metavar="INDEX=KIND",
                   help="set the mixer kind of decoder layers, e.g. 3=linear_attention or 0-2,5=ssm (repeatable; "
                   "overrides recognition and LAYER_KINDS in model.py)")
    group = p.add_argument_group("parallel settings (override PARALLEL in model.py and the workload defaults)")
    for flag, typ, help_text in PARALLEL_FLAGS:
        group.add_argument(flag, type=typ, default=None, help=help_text)
    group.add_argument("--distributed-optimizer", action=argparse.BooleanOptionalAction, default=None,
                       help="shard optimizer state over the data-parallel replicas (default: on, as public recipes do)")
    cap = p.add_argument_group(
        "capacity report (simulated training iterations of the plan, static and with the DBO; printed after "
        "planning unless the IR goes to stdout)"
    )
    cap.add_argument("--report-json", metavar="PATH", help="write the capacity report as JSON")
    cap.add_argument("--trace", metavar="PATH", help="write the first simulated iteration (with DBO) as a Perfetto/Chrome trace")
    cap.add_argument("--timeline", metavar="PATH", help="write the first simulated iteration (with DBO) as a PNG timeline")
    cap.add_argument("--iterations", type=int, default=10, help="iterations to simulate (default 10)")
    cap.add_argument("--routing", choices=list(ROUTING_KINDS), default="balanced",
                     help="expert routing: balanced, zipf (skewed), drift (skew wandering over iterations), trace (a file)")
    cap.add_argument("--zipf-s", type=float, default=DEFAULT_ZIPF_S, help=f"zipf/drift popularity exponent (default {DEFAULT_ZIPF_S})")
    cap.add_argument("--drift", type=float, default=0.05, help="drift: per-iteration step of log-popularity (default 0.05)")
    cap.add_argument("--routing-trace", metavar="PATH", help="trace routing: JSON of per-iteration, per-layer expert counts")
    cap.add_argument("--routing-seed", type=int, default=0, help="seed of the routing draws (default 0)")
    cap.add_argument("--no-capacity", action="store_true", help="do not simulate the plan")
    return p


def _routing_spec(args: argparse.Namespace) -> RoutingSpec:
    if args.iterations < 1:
        raise TesseraError(f"--iterations must be at least 1, got {args.iterations}")
    if args.routing_trace and not Path(args.routing_trace).is_file():
        raise TesseraError(f"--routing-trace {args.routing_trace}: no such file (a JSON of per-iteration, per-layer expert counts)")
    return RoutingSpec(args.routing, seed=args.routing_seed, zipf_s=args.zipf_s, drift=args.drift, trace=args.routing_trace)


def _capacity(
    args: argparse.Namespace, run: Run, module: Callable[[], Module], spec: RoutingSpec, files: dict[str, str],
    outputs: RenderedOutputs,
) -> str | None:
    """Simulate the plan; give ``run`` the capacity report's files and return its text (None: not printed)."""
    skipped = args.no_capacity or (args.output == "-" and not files and not args.report)
    if skipped and not files:
        return None  # without reading the module, which a cached compile parses only when needed

    def unplanned() -> None:
        if files:
            raise TesseraError(f"{next(iter(files))} needs a planned module; run the planning pipeline (it ends with partition)")

    if skipped:
        if not module().plan_ops("partition"):
            unplanned()
        return None

    def simulate() -> bytes:
        """The simulation's report text and files as one JSON bundle (bytes as base64)."""
        if not module().plan_ops("partition"):
            return json.dumps({"planned": False}).encode()
        from passes.plan_view import PlanView
        from passes.simulation.capacity import plan_capacity
        from passes.simulation.trace import timeline_png, trace_json

        result = plan_capacity(PlanView(module()), spec, iterations=args.iterations, record=bool(args.trace or args.timeline),
                               second_process=True)
        if args.ledger:
            from passes.costs.ledger_file import ledger_fold

            result.report.ledger = ledger_fold(module(), args.ledger)
        title = f"{result.report.title} — {spec.describe()}, with DBO"
        made: dict[str, str | bytes] = {}
        if "--report-json" in files:
            made["--report-json"] = result.report.to_json()
        if "--trace" in files:
            made["--trace"] = trace_json(result.dynamic_first, title)
        if "--timeline" in files:
            made["--timeline"] = timeline_png(result.dynamic_first, title)
        encoded = {flag: base64.b64encode(_as_bytes(d)).decode() for flag, d in made.items()}
        return json.dumps({"planned": True, "text": result.report.render(), "files": encoded}).encode()

    options = {
        "routing": [spec.kind, spec.seed, spec.zipf_s, spec.drift, spec.describe(), file_digest(spec.trace)],
        "iterations": args.iterations,
        "files": sorted(files),
    }
    bundle = json.loads(outputs.get("capacity", options, simulate))
    if not bundle["planned"]:
        unplanned()
        return None
    for flag, encoded in bundle["files"].items():
        run.add(files[flag], base64.b64decode(encoded))
    return None if args.output == "-" else str(bundle["text"])


@contextmanager
def _noted(run: Run, *categories: type[Warning]) -> Iterator[None]:
    """Say warnings of ``categories`` raised meanwhile as the tool's own one-line warnings."""
    with warnings.catch_warnings(record=True) as caught:
        for category in categories:
            warnings.simplefilter("always", category)
        yield
    for warning in caught:
        if issubclass(warning.category, categories):
            run.note(f"warning: {warning.message}")
        else:
            warnings.showwarning(warning.message, warning.category, warning.filename, warning.lineno)


def _compile_paths(args: argparse.Namespace, run: Run) -> None:
    """Refuse, before any work, an output of tessera-compile that names one of its inputs or
    another output (``tessera-compile m.py -o m.py``)."""
    source = None if args.source.startswith("hf:") else args.source
    if source is not None:
        check_input_name(source, "model source")
    inputs = {"model source": source, "model config": _config_in(source), "--ledger": args.ledger,
              "--routing-trace": args.routing_trace, "--hardware file": _hardware_file(args.hardware)}
    outputs = {"-o": args.output, "--summary-json": args.summary_json, "--partition-json": args.partition_json,
               "--report-json": args.report_json, "--trace": args.trace, "--timeline": args.timeline,
               "--dump-dir": args.dump_dir}
    run.keep_apart(inputs, outputs)


def _config_in(source: str | None) -> str | None:
    """The config.json a folder given as the model source holds."""
    return str(Path(source) / "config.json") if source is not None and _is_folder(source) else None


def _is_folder(path: str) -> bool:
    try:
        return Path(path).is_dir()
    except (OSError, ValueError):
        return False


def _hardware_file(hardware: str | None) -> str | None:
    """``--hardware`` when it names a description file rather than a shipped target."""
    from passes.costs.hardware import is_shipped_name

    return None if hardware is None or is_shipped_name(hardware) else hardware


def _compile(args: argparse.Namespace, run: Run) -> int:
    # A thin shell over the one compile driver (tessera.compiling, which tessera.compile runs on
    # too): the command line's checks and outputs around it. Nothing here imports torch or
    # transformers: a compile served from the cache never does.
    from tessera.compiling import CompileRequest, start_compile
    from tessera_ir.summary import summarize

    if not (args.output or args.summary_json or args.partition_json or args.report or args.report_json or args.trace
            or args.timeline):
        raise TesseraError(
            "nothing to do: give -o FILE, --summary-json FILE, --partition-json FILE, --report, --report-json FILE, "
            "--trace FILE or --timeline FILE"
        )
    _compile_paths(args, run)
    emit = args.emit or ("tsb" if args.output and args.output.endswith(".tsb") else "ir")
    output = _plan_output(run, args.output, emit)
    summary = run.output_file(args.summary_json, "--summary-json") if args.summary_json else None
    partition = run.output_file(args.partition_json, "--partition-json") if args.partition_json else None
    capacity_files = {
        flag: run.output_file(path, flag)
        for flag, path in (("--report-json", args.report_json), ("--trace", args.trace), ("--timeline", args.timeline))
        if path
    }
    # A bad pipeline, bad simulation settings, bad sizes or a bad --hardware fail before the capture.
    routing = _routing_spec(args)
    dump = _dump_callback(run, args.dump_after, args.dump_dir)
    names = [flag.lstrip("-").replace("-", "_") for flag, _, _ in PARALLEL_FLAGS] + ["distributed_optimizer"]
    parallel = {name: getattr(args, name) for name in names}
    for flag, typ, _ in PARALLEL_FLAGS:
        value = getattr(args, flag.lstrip("-").replace("-", "_"))
        if typ is int and value is not None and value < 1:
            raise TesseraError(f"{flag} must be a positive integer, got {value}")
    request = CompileRequest.make(
        args.source, "" if args.passes == "none" else args.passes, hardware=args.hardware, layer_kinds=args.layer_kind,
        ledger=args.ledger, verify=args.verify, verify_each=args.verify_each, cache=args.cache, dump_after=dump,
        settings=_settings(args), **parallel,
    )

    with _noted(run, CompileCacheWarning, ScheduleCacheWarning, ProfileCacheWarning):
        # The command line starts no thread before this: its helpers may be forked.
        compilation = start_compile(
            request, want_text=bool(output and emit == "ir"), forks=True, note=lambda text: run.note(f"warning: {text}"),
        )
    module, timings, after, manager = compilation.module, compilation.timings, compilation.after, compilation.manager
    text = compilation.text
    plan = compilation.plan_key

    # Render everything before writing anything, so a failure leaves no output at all. A
    # cacheable plan's artefacts come from (and go to) the outputs layer: a warm compile
    # neither parses the plan nor simulates it again.
    outputs = RenderedOutputs(CompileCache("outputs") if compilation.cacheable and not args.ledger else None, plan)
    start, timed = time.perf_counter(), len(timings)
    with _noted(run, CompileCacheWarning):
        if output:
            if emit == "ir" and text is not None:
                run.add(output, text)
            else:
                run.add(output, outputs.get("bytecode", {"emit": emit}, lambda: _as_bytes(_render_plan(module(), emit))))
        if summary:
            run.add(summary, outputs.text("summary", {}, lambda: json.dumps(summarize(module()), indent=2) + "\n"))
        if partition:
            from passes.partition import partition_to_json

            run.add(partition, outputs.text("partition", {}, lambda: json.dumps(partition_to_json(module()), indent=2) + "\n"))
        report_text = None
        if args.report:
            from tessera.report import render_report

            report_text = outputs.text("report", {}, lambda: render_report(module()))
        capacity_text = _capacity(args, run, module, routing, capacity_files, outputs)
    rendered_s = time.perf_counter() - start
    if outputs.served:
        timings.append((f"outputs from the compile cache ({', '.join(outputs.served)})", outputs.served_seconds))
    with _noted(run, CompileCacheWarning, ScheduleCacheWarning):
        compilation.finish()  # waits for the planned module's verification, then caches the plan
    with _noted(run, CompileCacheWarning):
        outputs.flush()  # the plan verified (or came verified from the cache)
    start = time.perf_counter() - rendered_s
    run.commit()
    printed = [text for text in (report_text, capacity_text) if text is not None]
    if printed:
        print("\n\n".join(printed))
    parsed_s = sum(seconds for _, seconds in timings[timed:])  # parsing a cached plan, which has its own row
    other = "other outputs, reports, writing"
    after.append((other, time.perf_counter() - start - parsed_s))
    if args.timing:
        rendered = [(f"render {_ARTEFACT_LABELS.get(name, name)}", seconds) for name, seconds in outputs.rendered]
        _print_timing(
            manager.timings if manager is not None else [], timings, after,
            manager.verify_end_seconds if manager is not None else 0.0, {other: rendered},
        )
    return 0


def compile_main(argv: Sequence[str] | None = None) -> int:
    return run_tool("tessera-compile", _compile_parser(), _compile, argv)


def compile_command() -> NoReturn:
    """The ``tessera-compile`` executable."""
    run_executable(compile_main)


# ---------------------------------------------------------------- tessera-opt


def _opt_parser() -> argparse.ArgumentParser:
    p = tool_parser("tessera-opt", "Run passes on textual Tessera IR and print the result.")
    p.add_argument("input", nargs="?", default="-", help="input .tir file ('-' or nothing for stdin)")
    p.add_argument("--passes", default="", help="comma-separated pass pipeline, e.g. 'verify' or 'a,b{opt=v}'")
    p.add_argument("-o", "--output", default="-",
                   help="output file (default: stdout); a .tsb file gets the per-rank programs as bytecode")
    p.add_argument("--dump-after", metavar="PASSES", help="print the IR after these passes ('all' or a comma list)")
    p.add_argument("--dump-dir", metavar="DIR", help="write --dump-after dumps as files in DIR instead of stderr")
    p.add_argument("--no-verify", dest="verify", action="store_false", help="skip verifying input and pass results")
    p.add_argument("--timing", action="store_true", help="print how long parsing and each pass took")
    p.add_argument("--list-passes", action="store_true", help="list the registered passes with their options and exit")
    p.add_argument("--split-input-file", action="store_true",
                   help="run on each '// -----'-separated part of the input on its own; print the results joined alike")
    _hardware_flag(p, None, "target hardware, overriding the module's 'hardware' attribute")
    _settings_flags(p)
    return p


def _list_passes() -> None:
    from passes.manager import describe_options

    for name in sorted(PASS_REGISTRY):
        cls = get_pass_class(name)
        print(f"{name}: {cls.summary}")
        for o in describe_options(cls):
            print(f"  {o.name}: {o.type} = {o.default}  -- {o.help}")


def _opt(args: argparse.Namespace, run: Run) -> int:
    from passes.manager import parse_pipeline
    from tessera_ir.verifier import verify

    if args.list_passes:
        _list_passes()
        return 0
    passes = parse_pipeline(args.passes) if args.passes.strip() else []  # bad pipelines fail before reading input
    run.keep_apart({"input": args.input, "--hardware file": _hardware_file(args.hardware)},
                   {"-o": args.output, "--dump-dir": args.dump_dir})
    emit = "tsb" if args.output.endswith(".tsb") else "ir"
    if emit == "tsb" and args.split_input_file:
        raise TesseraError(f"-o {args.output}: --split-input-file writes textual IR only; name the output .tir")
    output = _plan_output(run, args.output, emit)
    assert output is not None
    dump = _dump_callback(run, args.dump_after, args.dump_dir)
    if args.hardware is not None:
        from tessera.api import resolve_hardware

        resolve_hardware(args.hardware)
    settings = _settings(args)
    set_run_settings({}, **settings)  # bad settings fail before reading the input

    def run_on(module: Module) -> PassManager:
        if args.hardware is not None:
            module.attrs["hardware"] = args.hardware
        set_run_settings(module.attrs, **settings)
        if args.verify:
            verify(module)
        manager = PassManager(list(passes), verify_each=args.verify, dump_after=dump)
        manager.run(module)
        return manager

    if not args.split_input_file:
        start = time.perf_counter()
        module = run.parse_ir(args.input)
        parse_s = time.perf_counter() - start
        manager = run_on(module)
        run.add(output, _render_plan(module, emit))
        run.commit()
        if args.timing:
            _print_timing(manager.timings, [("read and parse", parse_s)])
        return 0
    # Like mlir-opt: each part runs on its own; a failing part prints its error (on stderr,
    # in order with the output) and the others still run; the exit status reports failure,
    # and a file given by -o is written only when every part succeeded.
    source = "<stdin>" if args.input == "-" else args.input
    text = run.read_text(args.input)
    outputs, failed = [], False
    for k, (line, part) in enumerate(_split_parts(text)):
        if k and output == "-":
            sys.stdout.write(SPLIT_MARKER + "\n")
            sys.stdout.flush()
        try:
            part_module = parse_module(part, source=source)
            run_on(part_module)
            printed = print_module(part_module)
        except TesseraError as err:
            if args.debug:
                raise
            printed, failed = "", True
            run.note(f"error: {source}, part at line {line}: {err}")
            sys.stderr.flush()
        outputs.append(printed)
        if output == "-":
            sys.stdout.write(printed)
            sys.stdout.flush()
    if output != "-" and not failed:
        run.add(output, (SPLIT_MARKER + "\n").join(outputs))
        run.commit()
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
    return run_tool("tessera-opt", _opt_parser(), _opt, argv)


def opt_command() -> NoReturn:
    """The ``tessera-opt`` executable."""
    run_executable(opt_main)


# ---------------------------------------------------------------- tessera-dis


def _dis_parser() -> argparse.ArgumentParser:
    p = tool_parser(
        "tessera-dis", "Print a plan's bytecode (.tsb) as text, or assemble that text back into the identical bytes."
    )
    p.add_argument("input", help="a .tsb plan (or, with --assemble, its text form; '-' for stdin)")
    p.add_argument("-o", "--output", default="-", help="output file (default: stdout)")
    p.add_argument("--assemble", action="store_true", help="read the text form and write the bytecode")
    return p


def _dis(args: argparse.Namespace, run: Run) -> int:
    from codegen.disassembler import assemble, disassemble
    from tessera.io import read_bytes

    run.keep_apart({"input": args.input}, {"-o": args.output})
    output = run.output_file(args.output, "-o")
    raw = read_bytes(args.input)
    if args.assemble:
        try:
            text = raw.decode("utf-8")
        except UnicodeDecodeError:
            raise TesseraError(f"{args.input}: the text form is not UTF-8 (is it a .tsb? drop --assemble)") from None
        if output == "-" and sys.stdout.isatty():
            raise TesseraError("refusing to write bytecode to a terminal; give -o plan.tsb")
        run.add(output, assemble(text))
    else:
        run.add(output, disassemble(raw))
    run.commit()
    return 0


def dis_main(argv: Sequence[str] | None = None) -> int:
    return run_tool("tessera-dis", _dis_parser(), _dis, argv)


def viz_main(argv: Sequence[str] | None = None) -> int:
    from tessera.viz import main

    return main(argv)


if __name__ == "__main__":  # pragma: no cover
    compile_command()
