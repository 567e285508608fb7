"""What a virtual stage holds: its layers for a decoder range, and the serially balanced partition.

A stage holding decoder range ``(first, last)`` runs those decoder layers, plus the embedding
when it is the first stage and the LM head (with the loss) when it is the last.
"""

from __future__ import annotations

from collections.abc import Callable

from passes.partitioning.ranges import PartitionError, Range, balanced_partition
from tessera_ir.kinds import LayerRole
from tessera_ir.model import Layer, Module, Task


def stage_layers(module: Module, stage: int, stages: int, rng: Range) -> list[Layer]:
    """The layers a stage holding decoder range ``rng`` runs: + embedding on stage 0, + head on the last."""
    decoder = module.decoder_layers()
    layers: list[Layer] = []
    if stage == 0:
        layers += [layer for layer in module.layers if layer.role is LayerRole.EMBEDDING]
    layers += decoder[rng[0] : rng[1] + 1]
    if stage == stages - 1:
        layers += [layer for layer in module.layers if layer.role is LayerRole.HEAD]
    return layers


def check_decoder_order(module: Module) -> None:
    """Refuse modules whose decoder layers are not numbered 0..N-1 in module order (ranges index them)."""
    for i, layer in enumerate(module.decoder_layers()):
        if layer.index != i:
            raise PartitionError(
                f"decoder layer '{layer.name}' has index {layer.index} but is decoder layer number {i} in module "
                f"order; the partition passes need decoder layers numbered 0..N-1 in execution order"
            )


def serially_balanced(
    module: Module,
    duration: Callable[[Task], float],
    stages: int,
    embed_weight: float = 1.0,
    head_weight: float = 1.0,
) -> list[Range]:
    """The serially balanced partition into ``stages`` ranges.

    A layer's serial cost is the sum of its tasks' isolated durations, forward and backward,
    as if nothing overlapped; the embedding's cost counts on the first stage and the head's
    on the last, scaled by ``embed_weight`` and ``head_weight``.
    """
    cost = {layer.name: sum(duration(t) for t in layer.tasks) for layer in module.layers}
    embed = embed_weight * sum(cost[layer.name] for layer in module.layers if layer.role is LayerRole.EMBEDDING)
    head = head_weight * sum(cost[layer.name] for layer in module.layers if layer.role is LayerRole.HEAD)
    return balanced_partition([cost[layer.name] for layer in module.decoder_layers()], stages, embed, head)
