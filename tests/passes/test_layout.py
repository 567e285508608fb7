"""The architecture, read from the source: which modules may import which (docs/architecture.md's import rules)."""

from __future__ import annotations

import ast
import re
from pathlib import Path

from passes.manager import PASS_REGISTRY

ROOT = Path(__file__).resolve().parents[2]
PASSES = ROOT / "passes"
# The pass modules, as the registry names them.
PASS_MODULES = {target.split(":")[0] for target in PASS_REGISTRY.values()}
TOP_LEVEL_MACHINERY = {"passes.manager", "passes.plan_view"}


def module_name(path: Path) -> str:
    parts = path.relative_to(ROOT).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def imported_modules(path: Path) -> set[str]:
    """Every module ``path`` imports, at the top or inside functions (``from a import b`` counts
    as ``a`` and, when ``a.b`` is a module of ours, as ``a.b``)."""
    out: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            out.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            out.add(node.module)
            out.update(f"{node.module}.{alias.name}" for alias in node.names)
    return out


def python_files(folder: Path) -> list[Path]:
    return sorted(p for p in folder.rglob("*.py") if ".venv" not in p.parts)


def test_no_pass_module_imports_another_pass_module() -> None:
    assert PASS_MODULES == {
        "passes.candidates", "passes.overlap_schedule", "passes.profile", "passes.partition", "passes.verify_pass",
        "passes.dbo_slots", "passes.pipeline", "passes.measured_durations", "passes.measured_pairs",
        "passes.wgrad_deadlines", "passes.refine_bottleneck",
    }
    for name in sorted(PASS_MODULES):
        path = ROOT / (name.replace(".", "/") + ".py")
        others = imported_modules(path) & (PASS_MODULES - {name})
        assert not others, f"{path.relative_to(ROOT)} imports the pass module(s) {sorted(others)}"


def test_machinery_imports_no_pass_and_no_plan_reader() -> None:
    # Subpackages hold the machinery the passes share; they sit below the passes and the view.
    for path in python_files(PASSES):
        name = module_name(path)
        if name.count(".") < 2:
            continue  # a top-level module of passes/
        above = {m for m in imported_modules(path) if m in PASS_MODULES | TOP_LEVEL_MACHINERY}
        assert not above, f"{path.relative_to(ROOT)} imports {sorted(above)}"


def test_the_top_of_passes_holds_only_passes_the_manager_and_the_view() -> None:
    top = {module_name(p) for p in PASSES.glob("*.py")} - {"passes"}
    assert top == PASS_MODULES | TOP_LEVEL_MACHINERY
    subpackages = {p.name for p in PASSES.iterdir() if (p / "__init__.py").is_file()}
    assert subpackages == {"costs", "partitioning", "pipelining", "scheduling", "simulation"}


def test_the_runtime_imports_none_of_the_compiler() -> None:
    # A trainer embeds the runtime without lark, z3, pulp or torch.fx.
    forbidden = ("passes", "tessera_ir", "frontend", "codegen", "tessera", "lark", "z3", "pulp", "torch.fx")
    for path in python_files(ROOT / "runtime"):
        bad = {m for m in imported_modules(path) if m.split(".")[0] in forbidden or m.startswith("torch.fx")}
        assert not bad, f"{path.relative_to(ROOT)} imports {sorted(bad)}"


def test_the_ir_imports_nothing_of_ours() -> None:
    ours = ("passes", "frontend", "codegen", "runtime", "tessera")
    for path in python_files(ROOT / "tessera_ir"):
        bad = {m for m in imported_modules(path) if m.split(".")[0] in ours}
        assert not bad, f"{path.relative_to(ROOT)} imports {sorted(bad)}"


def test_the_support_layer_imports_nothing_of_ours_and_nothing_outside_the_standard_library() -> None:
    # It sits below the IR and beside the runtime, which a trainer embeds without the compiler.
    import sys

    for path in python_files(ROOT / "support"):
        outside = {
            m for m in imported_modules(path)
            if m.split(".")[0] != "support" and m.split(".")[0] not in sys.stdlib_module_names and m != "__future__"
        }
        assert not outside, f"{path.relative_to(ROOT)} imports {sorted(outside)}"


def test_nothing_of_ours_forks_or_loads_an_extension_except_through_the_support_layer() -> None:
    # One place each for forked helpers (which must die with their parent) and extension loading.
    for package in ("tessera_ir", "passes", "frontend", "codegen", "runtime", "tessera"):
        for path in python_files(ROOT / package):
            text = path.read_text()
            assert "os.fork(" not in text, f"{path.relative_to(ROOT)} forks; use support.processes"
            assert not re.search(r"environ[^\n]*_EXTENSION", text), (
                f"{path.relative_to(ROOT)} finds an extension build itself; use support.extensions"
            )
            assert "gc.set_threshold" not in text and "gc.freeze(" not in text, (
                f"{path.relative_to(ROOT)} tunes the collector; use support.collector"
            )
