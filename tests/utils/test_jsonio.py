"""The reader of user-named files: regular files only, a size cap, JSON without NaN/inf or a
``RecursionError``; every failure one :class:`FileReadError` line naming the file."""

from __future__ import annotations

import os

import pytest

from jbkv_cli.utils.jsonio import FileReadError, read_bytes, read_json, read_text


def _refused(path, needle, **kw):
    with pytest.raises(FileReadError) as info:
        read_json(path, "thing", **kw)
    message = str(info.value)
    assert message.startswith(f"cannot read thing {path}: ") and needle in message, message
    assert "\n" not in message


def test_special_files_are_refused_without_blocking(tmp_path):
    os.mkfifo(tmp_path / "fifo")  # opening it for reading would block without O_NONBLOCK
    _refused(tmp_path / "fifo", "not a regular file (a FIFO)")
    _refused("/dev/zero", "not a regular file (a character device)")
    _refused(tmp_path, "not a regular file (a directory)")
    _refused(tmp_path / "missing.json", "No such file")
    (tmp_path / "link").symlink_to("/dev/zero")
    _refused(tmp_path / "link", "a character device")


def test_the_size_cap_is_checked_before_reading(tmp_path):
    path = tmp_path / "big.json"
    with open(path, "wb") as f:
        f.truncate(2048)
    _refused(path, "larger than 1,024 bytes", limit=1024)
    path.write_text("[1]")
    assert read_bytes(path, limit=3) == b"[1]"


@pytest.mark.parametrize(
    ("text", "needle"),
    [
        ("[" * 100_000 + "]" * 100_000, "nested too deeply"),
        ('{"a": NaN}', "NaN is not a JSON number"),
        ("[Infinity]", "Infinity is not a JSON number"),
        ("[1e400]", "number 1e400 is out of range"),
        ("1" * 5000, "an integer with too many digits"),
        ('{"a": ', "invalid JSON (Expecting value, line 1 column 7)"),
    ],
)
def test_bad_json_is_one_line(tmp_path, text, needle):
    path = tmp_path / "x.json"
    path.write_text(text)
    _refused(path, needle)


def test_non_finite_numbers_can_be_allowed_and_a_bom_is_dropped(tmp_path):
    path = tmp_path / "x.json"
    path.write_bytes(b'\xef\xbb\xbf{"a": NaN, "b": 1e400}')
    doc = read_json(path, finite=False)
    assert doc["a"] != doc["a"] and doc["b"] == float("inf")


def test_text_must_be_utf8_and_the_bad_byte_is_named(tmp_path):
    path = tmp_path / "p.txt"
    path.write_bytes(b"caf\xe9\n")
    with pytest.raises(FileReadError, match=r"p.txt: not UTF-8 text \(byte 3\)"):
        read_text(path, "prompt file")
    path.write_bytes("\ufeffcafé\n".encode())
    assert read_text(path) == "café\n"
