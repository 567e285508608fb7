"""The support layer: what every other package may use and which itself uses nothing of Tessera.

It sits below the IR (``tessera_ir``) and beside the runtime, and holds the process-level
machinery the compiler, its drivers and the runtime share:

- :mod:`support.processes`: forked helpers (work beside the caller, children that die with
  their parent, the cores this process may use);
- :mod:`support.disk_cache`: the one on-disk cache protocol (entries that name their key and
  checksum, warn-and-ignore on reading, atomic writes, a size cap) that the schedule, compile,
  profile and calibration caches are built on;
- :mod:`support.extensions`: loading a C++ extension, or another build of it an environment
  variable names;
- :mod:`support.collector`: the garbage-collector policy, in one place.

It imports only the standard library, so the runtime (which a trainer embeds without the
compiler) may use it too; ``tests/passes/test_layout.py`` keeps it that way.
"""
