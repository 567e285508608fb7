"""The compile cache: a re-run of an unchanged compile is served from disk, byte for byte; any
changed input misses; damaged or foreign entries are ignored with a warning; model.py files
and --no-cache never touch it; a full hit imports neither torch nor transformers."""

from __future__ import annotations

import functools
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

import tessera.api
import tessera.child_capture
from passes.costs.hardware import HARDWARE_DIR
from passes.manager import parse_pipeline
from tessera.cli import compile_main
from tessera.compile_cache import capture_key, pipeline_cacheable

ROOT = Path(__file__).resolve().parents[2]
TINY = str(ROOT / "examples" / "tiny_qwen3_next.py")
PIPELINE = "candidates,overlap-schedule,profile,partition,dbo-slots"
SETTINGS = ["--pp", "2", "--vpp", "2", "--ep", "4", "--microbatches", "8", "--seq-len", "512"]


def small_config(folder: Path, **changes: object) -> Path:
    """A four-layer Qwen3-Next config (three linear-attention layers, one softmax attention)."""
    config = {
        "model_type": "qwen3_next", "hidden_size": 256, "num_hidden_layers": 4, "full_attention_interval": 4,
        "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 64, "linear_num_key_heads": 4,
        "linear_num_value_heads": 4, "linear_key_head_dim": 32, "linear_value_head_dim": 32,
        "intermediate_size": 512, "moe_intermediate_size": 128, "shared_expert_intermediate_size": 128,
        "num_experts": 8, "num_experts_per_tok": 2, "vocab_size": 1024,
    }
    config.update(changes)
    path = folder / "config.json"
    path.write_text(json.dumps(config))
    return path


@pytest.fixture
def cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    folder = tmp_path / "cache"
    monkeypatch.setenv("TESSERA_CACHE_DIR", str(folder))
    return folder


@pytest.fixture
def counted(monkeypatch: pytest.MonkeyPatch) -> dict[str, int]:
    """How often capture and the pass pipeline really ran (captures in this process, where the
    counter sees them, not in a child)."""
    monkeypatch.setattr(tessera.child_capture, "worth_a_child", lambda: False)
    calls = {"capture": 0, "passes": 0}
    capture, run_passes = tessera.api.capture, tessera.api.run_passes

    def counting_capture(*args: object, **kwargs: object) -> object:
        calls["capture"] += 1
        return capture(*args, **kwargs)  # type: ignore[arg-type]

    def counting_passes(*args: object, **kwargs: object) -> object:
        calls["passes"] += 1
        return run_passes(*args, **kwargs)  # type: ignore[arg-type]

    monkeypatch.setattr(tessera.api, "capture", counting_capture)
    monkeypatch.setattr(tessera.api, "run_passes", counting_passes)
    return calls


def compile_to(out: Path, source: str | Path, *extra: str) -> dict[str, bytes]:
    out.mkdir()
    argv = [str(source), "-o", str(out / "plan.tir"), "--summary-json", str(out / "summary.json"),
            "--partition-json", str(out / "partition.json"), "--passes", PIPELINE, "--no-capacity", *SETTINGS, *extra]
    assert compile_main(argv) == 0
    return {p.name: p.read_bytes() for p in sorted(out.iterdir())}


def entries(cache: Path, kind: str) -> set[str]:
    return {p.name for p in (cache / kind).glob("*.tir")}


@pytest.mark.slow
def test_an_unchanged_compile_is_served_from_the_cache_byte_for_byte(
    tmp_path: Path, cache: Path, counted: dict[str, int]
) -> None:
    config = small_config(tmp_path)
    first = compile_to(tmp_path / "a", config)
    assert counted == {"capture": 1, "passes": 1}
    assert len(entries(cache, "captures")) == 1 and len(entries(cache, "plans")) == 1
    second = compile_to(tmp_path / "b", config)
    assert counted == {"capture": 1, "passes": 1}, "the warm compile captured or planned again"
    assert first == second
    uncached = compile_to(tmp_path / "c", config, "--no-cache")
    assert uncached == first
    # A new run-wide setting misses the plan but reuses the capture, and gives the same IR as without caches.
    cached = compile_to(tmp_path / "d", config, "--dbo-memory-budget", "0.05")
    assert counted == {"capture": 2, "passes": 3}
    assert len(entries(cache, "captures")) == 1 and len(entries(cache, "plans")) == 2
    assert cached == compile_to(tmp_path / "e", config, "--no-cache", "--dbo-memory-budget", "0.05")


@pytest.mark.slow
def test_every_changed_input_misses(tmp_path: Path, cache: Path, counted: dict[str, int]) -> None:
    config = small_config(tmp_path)
    compile_to(tmp_path / "base", config)
    plans = len(entries(cache, "plans"))
    hardware = json.loads((HARDWARE_DIR / "h100.json").read_text())
    hardware["peak_tflops"] = {k: v * 0.9 for k, v in hardware["peak_tflops"].items()}
    edited = tmp_path / "h100_slower.json"
    edited.write_text(json.dumps(hardware))
    changes: list[tuple[str, Path, list[str]]] = [
        ("one pass option", config, ["--passes", PIPELINE.replace("partition", "partition{time-limit=30}")]),
        ("one run-wide setting", config, ["--reserved-gib", "5"]),
        ("a parallel setting", config, ["--seq-len", "1024"]),
        ("one layer's kind (and so its cost)", config, ["--layer-kind", "1=attention"]),
        ("the hardware", config, ["--hardware", "h200"]),
        ("a field of a hardware file", config, ["--hardware", str(edited)]),
        ("the verifier", config, ["--no-verify"]),
    ]
    other = tmp_path / "other"
    other.mkdir()
    changes.append(("one number of the config", small_config(other, moe_intermediate_size=192), []))
    for k, (what, source, extra) in enumerate(changes):
        before = dict(counted)
        compile_to(tmp_path / f"run{k}", source, *extra)
        assert counted["passes"] == before["passes"] + 1, f"changing {what} did not miss the plan cache"
        assert len(entries(cache, "plans")) == plans + k + 1, what


@pytest.mark.slow
def test_a_changed_placement_setting_reuses_the_capture_and_plans_as_a_fresh_capture_would(
    tmp_path: Path, cache: Path, counted: dict[str, int], capsys: pytest.CaptureFixture[str]
) -> None:
    config = small_config(tmp_path)
    compile_to(tmp_path / "base", config)
    assert counted == {"capture": 1, "passes": 1}
    # Flags after the base settings (which give --pp, --vpp and --microbatches): changed values,
    # a setting given for the first time (--dp) and one given only before (none of them here).
    changes = [["--microbatches", "16"], ["--pp", "4", "--vpp", "1"], ["--dp", "4"], ["--no-distributed-optimizer"]]
    for k, extra in enumerate(changes):
        before = dict(counted)
        cached = compile_to(tmp_path / f"hit{k}", config, *extra)
        assert counted["capture"] == before["capture"], f"{extra} captured again"
        assert counted["passes"] == before["passes"] + 1, f"{extra} did not plan again"
        assert cached == compile_to(tmp_path / f"fresh{k}", config, "--no-cache", *extra), extra
    assert len(entries(cache, "captures")) == 1
    bare = [str(config), "-o", str(tmp_path / "bare.tir"), "--passes", PIPELINE, "--no-capacity", "--ep", "4",
            "--seq-len", "512"]
    captures = counted["capture"]
    assert compile_main(bare) == 0 and counted["capture"] == captures  # the source's suggestion, from the entry
    bare_fresh = [*bare[:2], str(tmp_path / "bare_fresh.tir"), *bare[3:], "--no-cache"]
    assert compile_main(bare_fresh) == 0
    assert (tmp_path / "bare.tir").read_bytes() == (tmp_path / "bare_fresh.tir").read_bytes()
    # A setting the cached capture cannot take is refused as capture refuses it, and nothing is written.
    capsys.readouterr()
    for k, flags in enumerate((["--pp", "2", "--vpp", "3"], ["--no-cache", "--pp", "2", "--vpp", "3"])):
        out = tmp_path / f"refused{k}.tir"
        assert compile_main([str(config), "-o", str(out), "--passes", PIPELINE, "--no-capacity", *SETTINGS, *flags]) == 1
        assert not out.exists()
    errors = capsys.readouterr().err.strip().splitlines()
    assert len(errors) == 2 and errors[0] == errors[1] and "6 virtual stages but the model has only 4" in errors[0]


def test_the_capture_entry_key_leaves_the_placement_settings_out(tmp_path: Path) -> None:
    config = str(small_config(tmp_path))
    blind = functools.partial(capture_key, placement_blind=True)
    assert blind(config, {"pp": 2, "ep": 4}, []) == blind(config, {"pp": 8, "ep": 4}, [])
    assert blind(config, {"pp": 2, "microbatches": 64, "dp": 2, "distributed_optimizer": False}, []) == blind(config, {}, [])
    assert blind(config, {"ep": 4}, []) != blind(config, {"ep": 8}, [])  # the layers' own settings stay in it
    assert capture_key(config, {"pp": 2}, []) != capture_key(config, {"pp": 8}, [])  # the plans' key keeps values


def test_only_complete_keys_are_cached(tmp_path: Path) -> None:
    assert capture_key(TINY, {}, []) is None  # a model.py may read anything: never cached
    config = small_config(tmp_path)
    key = capture_key(str(config), {"pp": 2}, [])
    assert key is not None and key != capture_key(str(config), {"pp": 4}, [])
    assert key == capture_key(str(tmp_path), {"pp": 2, "tp": None}, [])  # the folder holding config.json
    assert key != capture_key(str(config), {"pp": 2}, ["1=attention"])
    assert capture_key("hf:qwen3_next", {}, []) != capture_key("hf:qwen3_moe", {}, [])
    assert pipeline_cacheable(parse_pipeline(PIPELINE))
    assert not pipeline_cacheable(parse_pipeline("candidates,overlap-schedule,profile{mode=measured},partition"))
    assert not pipeline_cacheable(parse_pipeline("candidates,overlap-schedule{method=exact,solver=highs}"))
    assert pipeline_cacheable(parse_pipeline("candidates,overlap-schedule{method=exact}"))


@pytest.mark.slow
def test_a_model_file_and_no_cache_leave_the_cache_alone(tmp_path: Path, cache: Path) -> None:
    assert compile_main([TINY, "-o", str(tmp_path / "a.tir"), "--passes", "candidates", "--no-capacity"]) == 0
    assert not (cache / "captures").exists() and not (cache / "plans").exists()
    config = small_config(tmp_path)
    compile_to(tmp_path / "b", config, "--no-cache")
    assert not cache.exists()


@pytest.mark.slow
def test_damaged_and_foreign_entries_are_ignored_with_a_warning(
    tmp_path: Path, cache: Path, counted: dict[str, int], capsys: pytest.CaptureFixture[str]
) -> None:
    config = small_config(tmp_path)
    good = compile_to(tmp_path / "a", config)
    (plan,) = (cache / "plans").glob("*.tir")
    data = plan.read_bytes()
    (capture,) = (cache / "captures").glob("*.tir")
    damaged = data.replace(b"pair_schedule", b"pair_schedulf", 1)
    plan.write_bytes(damaged)
    capsys.readouterr()
    assert compile_to(tmp_path / "b", config) == good
    assert "does not match its checksum; ignoring it" in capsys.readouterr().err
    assert counted["passes"] == 2 and plan.read_bytes() != damaged  # planned again and rewritten
    plan.write_bytes(b"not a cache entry")
    assert compile_to(tmp_path / "c", config) == good
    assert "is damaged" in capsys.readouterr().err
    # An entry of another compile under this key (copied by hand) is foreign.
    compile_to(tmp_path / "d", config, "--seq-len", "1024")
    other = next(p for p in (cache / "plans").glob("*.tir") if p != plan)
    plan.write_bytes(other.read_bytes())
    assert compile_to(tmp_path / "e", config) == good
    assert "belongs to another key" in capsys.readouterr().err
    capture.write_bytes(capture.read_bytes()[:-10])
    plan.unlink()
    assert compile_to(tmp_path / "f", config) == good
    assert "does not match its checksum" in capsys.readouterr().err


@pytest.mark.slow
def test_a_full_hit_imports_neither_torch_nor_transformers(tmp_path: Path, cache: Path) -> None:
    config = small_config(tmp_path)
    compile_to(tmp_path / "a", config)
    probe = (
        "import sys\nfrom tessera.cli import compile_main\n"
        f"rc = compile_main({[str(config), '-o', str(tmp_path / 'b.tir'), '--passes', PIPELINE, '--report', *SETTINGS]!r})\n"
        "print(rc, sorted(m for m in ('torch', 'transformers') if m in sys.modules))\n"
    )
    done = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, timeout=300,
                          env=dict(os.environ, TESSERA_CACHE_DIR=str(cache)), cwd=ROOT)
    assert done.returncode == 0, done.stderr
    assert done.stdout.splitlines()[-1] == "0 []"
    assert (tmp_path / "b.tir").read_bytes() == (tmp_path / "a" / "plan.tir").read_bytes()


def every_artefact(out: Path, source: Path, *extra: str) -> list[str]:
    """A command line asking for every artefact a compile renders: bytecode, summary, partition,
    report, and the capacity report with its JSON and trace."""
    out.mkdir()
    return [str(source), "-o", str(out / "plan.tsb"), "--summary-json", str(out / "summary.json"),
            "--partition-json", str(out / "partition.json"), "--report", "--report-json", str(out / "report.json"),
            "--trace", str(out / "trace.json"), "--iterations", "2", "--passes", PIPELINE + ",pipeline", *SETTINGS,
            *extra]


def compile_all(out: Path, source: Path, *extra: str, capsys: pytest.CaptureFixture[str]) -> dict[str, bytes]:
    """Every artefact a compile renders, and what it printed."""
    argv = every_artefact(out, source, *extra)
    capsys.readouterr()
    assert compile_main(argv) == 0
    files = {p.name: p.read_bytes() for p in sorted(out.iterdir())}
    files["stdout"] = capsys.readouterr().out.encode()
    return files


@pytest.fixture
def simulations(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """One entry per capacity simulation that really ran."""
    import passes.simulation.capacity as capacity

    ran: list[int] = []
    real = capacity.plan_capacity

    def counting(*args: object, **kwargs: object) -> object:
        ran.append(1)
        return real(*args, **kwargs)  # type: ignore[arg-type]

    monkeypatch.setattr(capacity, "plan_capacity", counting)
    return ran


@pytest.mark.slow
def test_a_warm_compile_renders_nothing_again(
    tmp_path: Path, cache: Path, simulations: list[int], monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    config = small_config(tmp_path)
    cold = compile_all(tmp_path / "cold", config, capsys=capsys)
    assert len(simulations) == 1 and len(list((cache / "outputs").glob("*.bin"))) == 5
    uncached = compile_all(tmp_path / "uncached", config, "--no-cache", capsys=capsys)
    assert uncached == cold

    def refuse(*args: object, **kwargs: object) -> None:
        raise AssertionError("a warm compile parsed the cached plan")

    monkeypatch.setattr("tessera.compiling.parse_module", refuse)
    warm = compile_all(tmp_path / "warm", config, "--timing", capsys=capsys)
    assert warm == cold and len(simulations) == 2  # the --no-cache run simulated; the warm one did not
    # Outputs of a plan served from the cache whose artefacts are not (yet) cached are rendered
    # from the parsed plan and give the same bytes.
    monkeypatch.undo()
    for entry in (cache / "outputs").glob("*.bin"):
        entry.unlink()
    assert compile_all(tmp_path / "reparsed", config, capsys=capsys) == cold


@pytest.mark.slow
def test_an_artefact_misses_when_an_option_it_reads_changes(
    tmp_path: Path, cache: Path, simulations: list[int], capsys: pytest.CaptureFixture[str]
) -> None:
    config = small_config(tmp_path)
    base = compile_all(tmp_path / "base", config, capsys=capsys)
    trace = tmp_path / "routing.json"
    counts = {"num_experts": 8, "counts": [[[2, 1, 1, 0, 0, 1, 2, 1] for _ in range(4)] for _ in range(2)]}
    trace.write_text(json.dumps(counts))
    changes = [
        ("the iterations", ["--iterations", "3"]),
        ("the routing", ["--routing", "zipf"]),
        ("the routing seed", ["--routing", "zipf", "--routing-seed", "1"]),
        ("a routing trace", ["--routing", "trace", "--routing-trace", str(trace)]),
    ]
    for k, (what, extra) in enumerate(changes):
        before = len(simulations)
        out = compile_all(tmp_path / f"run{k}", config, *extra, capsys=capsys)
        assert len(simulations) == before + 1, f"changing {what} did not simulate again"
        assert out["summary.json"] == base["summary.json"] and out["plan.tsb"] == base["plan.tsb"]
    counts["counts"][0][0][0] = 3  # type: ignore[index]
    counts["counts"][0][0][1] = 0  # type: ignore[index]
    trace.write_text(json.dumps(counts))
    before = len(simulations)
    compile_all(tmp_path / "edited", config, "--routing", "trace", "--routing-trace", str(trace), capsys=capsys)
    assert len(simulations) == before + 1, "an edited routing trace was served from the cache"


@pytest.mark.slow
def test_a_damaged_artefact_is_rendered_again(
    tmp_path: Path, cache: Path, simulations: list[int], capsys: pytest.CaptureFixture[str]
) -> None:
    config = small_config(tmp_path)
    cold = compile_all(tmp_path / "cold", config, capsys=capsys)
    for entry in (cache / "outputs").glob("*.bin"):
        data = entry.read_bytes()
        entry.write_bytes(data[:-1] + bytes([data[-1] ^ 1]))
    out = tmp_path / "again"
    argv = every_artefact(out, config)
    capsys.readouterr()
    assert compile_main(argv) == 0
    printed = capsys.readouterr()
    assert printed.err.count("does not match its checksum; ignoring it") == 5
    assert printed.out.encode() == cold["stdout"] and len(simulations) == 2
    assert {p.name: p.read_bytes() for p in sorted(out.iterdir())} == {k: v for k, v in cold.items() if k != "stdout"}


def test_timing_says_what_rendering_each_artefact_cost_and_a_warm_compile_renders_none(
    tmp_path: Path, cache: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    config = small_config(tmp_path)

    def rendered(out: Path) -> list[str]:
        argv = every_artefact(out, config, "--timing")
        capsys.readouterr()
        assert compile_main(argv) == 0
        lines = capsys.readouterr().err.splitlines()
        start = next(k for k, line in enumerate(lines) if line.endswith("other outputs, reports, writing"))
        rows = [line.split(" s ", 1)[1].strip() for line in lines[start + 1 :] if " s " in line and "%)" not in line]
        return [row for row in rows if row.startswith("render ")]

    cold = rendered(tmp_path / "cold")
    assert {"render the capacity report (simulated iterations)", "render the report", "render the summary JSON"} <= set(cold)
    assert rendered(tmp_path / "warm") == []  # every artefact served from the compile cache
