"""Capture every installed transformers MoE or hybrid family from its default config, side by side with
what the config itself declares and what transformers builds.

    .venv/bin/python bench/bench_families.py [--seq-len N] [--families a,b,...]

Families: the model types transformers can build as a causal or image-text-to-text LM whose default
config routes to experts (num_experts, n_routed_experts, num_local_experts, ...) or declares a
hybrid stack (recurrent beside softmax layers in layer_types, layers_block_type, attn_type_list,
hybrid_override_pattern, block_types). For each, one line:

- ``layers``: decoder layers captured, against the config's num_hidden_layers;
- ``kinds``: mixer/FFN per layer in execution order, compressed (``A`` attention, ``S`` sliding,
  ``L`` linear attention, ``M`` MLA, ``Z`` SSM, ``-`` none; ``e`` MoE, ``d`` dense MLP), e.g.
  ``Ld + (Le Le Le Ae)x11``;
- ``declared``: layers whose kind disagrees with the config's declared layer type (``-`` when the
  config declares none), the check capture itself warns about;
- ``params IR``: parameters the IR accounts for (embedding, every layer, final norm and head), against
  ``LM``, the parameters of the language model transformers builds from the same config (the module
  owning the decoder stack plus the output projection; a projection tied to the embedding, marked
  ``t``, is counted twice, as the first and last pipeline stage each hold it), and their ``ratio``;
  ``other`` is what the model holds outside the language model (vision or audio towers, projectors);
- ``warn``: capture warnings; the error, for a family capture refuses.

The table and each family's warnings are printed and saved to bench/results/families.{csv,json}.
"""

from __future__ import annotations

import argparse
import csv
import json
import time
import warnings
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "bench" / "results"
CODES = {"attention": "A", "sliding_attention": "S", "linear_attention": "L", "mla": "M", "ssm": "Z", "none": "-"}
FFN_CODES = {"moe": "e", "dense": "d", "none": "-"}
_MOE_FIELDS = ("num_experts", "n_routed_experts", "num_local_experts", "moe_num_experts", "num_experts_per_tok")


def _text_config(config: Any) -> Any:
    return getattr(config, "text_config", None) or config


def _is_moe(config: Any) -> bool:
    cfg = _text_config(config)
    if any(isinstance(getattr(cfg, f, None), int) and getattr(cfg, f) > 1 for f in _MOE_FIELDS):
        return True
    return any(str(t) in ("sparse", "moe") for t in getattr(cfg, "mlp_layer_types", None) or [])


def _is_hybrid(config: Any) -> bool:
    from frontend.layer_kinds import declared_layer_types
    from tessera_ir import MixerKind

    cfg = _text_config(config)
    layers = getattr(cfg, "num_hidden_layers", None)
    if not isinstance(layers, int):
        return False
    declared = [d for d in declared_layer_types(cfg, layers) if d is not None]
    recurrent = {MixerKind.LINEAR_ATTENTION, MixerKind.SSM}
    return any(d.kinds <= recurrent for d in declared) and any(not d.kinds <= recurrent for d in declared)


def families() -> list[str]:
    """Installed model types that build as an LM and are MoE or hybrid, by their default config."""
    from transformers import AutoConfig
    from transformers.models.auto.modeling_auto import (
        MODEL_FOR_CAUSAL_LM_MAPPING_NAMES,
        MODEL_FOR_IMAGE_TEXT_TO_TEXT_MAPPING_NAMES,
    )

    candidates = sorted(set(MODEL_FOR_CAUSAL_LM_MAPPING_NAMES) | set(MODEL_FOR_IMAGE_TEXT_TO_TEXT_MAPPING_NAMES))
    chosen = []
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        for model_type in candidates:
            try:
                config = AutoConfig.for_model(model_type)
            except Exception:  # noqa: BLE001 - a type without a default config is not a candidate
                continue
            if _is_moe(config) or _is_hybrid(config):
                chosen.append(model_type)
    # "<type>_text" duplicates the language model of "<type>"
    return [t for t in chosen if not (t.endswith("_text") and t[: -len("_text")] in chosen)]


def compress(tokens: list[str]) -> str:
    """Layer kinds as a prefix plus a repeated block (and a tail), or as runs."""
    best = " ".join(_runs(tokens))
    n = len(tokens)
    for prefix in range(0, min(4, n)):
        body = tokens[prefix:]
        for period in range(1, min(8, len(body) // 2) + 1):
            repeats = len(body) // period
            block = body[:period]
            if repeats < 2 or body[: repeats * period] != block * repeats:
                continue
            tail = body[repeats * period:]
            if tail != block[: len(tail)]:
                continue
            parts = []
            if prefix:
                parts.append(" ".join(_runs(tokens[:prefix])))
            parts.append(f"({' '.join(block)})x{repeats}" if period > 1 else f"{block[0]}x{repeats}")
            if tail:
                parts.append(" ".join(tail))
            text = " + ".join(parts)
            if len(text) < len(best):
                best = text
    return best


def _runs(tokens: list[str]) -> list[str]:
    out: list[str] = []
    i = 0
    while i < len(tokens):
        j = i
        while j < len(tokens) and tokens[j] == tokens[i]:
            j += 1
        out.append(tokens[i] if j - i == 1 else f"{tokens[i]}x{j - i}")
        i = j
    return out


def _ir_parameters(module: Any) -> int:
    """Parameters the IR assigns (captured at TP 1): embedding, decoder layers, head (final norm + projection)."""
    from tessera_ir.parallel import ParallelConfig

    assert int(module.attrs["tp"]) == 1
    d = ParallelConfig(dtype=str(module.attrs["dtype"])).dtype_bytes
    embed = module.task_map()["embed.embedding.fwd"].param_bytes // d
    head = module.task_map()["head.lm_head.fwd"].param_bytes // d
    return embed + head + sum(int(layer.attrs["parameters"]) for layer in module.decoder_layers())


def _model_parameters(model_type: str) -> dict[str, Any]:
    """What transformers builds from the default config: all parameters, the language model's (the module
    owning the decoder stack, plus the output projection), and whether the projection shares the embedding."""
    import torch
    from transformers import AutoConfig, AutoModel, AutoModelForCausalLM

    from frontend.trace import find_decoder_stack

    config = AutoConfig.for_model(model_type)
    with torch.device("meta"):
        try:
            model = AutoModelForCausalLM.from_config(config)
        except ValueError:
            model = AutoModel.from_config(config)
    stack_path, _ = find_decoder_stack(model)
    owner = model.get_submodule(stack_path.rsplit(".", 1)[0]) if "." in stack_path else model
    lm = {id(p): p.numel() for p in owner.parameters()}
    projection = model.get_output_embeddings() if hasattr(model, "get_output_embeddings") else None
    tied = False
    for p in projection.parameters() if projection is not None else []:
        tied = tied or id(p) in lm
        lm.setdefault(id(p), p.numel())
    # A tied projection is one tensor in the model but the IR's embedding and head both hold it (the first
    # and the last pipeline stage each keep a copy), so the IR should count it twice.
    copy = sum(p.numel() for p in projection.parameters()) if tied and projection is not None else 0
    total = sum(p.numel() for p in model.parameters())
    return {"params_model": total, "params_lm": sum(lm.values()) + copy, "params_other": total - sum(lm.values()),
            "tied": tied}


def run_family(model_type: str, seq_len: int) -> dict[str, Any]:
    from frontend import capture
    from frontend.errors import CaptureWarning
    from frontend.layer_kinds import declared_layer_types
    from frontend.sources import load_source

    row: dict[str, Any] = {"family": model_type}
    start = time.perf_counter()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always", CaptureWarning)
        try:
            module = capture(f"hf:{model_type}", overrides={"seq_len": seq_len, "tp": 1})
        except Exception as exc:  # noqa: BLE001 - every failure is a row of the table
            row.update(error=f"{type(exc).__name__}: {exc}", seconds=time.perf_counter() - start)
            return row
    row["seconds"] = time.perf_counter() - start
    row["warnings"] = [str(w.message) for w in caught if issubclass(w.category, CaptureWarning)]
    layers = module.decoder_layers()
    config = load_source(f"hf:{model_type}").config
    cfg = _text_config(config)
    row["layers"] = len(layers)
    row["config_layers"] = getattr(cfg, "num_hidden_layers", None)
    # A layer running several mixers side by side (attention beside Mamba) shows each: "ZAd".
    row["kinds"] = [
        "".join(CODES[str(kind)] for kind in (layer.attrs.get("mixers") or [layer.mixer.value]))  # type: ignore[union-attr]
        + FFN_CODES[layer.ffn.value]
        for layer in layers
    ]
    declared = declared_layer_types(cfg, len(layers))
    if any(d is not None for d in declared):
        row["declared_mismatch"] = [layer.index for layer, d in zip(layers, declared)
                                    if d is not None and layer.mixer not in d.kinds]
    row["params_ir"] = _ir_parameters(module)
    row.update(_model_parameters(model_type))
    return row


def _line(row: dict[str, Any]) -> str:
    name = f"{row['family']:<22}"
    if "error" in row:
        return f"{name} ERROR {row['error'][:160]}"
    layers = f"{row['layers']}/{row['config_layers']}"
    mismatch = row.get("declared_mismatch")
    declared = "-" if mismatch is None else ("ok" if not mismatch else f"{len(mismatch)} differ")
    ratio = row["params_ir"] / row["params_lm"] if row["params_lm"] else float("nan")
    tied = "t" if row["tied"] else " "
    return (f"{name} {layers:>7} {declared:>9} {row['params_ir'] / 1e9:9.3f}B {row['params_lm'] / 1e9:9.3f}B "
            f"{ratio:7.4f}{tied} {row['params_other'] / 1e9:7.3f}B {len(row['warnings']):>4}  {compress(row['kinds'])}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seq-len", type=int, default=4096, help="sequence length captured (default 4096)")
    parser.add_argument("--families", help="comma list of model types (default: every installed MoE/hybrid family)")
    args = parser.parse_args()

    chosen = args.families.split(",") if args.families else families()
    print(f"{len(chosen)} families at seq_len {args.seq_len}")
    print(f"{'family':<22} {'layers':>7} {'declared':>9} {'params IR':>10} {'LM':>10} {'ratio':>8} {'other':>8} "
          f"{'warn':>4}  kinds")
    rows = []
    for model_type in chosen:
        row = run_family(model_type, args.seq_len)
        rows.append(row)
        print(_line(row), flush=True)
    print()
    for row in rows:
        for message in row.get("warnings", [])[:3]:
            print(f"{row['family']}: warning: {message}")
        if len(row.get("warnings", [])) > 3:
            print(f"{row['family']}: ... {len(row['warnings']) - 3} more warnings")
    ok = [r for r in rows if "error" not in r]
    exact = [r for r in ok if r["params_ir"] == r["params_lm"]]
    agree = [r for r in ok if r.get("declared_mismatch") == []]
    print(f"\ncaptured {len(ok)}/{len(rows)}; parameters exact in {len(exact)}/{len(ok)}; kinds agree with the "
          f"declared layer types in {len(agree)}/{sum(1 for r in ok if 'declared_mismatch' in r)}; "
          f"{sum(len(r['warnings']) for r in ok)} warnings in {sum(1 for r in ok if r['warnings'])} families")

    RESULTS.mkdir(parents=True, exist_ok=True)
    (RESULTS / "families.json").write_text(json.dumps({"seq_len": args.seq_len, "families": rows}, indent=2) + "\n")
    with (RESULTS / "families.csv").open("w", newline="") as f:
        writer = csv.writer(f)
        writer.writerow(["family", "layers", "config_layers", "declared_mismatch", "params_ir", "params_lm",
                         "params_other", "tied", "warnings", "kinds", "error"])
        for r in rows:
            writer.writerow([r["family"], r.get("layers", ""), r.get("config_layers", ""),
                             "" if r.get("declared_mismatch") is None else len(r["declared_mismatch"]),
                             r.get("params_ir", ""), r.get("params_lm", ""), r.get("params_other", ""),
                             r.get("tied", ""),
                             len(r.get("warnings", [])), compress(r["kinds"]) if "kinds" in r else "",
                             r.get("error", "")])


if __name__ == "__main__":
    main()
