"""A session in one process (world size 1): transformers' labels, batches it refuses, parameters under their names."""

from __future__ import annotations

import pytest
import torch
import torch.distributed as dist

from runtime.bytecode import encode
from runtime.local_reference import LocalReference
from runtime.model_check import UncheckedModelWarning
from runtime.session import IGNORE_INDEX, TrainingSession, expert_key, merge_shards, shift_labels

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
def plan():
    return encode(tiny_plan_image(pp=1, vpp=1, ep=1, microbatches=MBS, seq_len=SEQ))


def token_ids(step: int) -> torch.Tensor:
    return torch.randint(0, 256, (1, MBS, 1, SEQ), generator=torch.Generator().manual_seed(step))


def adamw(params):
    return torch.optim.AdamW(params, lr=3e-3, foreach=False)


def test_shift_labels_is_transformers_causal_shift():
    labels = torch.tensor([[5, 6, 7, -100], [1, 2, 3, 4]])
    assert shift_labels(labels).tolist() == [[6, 7, -100, -100], [2, 3, 4, -100]]
    assert IGNORE_INDEX == -100


def test_hf_labels_are_shifted_inside_and_minus_100_is_ignored(world_of_one, plan):
    session = TrainingSession.start(plan, build_model(), health=False)
    opt = adamw(session.parameters())
    ref = LocalReference(build_model, ep=1, microbatches=MBS, optimizer=adamw)
    for step in range(2):
        ids = token_ids(step)
        labels = ids.clone()
        labels[0, 1, 0, :3] = IGNORE_INDEX  # no loss on the first predictions of micro-batch 1
        result = session.step(ids[0], labels[0])
        expected = ref.step(ids, shift_labels(labels))
        assert torch.equal(torch.stack(result.loss_tensors[0]), torch.stack(expected[0]))
        # what transformers' ForCausalLMLoss reports for each micro-batch: the mean over non-ignored tokens
        model = ref.replicas[0]
        for mb in range(MBS):
            with torch.no_grad():
                logits = model(ids[0, mb])
            want = torch.nn.functional.cross_entropy(
                logits[0, :-1].reshape(-1, logits.shape[-1]), labels[0, mb, 0, 1:], ignore_index=-100)
            assert torch.allclose(result.loss_tensors[0][mb], want, rtol=1e-6, atol=0)
        opt.step()
        opt.zero_grad(set_to_none=True)
        ref.optimizer_step()


def test_padding_and_packed_positions_are_refused(world_of_one, plan):
    with pytest.warns(UncheckedModelWarning, match=r"no plan signature given: the model was checked against the plan's "
                                                   r"layers, mixer kinds, .* not its experts, top_k"):
        session = TrainingSession.start(plan, build_model(), health=False)
    ids = token_ids(0)[0]
    mask = torch.ones_like(ids)
    mask[0, 0, -2:] = 0
    with pytest.raises(ValueError, match=r"padding \(attention_mask has zeros\): padded batches are not supported yet"):
        session.step(ids, ids, attention_mask=mask)
    packed = torch.cat([torch.arange(4), torch.arange(SEQ - 4)]).expand_as(ids)
    with pytest.raises(ValueError, match=r"position_ids other than 0..seq-1 \(packed sequences\) are not supported yet"):
        session.step(ids, ids, position_ids=packed)
    with pytest.raises(ValueError, match="input_ids must be integer token ids"):
        session.step(ids.float(), ids)
    # a mask of ones and positions 0..seq-1 are what a full causal batch has: accepted
    result = session.step(ids, ids, attention_mask=torch.ones_like(ids), position_ids=torch.arange(SEQ).expand_as(ids))
    assert result.loss is not None


def test_the_state_dict_keeps_the_models_names_and_the_full_one_loads_into_a_fresh_model(world_of_one, plan):
    def with_buffers(m):  # a persistent buffer travels with the parameters, a non-persistent one does not
        m.layers[0].moe.register_buffer("bias_correction", torch.arange(4.0))
        m.layers[0].moe.register_buffer("scratch", torch.zeros(2), persistent=False)
        return m

    model = with_buffers(build_model())
    session = TrainingSession.start(plan, model, health=False)
    opt = adamw(session.parameters())
    ids = token_ids(0)[0]
    session.step(ids, ids)
    opt.step()
    mine = session.state_dict()
    names = dict(model.named_parameters())
    fused = "layers.0.moe.experts.gate_up_proj"
    assert fused not in mine and torch.equal(mine["layers.0.moe.experts.3.gate_up_proj"], names[fused][3])
    assert set(mine) - {k for k in mine if ".experts." in k} == {k for k in names if ".experts." not in k} | {
        "layers.0.moe.bias_correction"}
    full = session.full_state_dict()
    assert full is not None and set(full) == set(model.state_dict())
    fresh = with_buffers(build_model())
    fresh.layers[0].moe.bias_correction.zero_()
    fresh.load_state_dict(full)
    assert torch.equal(fresh.layers[0].moe.bias_correction, torch.arange(4.0))
    probe = token_ids(9)[0, 0]
    with torch.no_grad():
        assert torch.equal(fresh(probe), model(probe))
        assert not torch.equal(build_model()(probe), model(probe))  # it did train


def test_merge_shards_stacks_experts_from_every_rank_and_names_a_gap():
    rows = [torch.full((2, 3), float(e)) for e in range(4)]
    shards = [{"w": torch.ones(1), expert_key("l.experts.up", e): rows[e]} for e in (2, 3)]
    shards += [{"w": torch.ones(1), expert_key("l.experts.up", e): rows[e]} for e in (0, 1)]
    merged = merge_shards(shards)
    assert list(merged) == ["l.experts.up", "w"] and torch.equal(merged["l.experts.up"], torch.stack(rows))
    with pytest.raises(RuntimeError, match=r"the shards hold experts \[0, 2\] of 'l.experts.up', not 0..1"):
        merge_shards([{expert_key("l.experts.up", 0): rows[0], expert_key("l.experts.up", 2): rows[2]}])
