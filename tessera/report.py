"""The plain-text report: what the model is, and where its time goes.

Sections appear as the plan grows: the model and its layer kinds after
capture; per layer kind, compute and All-to-All time on the target hardware
(isolated task durations) and how much of the communication a perfect overlap could
hide; after scheduling and partitioning, the per-stage post-overlap costs. Every
figure names the hardware it is for. The plan is read through ``passes.plan_view``.
"""

from __future__ import annotations

from collections import defaultdict

from passes.pipelining.shipped import shipped_combined
from passes.plan_view import PlanView
from tessera_ir.kinds import LayerRole, MixerKind, Phase
from tessera_ir.model import Layer, Module
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


def _time_section(view: PlanView) -> str:
    """Per layer kind: isolated compute and All-to-All time per micro-batch, forward and backward."""
    module, parallel, hw = view.module, view.parallel, view.hardware
    groups: dict[str, dict[str, float]] = defaultdict(lambda: defaultdict(float))
    counts: dict[str, int] = defaultdict(int)
    for layer in module.layers:
        key = layer.role.value if layer.index is None else f"{layer.mixer.value}+{layer.ffn.value}"
        counts[key] += 1
        for t in layer.tasks:
            us = view.duration(t)
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
        f"Where the time goes (isolated kernels on {view.hardware_name}, per layer and micro-batch, ms; "
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


def render_report(module: Module) -> str:
    """The report of ``module`` for its target hardware (the module's ``hardware`` attribute)."""
    view = PlanView(module)
    target = f"Target hardware: {view.hardware_name}" + (f" ({view.hardware.description})" if view.hardware.description else "")
    if view.hardware.source:  # how far to trust the figures below: measured, or taken from elsewhere
        target += f"\nFigures: {view.hardware.source}"
    sections = [_model_section(module, view.parallel) + "\n" + target, _time_section(view), _plan_section(view)]
    return "\n\n".join(s for s in sections if s)


def _exposed_comm(entries: list[tuple[float, float, str]]) -> tuple[float, float]:
    """(comm time not hidden behind compute, total comm time) of one schedule's entries."""
    compute = sorted((s, s + d) for s, d, stream in entries if stream == "compute" and d > 0)
    total = exposed = 0.0
    for start, duration, stream in entries:
        if stream != "comm" or duration <= 0:
            continue
        end = start + duration
        covered = sum(max(0.0, min(end, ce) - max(start, cs)) for cs, ce in compute if cs < end and ce > start)
        total += duration
        exposed += duration - covered
    return exposed, total


def _layer_letter(layer: Layer) -> str:
    if layer.role is LayerRole.EMBEDDING:
        return "E"
    if layer.role is LayerRole.HEAD:
        return "L"
    return {
        MixerKind.LINEAR_ATTENTION: "D", MixerKind.ATTENTION: "A", MixerKind.SLIDING_ATTENTION: "W",
        MixerKind.MLA: "M", MixerKind.SSM: "S", MixerKind.NONE: "F",
    }[layer.mixer]


def _cost_origin(module: Module, view: PlanView) -> str:
    """What the pair costs are and which hardware they are for."""
    mode = module.attrs.get("profile_mode")
    where = module.attrs.get("profile_hardware", view.hardware_name)
    if mode == "analytic":
        return f"analytic with contention on {where}"
    if mode in ("measured", "cache-only"):
        return f"measured on {module.attrs.get('profile_device', where)} (hardware {where}), scaled to full size"
    return f"schedule makespans on {view.hardware_name}"


def _plan_section(view: PlanView) -> str | None:
    part = view.partition
    if part is None:
        return None
    module, parallel = view.module, view.parallel
    stage_rows = []
    for s, cand in enumerate(part.stages):
        stage_rows.append([
            str(s), str(s % parallel.pp), f"{cand.range[0]}-{cand.range[1]}",
            str(sum(1 for layer in cand.layers if layer.index is not None)),
            "".join(_layer_letter(layer) for layer in cand.layers),
        ])

    device_rows = []
    worst_device, worst_cost = -1, -1.0
    for device, meetings in view.meetings().items():
        costs, serial, exposed, comm = [], 0.0, 0.0, 0.0
        for meeting in meetings:
            pair = meeting.pair
            found = pair.cost() if pair is not None else None
            if pair is None or found is None:
                continue
            costs.append(found[0])
            serial_us = pair.op.attrs.get("serial_us")
            serial += float(serial_us) if isinstance(serial_us, (int, float)) else 0.0
            if pair.schedule is not None:
                entries = [
                    (float(e.attrs["start"]), float(e.attrs["duration"]), str(e.attrs["stream"]))  # type: ignore[arg-type]
                    for e in pair.schedule.entries
                ]
                x, c = _exposed_comm(entries)
                exposed, comm = exposed + x, comm + c
        if not costs:
            continue
        worst = max(costs)
        if worst > worst_cost:
            worst_device, worst_cost = device, worst
        device_rows.append([
            str(device), str(len(costs)), f"{worst / 1e3:.3f}", f"{sum(costs) / 1e3:.3f}",
            f"{serial / 1e3:.3f}" if serial else "-",
            f"{100 * (1 - sum(costs) / serial):.1f}%" if serial else "-",
            f"{100 * exposed / comm:.1f}%" if comm else "-",
        ])

    attrs = part.op.attrs
    lines = [
        f"Partition ({attrs.get('search', 'window')} search, {attrs.get('solver', '')}; MILP variables "
        f"{attrs.get('milp_variables_before', '?')} -> {attrs.get('milp_variables_after', '?')} after pruning):",
        _table(["stage", "device", "layers", "count", "kinds"], stage_rows),
        "  (E embedding, D linear attention, A softmax attention, W sliding window, M MLA, S SSM, F ffn only, L head+loss)",
        "",
        f"Steady state per device (meeting forward/backward pairs, post-overlap cost, ms; {_cost_origin(module, view)}):",
        _table(["device", "pairs", "worst pair", "sum", "serial sum", "overlap gain", "a2a exposed"], device_rows),
    ]
    bottleneck = attrs.get("bottleneck_us")
    balanced = attrs.get("balanced_bottleneck_us")
    if isinstance(bottleneck, (int, float)):
        text = f"Bottleneck: {bottleneck / 1e3:.3f} ms (device {worst_device})"
        if isinstance(balanced, (int, float)) and bottleneck > 0:
            text += f"; serially balanced partition: {balanced / 1e3:.3f} ms ({balanced / bottleneck:.3f}x)"
        lines.append(text)
    if "megatron_layout" in attrs:
        lines.append(f"Megatron-LM layout: --pipeline-model-parallel-layout \"{attrs['megatron_layout']}\"")
    memory = _memory_lines(module, parallel, attrs)
    if memory:
        lines += ["", *memory]
    return "\n".join(lines)


def _memory_lines(module: Module, parallel: ParallelConfig, attrs: dict) -> list[str]:
    """Each device's peak memory as the partition's memory model gives it (no simulation needed)."""
    peaks, capacity = attrs.get("memory_peak_bytes"), attrs.get("memory_capacity_bytes")
    if not isinstance(peaks, list) or not all(isinstance(x, int) for x in peaks) or not isinstance(capacity, int):
        return []
    gib = 2**30
    planned = parallel.combined_1f1b
    order = "combined 1F1B" if planned else "1F1B" if parallel.vpp == 1 else "interleaved 1F1B"
    lines = [
        f"Peak memory per device (memory model: weights, gradients and optimizer state of its stages, the activations "
        f"its {order} order holds in flight, the reserve; of {capacity / gib:.1f} GiB):",
        _table(["device", "stages", "peak GiB", "free GiB"], [
            [str(d), ",".join(str(d + c * parallel.pp) for c in range(parallel.vpp)), f"{peak / gib:.2f}",
             f"{(capacity - peak) / gib:.2f}"]
            for d, peak in enumerate(peaks)
        ]),
    ]
    shipped = shipped_combined(module)
    if shipped != planned:
        lines.append(f"  (the programs run the {'combined' if shipped else 'plain'} order, which holds "
                     f"{'more' if shipped else 'fewer'} micro-batches in flight than these figures assume)")
    return lines
