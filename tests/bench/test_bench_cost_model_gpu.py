"""The GPU cost-model bench's CPU side: what it asks the GPU to run, and how it reports a measurement.

The measurement itself needs a GPU; everything that decides what is executed and what is compared
runs here: the parts a task is executed as, the issue order of a pair, the planner's prediction
and its re-pricing on another hardware file, and the report's arithmetic on a measurement.
"""

from __future__ import annotations

import gzip
import json
import math
from functools import cache

import pytest

from bench import bench_cost_model_gpu as bench


def gemm_flops(part: dict) -> int:
    return 2 * part["batch"] * part["m"] * part["k"] * part["n"]


@cache
def prepared() -> dict:
    """One small setting of Qwen3-Next (1K tokens, EP8) with three sampled pairs and the
    layer-kind combinations, prepared as the bench prepares it."""
    config = bench.model_config("hf:qwen3_next")
    setting = bench.prepare_setting("hf:qwen3_next", 8, 1024, 3, "h200", 0, config, 8, 2)
    return {"model_config": config, "settings": [setting]}


@pytest.mark.slow
def test_the_combinations_and_a_sample_are_prepared_with_the_planners_costs():
    setting = prepared()["settings"][0]
    labels = [p["label"] for p in setting["pairs"] if p["combination"]]
    assert labels == ["D|D", "D|A", "A|D", "A|A", "DD|DA", "DA|DD"]
    assert sum(not p["combination"] for p in setting["pairs"]) == 3
    for pair in setting["pairs"]:
        durations = {t["name"]: t["analytic_us"] for t in pair["tasks"]}
        # The stored prediction is the contention model's re-timing of the stored schedule.
        assert bench.retimed(pair, durations, setting["contention"], True) == pytest.approx(pair["predicted_us"], rel=1e-12)
        assert bench.retimed(pair, durations, setting["contention"], False) == pytest.approx(pair["naive_us"], rel=1e-12)
        assert pair["serial_us"] == pytest.approx(sum(durations.values()))
        assert pair["naive_us"] <= pair["predicted_us"] <= pair["serial_us"] + 1e-6


@pytest.mark.slow
def test_every_compute_task_runs_its_flops_as_the_kernels_it_is_priced_as():
    config = prepared()["model_config"]
    for pair in prepared()["settings"][0]["pairs"]:
        for t in pair["tasks"]:
            if t["stream"] == "comm":
                assert [p["kind"] for p in t["parts"]] == ["comm"] and t["parts"][0]["us"] == t["analytic_us"]
                continue
            kinds = [p["kind"] for p in t["parts"]]
            core = t["ir"]["attrs"].get("core_flops", 0)
            phase = t["kind"].rsplit(".", 1)[1]
            if t["op"] == "attention" and phase != "wgrad":
                assert kinds == ["gemm", "sdpa"]
                assert t["parts"][1]["pass"] == ("fwd" if phase == "fwd" else "bwd")
                assert (t["parts"][1]["h"], t["parts"][1]["d"]) == (config["num_attention_heads"], config["head_dim"])
                # The SDPA run has the FLOPs the cost model counts for the core.
                assert bench.core_flops_of(t["parts"][1]) == pytest.approx(core, rel=1e-9)
            elif t["op"] == "linear_attention" and phase != "wgrad":
                assert kinds == ["gemm", "gdn"]
            elif t["op"] == "expert_gemm":
                (part,) = t["parts"]
                # The local experts, each with the rows it receives.
                assert part["batch"] > 1 and t["ir"]["attrs"]["rows_per_expert"] in (part["m"], part["k"])
            gemm = sum(gemm_flops(p) for p in t["parts"] if p["kind"] == "gemm")
            if gemm:
                # Alignment to multiples of 8 moves the GEMM's FLOPs by well under 1%.
                assert gemm == pytest.approx(t["ir"]["flops"] - core, rel=0.01)


def test_gemm_parts_keep_the_token_count_and_turn_for_each_pass():
    from tessera_ir.kinds import Phase, Resource, TaskOp
    from tessera_ir.model import Task

    def task(phase: Phase, op: TaskOp = TaskOp.ATTENTION, **attrs: int) -> Task:
        return Task(f"l0.{op.value}.{phase.value}", op, phase, Resource.COMPUTE, shapes=[[1, 4096, 2048], [1, 4096, 2048]],
                    attrs=dict(attrs))

    flops = 2 * 4096 * 2048 * 13312
    assert bench.gemm_part(task(Phase.FWD), flops) == {"kind": "gemm", "batch": 1, "m": 4096, "k": 2048, "n": 13312}
    assert bench.gemm_part(task(Phase.DGRAD), flops) == {"kind": "gemm", "batch": 1, "m": 4096, "k": 13312, "n": 2048}
    assert bench.gemm_part(task(Phase.WGRAD), flops) == {"kind": "gemm", "batch": 1, "m": 2048, "k": 4096, "n": 13312}
    experts = Task("l0.expert_gemm.fwd", TaskOp.EXPERT_GEMM, Phase.FWD, Resource.COMPUTE, shapes=[[40960, 2048], [40960, 2048]],
                   attrs={"rows_per_expert": 640})
    part = bench.gemm_part(experts, 2 * 40960 * 2048 * 1536)
    assert part == {"kind": "gemm", "batch": 64, "m": 640, "k": 2048, "n": 1536}


def test_the_issue_order_respects_streams_and_dependencies():
    tasks = [
        {"name": "c0", "stream": "compute", "order": 0, "deps": []},
        {"name": "a0", "stream": "comm", "order": 0, "deps": ["c0"]},
        {"name": "c1", "stream": "compute", "order": 1, "deps": ["a0"]},
        {"name": "a1", "stream": "comm", "order": 1, "deps": []},
    ]
    order = [t["name"] for t in bench._issue_order(tasks)]
    position = {name: i for i, name in enumerate(order)}
    assert sorted(order) == ["a0", "a1", "c0", "c1"]
    assert position["c0"] < position["a0"] < position["c1"] and position["a0"] < position["a1"]
    # A stream order that waits on a later task of the other stream cannot be issued.
    with pytest.raises(ValueError, match="deadlock"):
        bench._issue_order([
            {"name": "c0", "stream": "compute", "order": 0, "deps": ["a1"]},
            {"name": "a0", "stream": "comm", "order": 0, "deps": ["c0"]},
            {"name": "a1", "stream": "comm", "order": 1, "deps": []},
        ])


def test_a_task_key_names_what_runs_not_the_task():
    a = {"name": "l0.router.fwd", "stream": "compute", "parts": [{"kind": "gemm", "batch": 1, "m": 8, "k": 8, "n": 8}]}
    b = dict(a, name="l7.router.fwd")
    assert bench.task_key(a) == bench.task_key(b)
    assert bench.task_key(a) != bench.task_key(dict(a, stream="comm"))


@pytest.mark.slow
def test_repricing_on_the_preparing_file_gives_the_prepared_costs():
    plan = json.loads(json.dumps(prepared()))
    before = [x for p in plan["settings"][0]["pairs"] for x in (p["predicted_us"], p["naive_us"], p["serial_us"])]
    plan.update(peak_tflops={}, hbm_gbps=0.0)
    bench.repriced(plan, "h200")
    after = [x for p in plan["settings"][0]["pairs"] for x in (p["predicted_us"], p["naive_us"], p["serial_us"])]
    assert after == pytest.approx(before, rel=1e-12)
    # Another file prices the same schedules differently (h100: less memory bandwidth, other efficiencies).
    bench.repriced(plan, "h100")
    assert [p["serial_us"] for p in plan["settings"][0]["pairs"]] != pytest.approx(before[2::3], rel=1e-3)


@pytest.mark.slow
def test_the_report_compares_predictions_with_a_measurement(tmp_path, capsys):
    plan = json.loads(json.dumps(prepared()))
    plan.update(hardware="h200", peak_tflops={"bf16": 989.0}, hbm_gbps=4800.0)
    setting = plan["settings"][0]
    # A made-up measurement: every pair 25% longer than predicted, every task alone as predicted.
    measured = {
        "device": "test", "torch": "-", "cuda": "-", "stages": {
            "tasks": {bench.task_key(t): {"us": t["analytic_us"]} for p in setting["pairs"] for t in p["tasks"]},
            f"pairs/{setting['setting']}": [
                {"pair": p["pair"], "samples_us": [1.25 * p["predicted_us"]] * 3, "host_us": 0.0, "task_us": {}}
                for p in setting["pairs"]
            ],
        },
    }
    plan_path, measured_path, out = tmp_path / "plan.json.gz", tmp_path / "measured.json", tmp_path / "report.json"
    plan_path.write_bytes(gzip.compress(json.dumps(plan).encode()))
    measured_path.write_text(json.dumps(measured))
    args = bench.argparse.Namespace(plan=str(plan_path), measured=str(measured_path), hardware=None, out=str(out), no_save=False)
    assert bench.cmd_report(args) == 0
    report = json.loads(out.read_text())
    summary = report["summary"]["all"]
    assert summary["pairs"] == len(setting["pairs"])
    assert summary["error"]["mean"] == pytest.approx(0.2) and summary["error"]["bias"] == pytest.approx(-0.2)
    # Re-timed on the lone tasks (here the analytic durations), the same 20% short.
    assert summary["lone_contention_error"]["mean"] == pytest.approx(0.2)
    assert all(math.isclose(r["error"], -0.2) for r in report["rows"])
    assert "not met" in capsys.readouterr().out


class OneOutOfMemoryGpu:
    """A stand-in for the bench's GPU on which the tasks ``fails`` names run out of memory while
    earlier pairs' buffers are kept (as three 32K-token pairs did on an H200), or ``always``."""

    def __init__(self, fails: set[str], always: bool = False) -> None:
        import types

        import torch

        self.fails = fails
        self.always = always
        self.kept = 0
        self.forgotten = 0
        self.torch = types.SimpleNamespace(
            bfloat16="bf16",
            cuda=types.SimpleNamespace(
                OutOfMemoryError=torch.cuda.OutOfMemoryError,
                memory_allocated=lambda: 0,
                get_device_properties=lambda _: types.SimpleNamespace(total_memory=1 << 30),
            ),
        )

    def make_task(self, task: dict, dtype: str) -> object:
        if task["name"] in self.fails and (self.kept or self.always):
            raise self.torch.cuda.OutOfMemoryError("CUDA out of memory")
        self.kept += 1
        return object()

    def forget_parts(self) -> None:
        self.kept = 0
        self.forgotten += 1

    def time_pair(self, tasks: list, calls: dict, repeats: int, warmup: int) -> tuple:
        return [10.0] * repeats, {t["name"]: [5.0] for t in tasks}, 1.0


def test_a_pair_that_runs_out_of_memory_beside_kept_buffers_runs_again_on_an_emptied_gpu():
    setting = {"setting": "s", "pairs": [{"pair": p, "tasks": [{"name": t}]} for p, t in (("pair.a", "a"), ("pair.b", "b"))]}
    gpu = OneOutOfMemoryGpu({"b"})
    rows = bench.measure_pairs(gpu, setting, 3, math.inf, lambda line: None)
    assert [r["pair"] for r in rows] == ["pair.a", "pair.b"]
    assert gpu.forgotten == 2  # before the retry, and at the end of the setting

    lines: list[str] = []
    gpu = OneOutOfMemoryGpu({"a", "b"}, always=True)  # out of memory even on an emptied GPU: failed, the rest goes on
    rows = bench.measure_pairs(gpu, setting, 3, math.inf, lines.append)
    assert rows == [] and sum("failed: OutOfMemoryError" in line for line in lines) == 2
