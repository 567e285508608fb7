"""Stochastic routing: seeded, consistent between per-rank loads and per-expert counts, and skewed as asked."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from passes.simulation.routing import RoutingError, RoutingModel, RoutingSpec
from runtime.dbo import load_imbalance


def _model(spec: RoutingSpec, experts: int = 64, ep: int = 8, layers: int = 6, microbatches: int = 5) -> RoutingModel:
    return RoutingModel(spec, num_experts=experts, top_k=4, ep=ep, tokens_per_rank=1024,
                        moe_layers=list(range(1, layers)), decoder_layers=layers, microbatches=microbatches)


def test_draws_are_seeded_and_independent_of_call_order() -> None:
    a, b = _model(RoutingSpec("zipf", seed=3)), _model(RoutingSpec("zipf", seed=3))
    b.imbalance(5)
    assert np.array_equal(a.imbalance(2), b.imbalance(2))
    assert not np.array_equal(a.imbalance(2), a.imbalance(3))
    assert not np.array_equal(a.imbalance(2), _model(RoutingSpec("zipf", seed=4)).imbalance(2))


def test_layers_without_experts_are_balanced_and_loads_sum_to_the_slots() -> None:
    model = _model(RoutingSpec("balanced"))
    imbalance = model.imbalance(0)
    assert imbalance.shape == (6, 5)
    assert np.all(imbalance[0] == 1.0)
    assert np.all(imbalance[1:] >= 1.0)
    assert np.all(model.rank_loads(0).sum(axis=2) == 8 * 1024 * 4)


def test_expert_counts_agree_with_the_rank_loads_the_simulator_used() -> None:
    model = _model(RoutingSpec("zipf", zipf_s=0.7, seed=1))
    imbalance = model.imbalance(4)
    loads = model.rank_loads(4)
    for layer in range(1, 6):
        for mb in range(5):
            counts = model.expert_counts(4, layer, mb)
            assert counts.shape == (64,)
            assert np.array_equal(counts.reshape(8, 8).sum(axis=1), loads[layer - 1, mb])
            assert load_imbalance(counts.tolist(), 8) == pytest.approx(imbalance[layer, mb])


def test_skew_grows_with_the_zipf_exponent_and_balanced_is_nearly_even() -> None:
    means = [_model(RoutingSpec("zipf", zipf_s=s) if s else RoutingSpec("balanced")).imbalance(0)[1:].mean() for s in (0, 0.5, 1.0)]
    assert means[0] < 1.1 < means[1] < means[2]


def test_drift_moves_the_popularity_between_iterations() -> None:
    model = _model(RoutingSpec("drift", zipf_s=0.5, drift=0.3))
    p0, p1, p5 = (model.expert_probabilities(i) for i in (0, 1, 5))
    assert np.allclose(p0.sum(axis=1), 1.0)
    assert np.abs(p1 - p0).sum() < np.abs(p5 - p0).sum()
    assert np.array_equal(model.expert_probabilities(1), p1)  # going back replays the same walk


def test_trace_file_drives_the_popularity(tmp_path: Path) -> None:
    counts = [[[100] * 7 + [300] + [0] * 56 for _ in range(5)], [[10] * 64 for _ in range(5)]]
    path = tmp_path / "trace.json"
    path.write_text(json.dumps({"num_experts": 64, "counts": counts}))
    model = _model(RoutingSpec("trace", trace=str(path)))
    p = model.expert_probabilities(0)
    assert p[0, 7] == pytest.approx(0.3)
    assert np.allclose(model.expert_probabilities(3), model.expert_probabilities(1))  # wraps around
    # All tokens on the first rank's experts: that rank holds everything, 8x the mean.
    assert model.imbalance(0)[1:].min() == pytest.approx(8.0)


@pytest.mark.parametrize(
    "content,message",
    [
        ("{", "invalid JSON"),
        ('{"num_experts": 32, "counts": []}', "32 experts, the model 64"),
        ('{"num_experts": 64, "counts": [[[1, 2]]]}', "expected \\[iterations, 5, 64\\]"),
        ('{"num_experts": 64}', "'num_experts' and 'counts'"),
    ],
)
def test_bad_traces_are_refused_with_a_reason(tmp_path: Path, content: str, message: str) -> None:
    path = tmp_path / "t.json"
    path.write_text(content)
    with pytest.raises(RoutingError, match=message):
        _model(RoutingSpec("trace", trace=str(path)))


def test_bad_specs_are_refused() -> None:
    with pytest.raises(RoutingError, match="unknown routing"):
        RoutingSpec("gauss")  # type: ignore[arg-type]
    with pytest.raises(RoutingError, match="needs a trace file"):
        RoutingSpec("trace")
    with pytest.raises(RoutingError, match="split evenly"):
        _model(RoutingSpec(), experts=60)
    with pytest.raises(RoutingError, match="does not exist"):
        _model(RoutingSpec("trace", trace="/nonexistent/trace.json"))
