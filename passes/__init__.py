"""Tessera's passes: IR -> IR rewrites, verified between each.

Layout: the passes, one module each (``candidates``, ``overlap_schedule``, ``profile``,
``partition``, ``verify_pass``), the pass manager (``manager``) and the one reader of the plan
(``plan_view``) at the top; their machinery in subpackages (``scheduling``, ``partitioning``,
``costs``, ``pipelining``). No pass imports another pass.
"""
