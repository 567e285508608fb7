"""The executor in one process (world size 1): bitwise against the reference, exactly-once weight
gradients, plans that break the model's dependencies, and plans compiled for something else."""

from __future__ import annotations

import hashlib
from dataclasses import replace

import pytest
import torch
import torch.distributed as dist

import runtime
from runtime.bytecode import Instr, Op, encode
from runtime.errors import PlanError
from runtime.executor import ExecutionError
from runtime.local_reference import LocalReference
from runtime.session import TrainingSession, load_programs

from tiny_plan import tiny_example, tiny_plan_image

build_model = tiny_example().build_model

SEQ, MBS = 8, 2


@pytest.fixture(scope="module")
def world_of_one(tmp_path_factory):
    torch.use_deterministic_algorithms(True)
    store = dist.FileStore(str(tmp_path_factory.mktemp("store") / "store"), 1)
    dist.init_process_group("gloo", store=store, rank=0, world_size=1)
    yield
    dist.destroy_process_group()
    torch.use_deterministic_algorithms(False)


@pytest.fixture(scope="module")
def one_rank_plan():
    return tiny_plan_image(pp=1, vpp=1, ep=1, microbatches=MBS, seq_len=SEQ)


def batch(step: int) -> tuple[torch.Tensor, torch.Tensor]:
    ids = torch.randint(0, 256, (1, MBS, 1, SEQ + 1), generator=torch.Generator().manual_seed(step))
    return ids[..., :-1], ids[..., 1:]


def adamw(params):
    return torch.optim.AdamW(params, lr=3e-3, foreach=False)


def test_one_rank_trains_bitwise_like_the_reference(world_of_one, one_rank_plan):
    session = TrainingSession.start(encode(one_rank_plan), build_model(), health=False)
    opt = adamw(session.parameters())
    ref = LocalReference(build_model, ep=1, microbatches=MBS, optimizer=adamw)
    for step in range(2):
        ids, labels = batch(step)
        result = session.step(ids[0], labels[0], labels_shifted=True)
        expected = ref.step(ids, labels)
        assert torch.equal(torch.stack(result.loss_tensors[0]), torch.stack(expected[0]))
        ref_grads = dict(ref.replicas[0].named_parameters())
        for key, p in session.executor.params.items():
            assert torch.equal(p.grad.view(torch.int32), ref_grads[key].grad.view(torch.int32)), key
        # every weight gradient ran exactly once: offered to DBO, then filled or fallen back
        ran = session.executor.wgrad_ran
        movable = sum(t.movable for t in one_rank_plan.tasks)
        assert len(ran) == movable * MBS and set(ran.values()) == {1}
        counters = result.iteration.counters
        # offered to the DBO, then deferred or refused (deadline-aware admission: no predicted slot
        # before its deadline can take it; or no memory), every deferred one placed or fallen back
        assert counters["offered"] == movable * MBS
        assert counters["deferred"] + counters["refused_deadline"] + counters["refused_memory"] == movable * MBS
        assert counters["placed"] + counters["fallbacks"] == counters["deferred"]
        # every weight operation of the tiny model has a dedicated split; none took the general path
        assert counters["split_dedicated_ops"] > 0 and counters["split_general_ops"] == 0
        # the training thread's CPU time, per phase: every phase ran, and the phases add up to the total
        cpu = result.iteration.cpu_ns
        assert all(cpu[phase] > 0 for phase in ("fwd", "dgrad", "wgrad"))
        assert cpu["fwd"] + cpu["dgrad"] + cpu["wgrad"] + cpu["other"] == cpu["total"]
        opt.step()
        opt.zero_grad(set_to_none=True)
        ref.optimizer_step()


def test_a_program_that_breaks_a_dependency_is_an_error_naming_it(world_of_one, one_rank_plan):
    index = {t.name: i for i, t in enumerate(one_rank_plan.tasks)}
    code = [Instr(Op.RUN, a=index["embed.embedding.fwd"]), Instr(Op.RUN, a=index["l0.linear_attention.dgrad"]), Instr(Op.END)]
    session = TrainingSession.start(encode(replace(one_rank_plan, programs={0: code})), build_model(), health=False)
    ids, labels = batch(0)
    with pytest.raises(ExecutionError, match=r"l0.mixer.dgrad for micro-batch 0 runs before its forward"):
        session.step(ids[0], labels[0], labels_shifted=True)


def test_a_wgrad_before_its_dgrad_is_an_error(world_of_one, one_rank_plan):
    index = {t.name: i for i, t in enumerate(one_rank_plan.tasks)}
    code = [Instr(Op.RUN, a=index["l0.router.wgrad"]), Instr(Op.END)]
    session = TrainingSession.start(encode(replace(one_rank_plan, programs={0: code})), build_model(), health=False)
    ids, labels = batch(0)
    with pytest.raises(ExecutionError, match=r"l0.router.wgrad for micro-batch 0 runs before l0.router.dgrad"):
        session.step(ids[0], labels[0], labels_shifted=True)


def test_plans_for_other_settings_or_another_model_are_refused_naming_the_mismatch(one_rank_plan):
    data = encode(one_rank_plan)
    with pytest.raises(PlanError, match=r"compiled for other settings: seq_len=8 \(this run: 16\)"):
        load_programs(data, None, {"model": "tiny_qwen3_next", "seq_len": 16})
    other = encode(replace(one_rank_plan, plan=replace(one_rank_plan.plan, model="another_model", microbatches=4)))
    with pytest.raises(PlanError, match=r"compiled for another model: model=another_model \(this run: tiny_qwen3_next\), "
                                        r"microbatches=4 \(this run: 2\)"):
        load_programs(other, None, {"model": "tiny_qwen3_next", "microbatches": 2})
    with pytest.raises(PlanError, match="its parallel settings match this run, but the model's layers") as err:
        load_programs(data, hashlib.sha256(b"a different model").digest(), {"model": "tiny_qwen3_next", "seq_len": SEQ})
    assert err.value.reason == "signature"
    assert len(load_programs(data, one_rank_plan.signature, {"seq_len": SEQ})) == 1
    assert runtime.load_plan(data, rank=0, signature=one_rank_plan.signature).plan.seq_len == SEQ
