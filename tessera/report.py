"""The plain-text report: what the model is, and where its time goes.

Sections appear as the plan grows: the model and its layer kinds after
capture; per layer kind, compute and All-to-All time on the target hardware
(analytic, isolated) and how much of the communication a perfect overlap could
hide; after scheduling and partitioning, the per-stage post-overlap costs.
"""

from __future__ import annotations

from collections import defaultdict

from passes.cost_model import Hardware, load_hardware, task_duration_us
from tessera_ir.kinds import Phase
from tessera_ir.model import Module
from tessera_ir.parallel import ParallelConfig


def _fmt_count(n: float) -> str:
    for unit, scale in (("T", 1e12), ("G", 1e9), ("M", 1e6), ("K", 1e3)):
        if abs(n) >= scale:
            return f"{n / scale:.2f}{unit}"
    return f"{n:.0f}"


def _table(headers: list[str], rows: list[list[str]]) -> str:
    widths = [max(len(h), *(len(r[i]) for r in rows)) if rows else len(h) for i, h in enumerate(headers)]
    line = "  ".join(h.ljust(w) if i == 0 else h.rjust(w) for i, (h, w) in enumerate(zip(headers, widths)))
    out = [line, "  ".join("-" * w for w in widths)]
    for r in rows:
        out.append("  ".join(c.ljust(w) if i == 0 else c.rjust(w) for i, (c, w) in enumerate(zip(r, widths))))
    return "\n".join(out)


def _model_section(module: Module, parallel: ParallelConfig) -> str:
    decoder = module.decoder_layers()
    kinds: dict[str, int] = defaultdict(int)
    for layer in decoder:
        kinds[f"{layer.mixer.value} + {layer.ffn.value}"] += 1
    mix = ", ".join(f"{n}× {k}" for k, n in sorted(kinds.items(), key=lambda kv: -kv[1]))
    params = module.attrs.get("parameters", 0)
    lines = [
        f"Model {module.attrs.get('model', module.name)}: {_fmt_count(float(params))} parameters "  # type: ignore[arg-type]
        f"({params:,}), {len(decoder)} decoder layers: {mix}",
        f"Parallel: PP={parallel.pp} VPP={parallel.vpp} EP={parallel.ep} TP={parallel.tp}, "
        f"{parallel.microbatches} micro-batches of {parallel.micro_batch_size}×{parallel.seq_len} tokens, {parallel.dtype}",
        f"Tasks: {sum(len(layer.tasks) for layer in module.layers)} in {len(module.layers)} layers (incl. embedding and head)",
    ]
    return "\n".join(lines)


def _time_section(module: Module, parallel: ParallelConfig, hw: Hardware) -> str:
    """Per layer kind: isolated compute and All-to-All time per micro-batch, forward and backward."""
    groups: dict[str, dict[str, float]] = defaultdict(lambda: defaultdict(float))
    counts: dict[str, int] = defaultdict(int)
    for layer in module.layers:
        key = layer.role.value if layer.index is None else f"{layer.mixer.value}+{layer.ffn.value}"
        counts[key] += 1
        for t in layer.tasks:
            us = task_duration_us(t, hw, parallel)
            side = "fwd" if t.phase is Phase.FWD else "bwd"
            groups[key][f"{side}_{t.resource.value}"] += us
            if t.phase is Phase.WGRAD:
                groups[key]["wgrad"] += us
    rows = []
    total_compute = total_comm = 0.0
    for key in sorted(groups, key=lambda k: -sum(groups[k].values())):
        g, n = groups[key], counts[key]
        compute = g["fwd_compute"] + g["bwd_compute"]
        comm = g["fwd_comm"] + g["bwd_comm"]
        total_compute += compute
        total_comm += comm
        rows.append([
            key, str(n),
            f"{g['fwd_compute'] / n / 1e3:.3f}", f"{g['fwd_comm'] / n / 1e3:.3f}",
            f"{g['bwd_compute'] / n / 1e3:.3f}", f"{g['bwd_comm'] / n / 1e3:.3f}",
            f"{g['wgrad'] / n / 1e3:.3f}",
            f"{comm / compute:.2f}" if compute else "-",
        ])
    header = (
        f"Where the time goes (analytic, isolated kernels on {hw.name}, per layer and micro-batch, ms; "
        f"All-to-All at {hw.a2a_gbps(parallel.ep):.0f} GB/s for EP={parallel.ep}):"
    )
    table = _table(["layer kind", "count", "fwd comp", "fwd a2a", "bwd comp", "bwd a2a", "of which wgrad", "a2a/comp"], rows)
    share = total_comm / (total_comm + total_compute) if total_comm + total_compute else 0.0
    hideable = min(total_comm, total_compute) / total_comm if total_comm else 1.0
    summary = (
        f"All-to-All is {100 * share:.1f}% of serial step time; overlap can hide at most "
        f"{100 * hideable:.1f}% of it (computation beside it is the limit)."
    )
    return "\n".join([header, table, summary])


def render_report(module: Module, hardware: str | None = None) -> str:
    parallel = ParallelConfig.from_attrs(module.attrs)
    hw = load_hardware(hardware or str(module.attrs.get("hardware", "h100")))
    sections = [_model_section(module, parallel), _time_section(module, parallel, hw)]
    return "\n\n".join(sections)

