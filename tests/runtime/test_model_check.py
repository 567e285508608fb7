"""The model given to ``TrainingSession.start`` checked against what its plan records, field by field."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch.distributed as dist
from hf_training import build, compile_plan, tiny_config

from runtime import load_plan
from runtime.bindings import MixtralBinding, Qwen3MoeBinding, TinyMoEBinding
from runtime.model_check import UNRECORDED_FIELDS, ModelMismatch, check_model_against_plan, describe_plan
from runtime.session import TrainingSession

from tiny_plan import tiny_example

pytest.importorskip("transformers")


@pytest.fixture(scope="module")
def qwen3_plan() -> bytes:
    return compile_plan(tiny_config("qwen3_moe"))[0]


@pytest.fixture(scope="module")
def qwen3_programs(qwen3_plan) -> list:
    return [load_plan(qwen3_plan, rank=r) for r in range(2)]


def test_the_model_the_plan_was_compiled_for_passes_and_what_was_not_checked_is_named(qwen3_programs):
    model = build(tiny_config("qwen3_moe"))
    check = check_model_against_plan(Qwen3MoeBinding, model, qwen3_programs)
    assert check.checked == ("model", "layers", "mixer kinds", "ffn kinds", "shared expert")
    assert check.unchecked == UNRECORDED_FIELDS == ("experts", "top_k", "hidden_size", "vocab_size")
    assert check.unchecked_note() == (
        "no plan signature given: the model was checked against the plan's model, layers, mixer kinds, ffn kinds, "
        "shared expert, not its experts, top_k, hidden_size, vocab_size, which the plan does not record; pass "
        "signature= (codegen.signature.plan_signature of the model) to check them too")
    signed = check_model_against_plan(Qwen3MoeBinding, model, qwen3_programs, signature_checked=True)
    assert signed.unchecked == () and signed.unchecked_note() is None


def test_the_plan_describes_its_decoder_layers(qwen3_programs):
    described = describe_plan(qwen3_programs)
    assert described.model == "qwen3_moe"
    assert [(layer.name, layer.mixer, layer.ffn) for layer in described.layers] == [
        (f"l{i}", "attention", "moe") for i in range(4)
    ]


@pytest.mark.parametrize(("binding", "model", "field", "message"), [
    (Qwen3MoeBinding, lambda: build(tiny_config("qwen3_moe", num_hidden_layers=6)), "layers",
     "the plan runs 4 decoder layers but the Qwen3MoeForCausalLM has 6"),
    (Qwen3MoeBinding, lambda: build(tiny_config("qwen3_moe", num_hidden_layers=2)), "layers",
     "the plan runs 4 decoder layers but the Qwen3MoeForCausalLM has 2"),
    (MixtralBinding, lambda: build(tiny_config("mixtral")), "model",
     "the plan was compiled for a 'qwen3_moe' model, this MixtralForCausalLM is 'mixtral'"),
    (Qwen3MoeBinding, lambda: build(tiny_config("qwen3_moe", use_sliding_window=True, sliding_window=8)), "layer l0 mixer",
     "the plan runs attention there, the Qwen3MoeForCausalLM has sliding_attention"),
    (TinyMoEBinding, lambda: tiny_example().TinyQwen3Next(tiny_example().TinyConfig(num_layers=4)), "layer l0 mixer",
     "the plan runs attention there, the TinyQwen3Next has linear_attention"),
    (TinyMoEBinding,
     lambda: tiny_example().TinyQwen3Next(tiny_example().TinyConfig(num_layers=4, full_attention_interval=1)),
     "layer l0 ffn", "the plan runs a routed MoE without a shared expert there, the TinyQwen3Next has a routed MoE with a shared expert"),
])
def test_a_model_other_than_the_plans_is_refused_naming_the_field(qwen3_programs, binding, model, field, message):
    with pytest.raises(ModelMismatch, match=f"^{field}: {message}; compile the plan for this model$") as err:
        check_model_against_plan(binding, model(), qwen3_programs)
    assert err.value.field == field


def test_a_plan_with_a_dense_layer_refuses_a_model_whose_layer_is_sparse(qwen3_programs):
    dense = [SimpleNamespace(plan=p.plan, tasks=[t for t in p.tasks if not (
        t.layer == "l1" and t.kind.rpartition(".")[0] in ("router", "dispatch", "expert_gemm", "combine"))]) for p in qwen3_programs]
    with pytest.raises(ModelMismatch, match="^layer l1 ffn: the plan runs a dense MLP there, the Qwen3MoeForCausalLM has "
                                            "a routed MoE without a shared expert"):
        check_model_against_plan(Qwen3MoeBinding, build(tiny_config("qwen3_moe")), dense)


def test_start_refuses_the_mismatch_before_any_process_group(tmp_path, qwen3_plan):
    # One process, a plan for four: a check after the groups would fail on the world size instead.
    dist.init_process_group("gloo", store=dist.FileStore(str(tmp_path / "store"), 1), rank=0, world_size=1)
    try:
        with pytest.raises(ModelMismatch, match="^layers: the plan runs 4 decoder layers but the Qwen3MoeForCausalLM has 6"):
            TrainingSession.start(qwen3_plan, build(tiny_config("qwen3_moe", num_hidden_layers=6)), health=False)
    finally:
        dist.destroy_process_group()
