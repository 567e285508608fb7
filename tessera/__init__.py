"""Tessera: overlap-aware pipeline-parallel planning for heterogeneous MoE models.

The public Python API::

    import tessera
    module = tessera.compile("hf:qwen3_next", pp=8, vpp=2, ep=32)   # capture + planning passes
    print(tessera.report(module))
    print(tessera.capacity(module, routing="zipf").render())          # simulated iterations, static and DBO
    tessera.save_ir(module, "qwen3_next.tir")
    tessera.save_plan(module, "qwen3_next.tsb")                      # per-rank programs as bytecode
    module = tessera.load_ir("qwen3_next.tir")
"""

from tessera.api import DEFAULT_PIPELINE, capacity, capture, compile, load_ir, report, run_passes, save_ir, save_plan

__all__ = ["DEFAULT_PIPELINE", "capacity", "capture", "compile", "load_ir", "report", "run_passes", "save_ir", "save_plan"]
__version__ = "0.1.0"
