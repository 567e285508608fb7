"""The one disk-cache protocol: entries name their key and checksum, anything else is ignored with
the cache's own warning, writes are atomic, the size cap removes the least recently used."""

from __future__ import annotations

import os
import re
import warnings
from pathlib import Path

import pytest

from support.disk_cache import HEADER, DiskCache, digest, resolve_cache_dir


class ExampleWarning(UserWarning):
    pass


def cache(folder: Path, max_bytes: int | None = None, fmt: int = 1) -> DiskCache:
    return DiskCache(
        folder, name="example cache", format=fmt, warning=ExampleWarning, redo="doing it again",
        unwritable="pick another folder", max_bytes=max_bytes,
    )


def test_an_entry_reads_back_with_its_header(tmp_path: Path) -> None:
    c = cache(tmp_path / "examples")
    assert c.read("k1") is None and c.hits == 0  # missing: a miss, no warning
    path = c.put("k1", b"body bytes", {"warnings": ["w"]})
    assert path and c.path("k1").read_bytes().startswith(HEADER)
    entry = c.read("k1")
    assert entry is not None and entry.body == b"body bytes"
    assert entry.meta["key"] == "k1" and entry.meta["format"] == 1 and entry.meta["warnings"] == ["w"]
    assert entry.meta["when"] and entry.meta["host"] and c.hits == 1
    assert c.keys() == ["k1"]


@pytest.mark.parametrize(
    ("damage", "says"),
    [
        (lambda p: p.write_bytes(p.read_bytes()[:-3]), "does not match its checksum"),
        (lambda p: p.write_bytes(b"no header\nbody"), "is damaged (no cache header)"),
        (lambda p: p.write_bytes(HEADER + b"[1]\nbody"), "is damaged (the header is not an object)"),
        (lambda p: p.write_bytes(HEADER + b"{broken\nbody"), "is damaged"),
    ],
)
def test_a_damaged_entry_is_ignored_with_the_cache_s_warning(tmp_path: Path, damage, says: str) -> None:  # noqa: ANN001
    c = cache(tmp_path)
    c.put("k1", "text")
    damage(c.path("k1"))
    with pytest.warns(ExampleWarning, match=rf"example cache entry .*k1\.json {re.escape(says)}.*; ignoring it and doing it again"):
        assert c.read("k1") is None
    assert c.ignored == 1 and c.hits == 0
    c.put("k1", "text")  # overwritten: read without a warning
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert c.read("k1") is not None


def test_an_entry_of_another_key_or_format_is_foreign(tmp_path: Path) -> None:
    c = cache(tmp_path)
    c.put("k2", "text")
    os.replace(c.path("k2"), c.path("k1"))
    with pytest.warns(ExampleWarning, match="belongs to another key or cache format"):
        assert c.read("k1") is None
    c.put("k1", "text")
    with pytest.warns(ExampleWarning, match="belongs to another key or cache format"):
        assert cache(tmp_path, fmt=2).read("k1") is None


def test_a_body_that_is_not_json_is_ignored_by_read_json(tmp_path: Path) -> None:
    c = cache(tmp_path)
    c.put("k1", "{not json")
    with pytest.warns(ExampleWarning, match="is damaged"):
        assert c.read_json("k1") is None
    assert c.hits == 0
    c.put("k2", '{"a": 1}')
    assert c.read_json("k2") == ({"a": 1}, c.read("k2").meta)  # type: ignore[union-attr]


def test_writes_leave_no_temporary_file_and_an_unwritable_folder_is_a_warning(tmp_path: Path) -> None:
    c = cache(tmp_path / "examples")
    for k in range(3):
        c.put(f"k{k}", "x" * 100)
    assert sorted(p.name for p in c.dir.iterdir()) == ["k0.json", "k1.json", "k2.json"]
    blocked = tmp_path / "a file"
    blocked.write_text("")
    stuck = cache(blocked / "examples")
    with pytest.warns(ExampleWarning, match="cannot write the example cache in .*; pick another folder"):
        assert stuck.put("k1", "x") is False
    with pytest.raises(OSError):
        stuck.write("k1", "x")


def test_the_cap_removes_the_least_recently_used_entries(tmp_path: Path) -> None:
    c = cache(tmp_path)
    for age, key in enumerate(["old", "middle", "new"]):
        c.put(key, "x" * 100)
        os.utime(c.path(key), (1_000_000 + age, 1_000_000 + age))
    assert c.read("old") is not None  # a hit makes it the most recently used
    size = c.path("new").stat().st_size
    c.max_bytes = 2 * size
    assert c.trim() == 1
    assert c.keys() == ["new", "old"]


def test_the_cache_folder_and_keys(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("TESSERA_CACHE_DIR", str(tmp_path / "env"))
    assert resolve_cache_dir(None) == tmp_path / "env"
    assert resolve_cache_dir(str(tmp_path / "given")) == tmp_path / "given"
    assert digest({"a": 1, "b": [2]}) == digest({"b": [2], "a": 1}) != digest({"a": 1, "b": [3]})
