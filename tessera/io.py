"""Reading inputs and writing outputs so that a failure is one clear line and leaves nothing behind.

- :func:`read_text` reads a UTF-8 file (or standard input) and turns every way that can
  fail (missing, a folder, unreadable, not UTF-8) into an :class:`InputError` naming the
  file and, for bad bytes, their line and column.
- :func:`check_output_file` and :func:`check_output_folder` say before any work is done
  whether an output can be written where it was asked for. Tessera never creates the
  folders around an output: a file's folder must exist; a folder named as an output is
  created (and the tool says so) only when its own parent exists.
- :func:`check_outputs_apart` refuses, before any work, an output that names one of the
  run's inputs or another of its outputs, however it is spelled (``./m.py``, a symbolic
  link, a hard link): a tool never overwrites what it reads, nor one output with another.
- :func:`write_files` writes several files as one step: every file goes to a temporary
  file beside its target first, then all are renamed into place; if anything fails the
  temporaries are removed and the files replaced so far are put back.
"""

from __future__ import annotations

import os
import secrets
import stat
import sys
import tempfile
from collections.abc import Mapping, Sequence
from pathlib import Path

from tessera_ir.errors import TesseraError


class InputError(TesseraError):
    """An input file that cannot be read as text."""


class OutputError(TesseraError):
    """An output that cannot be written where it was asked for."""


def _shown(path: str | Path) -> str:
    text = str(path)
    return text if len(text) <= 200 else text[:120] + "..." + text[-60:]


def read_bytes(path: str | Path, what: str = "input file") -> bytes:
    """The bytes of ``path`` (``-``: standard input)."""
    if str(path) == "-":
        return sys.stdin.buffer.read()
    try:
        return Path(path).read_bytes()
    except FileNotFoundError:
        raise InputError(f"{what} '{_shown(path)}' does not exist") from None
    except IsADirectoryError:
        raise InputError(f"{what} '{_shown(path)}' is a folder; give the file itself") from None
    except OSError as err:
        raise InputError(f"cannot read {what} '{_shown(path)}': {err.strerror or err}") from None


def read_text(path: str | Path, what: str = "input file") -> str:
    """The UTF-8 text of ``path`` (``-``: standard input)."""
    return _decode(read_bytes(path, what), "<stdin>" if str(path) == "-" else _shown(path))


def _decode(data: bytes, name: str) -> str:
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as err:
        line = data.count(b"\n", 0, err.start) + 1
        column = err.start - (data.rfind(b"\n", 0, err.start) + 1) + 1
        raise InputError(
            f"{name}:{line}:{column}: not UTF-8 text (byte 0x{data[err.start]:02x}); save the file as UTF-8"
        ) from None


def check_output_file(path: str, flag: str) -> None:
    """Refuse, before any work, an output file that cannot be written at ``path``."""
    if path == "-":
        return
    target = Path(path)
    try:
        if stat.S_ISDIR(target.stat().st_mode):
            raise OutputError(f"{flag} {_shown(path)}: that is a folder; give a file name")
    except FileNotFoundError:
        pass  # a new file
    except NotADirectoryError:
        raise OutputError(f"{flag} {_shown(path)}: a part of that path is a file, not a folder") from None
    except OSError as err:  # a name too long, a loop of links, ...
        raise OutputError(f"{flag} {_shown(path)}: {err.strerror or err}") from None
    folder = target.parent
    if not folder.is_dir():
        raise OutputError(
            f"{flag} {_shown(path)}: folder '{_shown(folder)}' does not exist; create it first or choose another path"
        )
    if not os.access(folder, os.W_OK | os.X_OK):
        raise OutputError(f"{flag} {_shown(path)}: cannot write in folder '{_shown(folder)}' (permission denied)")


def check_output_folder(path: str | Path, flag: str) -> bool:
    """Refuse, before any work, an output folder that cannot be used; True if it exists already."""
    folder = Path(path)
    try:
        if folder.is_dir():
            if not os.access(folder, os.W_OK | os.X_OK):
                raise OutputError(f"{flag} {_shown(path)}: cannot write in that folder (permission denied)")
            return True
        if folder.exists():
            raise OutputError(f"{flag} {_shown(path)}: that is a file; {flag} names a folder")
        if not folder.parent.is_dir():
            raise OutputError(
                f"{flag} {_shown(path)}: folder '{_shown(folder.parent)}' does not exist; create it first "
                "(only the output folder itself is created)"
            )
    except OSError as err:
        raise OutputError(f"{flag} {_shown(path)}: {err.strerror or err}") from None
    return False


def check_input_name(path: str, what: str) -> None:
    """Refuse, before any work, an input whose name the system cannot look up at all (too long,
    a loop of links, a NUL byte); a missing file is left to the reader, which says what it expects."""
    try:
        os.stat(path)
    except (FileNotFoundError, NotADirectoryError):
        pass
    except (OSError, ValueError) as err:
        reason = err.strerror if isinstance(err, OSError) and err.strerror else str(err)
        raise InputError(f"{what} '{_shown(path)}': {reason.lower()}; check the path") from None


def _identities(path: str) -> set[tuple[object, ...]]:
    """What makes ``path`` the same file as another: its resolved name (through every
    symbolic link, even one to a file not there yet) and, for a file that exists, its
    device and inode (a hard link, a bind mount)."""
    keys: set[tuple[object, ...]] = {("name", os.path.realpath(path))}
    try:
        found = os.stat(path)
    except (OSError, ValueError):  # a new file, a name too long, a NUL byte: the name alone says it
        return keys
    keys.add(("inode", found.st_dev, found.st_ino))
    return keys


def check_outputs_apart(inputs: Mapping[str, str | None], outputs: Mapping[str, str | None]) -> None:
    """Refuse, before any work, an output that is one of the inputs or another output.

    ``inputs`` and ``outputs`` map what names each path on the command line (``source``,
    ``-o``, ``--summary-json``) to the path; ``None`` (not given) and ``-`` (standard input
    or output) take no part.
    """
    seen: dict[tuple[object, ...], tuple[str, str, bool]] = {}  # identity -> (role, path, is an input)
    for role, path in inputs.items():
        if path is not None and path != "-":
            for key in _identities(path):
                seen.setdefault(key, (role, path, True))
    for role, path in outputs.items():
        if path is None or path == "-":
            continue
        keys = _identities(path)
        clash = next((seen[key] for key in sorted(keys, key=repr) if key in seen), None)
        if clash is not None:
            other, other_path, is_input = clash
            same = "" if other_path == path else f" ({_shown(other_path)})"
            if is_input:
                raise OutputError(
                    f"{role} {_shown(path)}: that is the {other}{same}, which this run reads; writing it would "
                    "destroy the input; choose another output path"
                )
            raise OutputError(
                f"{role} {_shown(path)}: {other} goes to the same file{same}; give each output its own path"
            )
        for key in keys:
            seen[key] = (role, path, False)


def write_atomic(path: str | Path, data: str | bytes) -> None:
    """Write ``data`` to ``path`` via a temporary file in the same folder and a rename.

    A crash or an error before the rename leaves any previous file untouched and
    no partial file; ``-`` writes to standard output.
    """
    if str(path) == "-":
        if isinstance(data, bytes):
            sys.stdout.buffer.write(data)
        else:
            sys.stdout.write(data)
        sys.stdout.flush()
        return
    write_files([(Path(path), data.encode() if isinstance(data, str) else data)])


def write_files(files: Sequence[tuple[Path, bytes]]) -> None:
    """Write every ``(path, data)`` or none of them (see the module docstring)."""
    staged: list[tuple[str, Path]] = []  # (temporary file, target)
    try:
        for target, data in files:
            staged.append((_stage(target, data), target))
    except BaseException:
        for tmp, _ in staged:
            Path(tmp).unlink(missing_ok=True)
        raise
    done: list[tuple[Path, str | None]] = []  # (target, backup of the file it replaced)
    try:
        for tmp, target in staged:
            backup = _backup(target)
            os.replace(tmp, target)
            done.append((target, backup))
    except BaseException as err:
        for tmp, _ in staged:
            Path(tmp).unlink(missing_ok=True)
        for target, backup in reversed(done):
            if backup is not None:
                os.replace(backup, target)
            else:
                target.unlink(missing_ok=True)
        if isinstance(err, OSError):
            failed = staged[len(done)][1]
            raise OutputError(f"cannot write {_shown(failed)}: {err.strerror or err}; no output was written") from None
        raise
    for _, backup in done:
        if backup is not None:
            Path(backup).unlink(missing_ok=True)


def _stage(target: Path, data: bytes) -> str:
    try:
        fd, tmp = tempfile.mkstemp(prefix=f".{target.name[:100]}.", suffix=".tmp", dir=target.parent)
    except OSError as err:
        raise OutputError(f"cannot write {_shown(target)}: {err.strerror or err}") from None
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
        # mkstemp creates the file private (0600); give it the mode a plain open() would.
        umask = os.umask(0)
        os.umask(umask)
        os.chmod(tmp, 0o666 & ~umask)
    except BaseException as err:
        Path(tmp).unlink(missing_ok=True)
        if isinstance(err, OSError):
            raise OutputError(f"cannot write {_shown(target)}: {err.strerror or err}") from None
        raise
    return tmp


def _backup(target: Path) -> str | None:
    """A hard link to the file ``target`` holds now, so a failed step can put it back."""
    if not target.is_file():
        return None
    backup = str(target.parent / f".{target.name[:100]}.{secrets.token_hex(8)}.old")
    try:
        os.link(target, backup)  # fails rather than overwrite, should the name exist
    except OSError:
        return None  # no hard links here: the rename below is still atomic on its own
    return backup
