import re
from pathlib import Path

import pytest

import jbkv_cli
from jbkv_cli.cli.options import (
    parse_method_options,
    parse_seeds,
    prompt_lines,
    read_prompt_items,
    read_prompts,
)
from jbkv_cli.utils.errors import JbkvError
from jbkv_cli.utils.resources import PROMPTS_DIR

REPO = Path(__file__).resolve().parents[2]


def test_prompt_sets_ship_inside_the_package():
    """Named sets live in the package (so an installed wheel has them, not only a checkout);
    the repository's prompts/ is the same folder, and package-data covers every file in it."""
    assert PROMPTS_DIR.parent == Path(jbkv_cli.__file__).resolve().parent
    assert (REPO / "prompts").resolve() == PROMPTS_DIR
    line = re.search(r'^"jbkv_cli" = \[(.*)\]$', (REPO / "pyproject.toml").read_text(), re.M)
    globs = re.findall(r'"([^"]+)"', line.group(1))
    for f in PROMPTS_DIR.iterdir():
        assert any(f.match(g.removeprefix("**/")) for g in globs), f
    assert len(read_prompts(None, None, "tiny")) >= 8


def test_vbench_sets_use_vbench_sample_counts():
    smoke = read_prompt_items("vbench-smoke", None, "magi1", None)
    assert len(smoke) == 11 and all(seeds == [0] for _, seeds in smoke)
    long30 = read_prompt_items("vbench-long-30", None, "magi1", None)
    assert len(long30) == 287
    counts = {len(seeds) for _, seeds in long30}
    assert counts <= {5, 25} and 5 in counts
    fixed = read_prompt_items("vbench-smoke", ["extra prompt"], "magi1", [3, 4])
    assert fixed[-1] == ("extra prompt", [3, 4]) and fixed[0][1] == [3, 4]


def test_prompt_files_and_comments(tmp_path):
    f = tmp_path / "p.txt"
    f.write_text("# comment\n a red circle \n\nblue square\nblue square\n")
    assert read_prompts(str(f), ["x"], "magi1") == ["a red circle", "blue square", "x"]
    with pytest.raises(JbkvError, match="no prompts"):
        (tmp_path / "empty.txt").write_text("# nothing\n")
        read_prompts(str(tmp_path / "empty.txt"), None, "magi1")


@pytest.mark.parametrize(
    ("text", "want"),
    [("0", [0]), ("0,2", [0, 2]), ("1-3", [1, 2, 3]), ("3,1-2,3", [3, 1, 2]), (None, None)],
)
def test_parse_seeds(text, want):
    assert parse_seeds(text) == want


@pytest.mark.parametrize("text", ["", "a", "-1", "1-x"])
def test_bad_seeds(text):
    with pytest.raises(JbkvError, match="seeds"):
        parse_seeds(text)


def test_prompt_files_split_on_newlines_only():
    text = "a\u2028b\r\nc\x0cd\n\u0085e\u2029f\nlast"
    assert prompt_lines(text) == ["a\u2028b", "c\x0cd", "\u0085e\u2029f", "last"]


def test_a_prompt_file_with_a_bom_gives_the_same_prompts(tmp_path):
    f = tmp_path / "p.txt"
    f.write_bytes("\ufeffa red circle\r\nblue square\r\n".encode())
    assert read_prompts(str(f), None, "magi1") == ["a red circle", "blue square"]


def _variant(*items: str, pruner: str | None = None) -> str:
    from jbkv_cli.kvcache.spec import KVSpec
    from jbkv_cli.prune.registry import build_pruner, pruner_names
    from jbkv_cli.quant.registry import method_names

    options = parse_method_options(list(items), (*method_names(), *pruner_names()))
    if pruner:
        return KVSpec(pruner=build_pruner(pruner, **options[pruner])).variant_id
    return KVSpec.build("quarot", 2, 32, **options.get("quarot", {})).variant_id


def test_equal_option_values_make_one_variant_id_and_distinct_ones_two():
    assert {_variant(f"quarot.seed={s}") for s in ("1", "01", "+1", " 1 ")} == {
        "int2-quarot-g32-rs1"
    }
    assert _variant("quarot.seed=0", "quarot.block_size=none") == _variant()
    for name, key, short in (
        ("forcing-kv", "sim_retention_ratio", "forcingkv"),
        ("forcing-kv-history", "retention", "fkv"),
    ):
        half = {_variant(f"{name}.{key}={r}", pruner=name) for r in (".5", "5e-1")}
        assert half == {f"{short}-r50"}
        ids = {_variant(f"{name}.{key}={r}", pruner=name) for r in ("0.33", "0.333", "0.334")}
        assert ids == {short, f"{short}-r33p3", f"{short}-r33p4"}  # 0.33 is the default


def test_every_method_and_pruner_field_declares_its_type_and_bounds():
    """A new option cannot be added without a Spec (so it cannot skip validation)."""
    from dataclasses import fields

    from jbkv_cli.prune.registry import PRUNERS
    from jbkv_cli.quant.registry import METHODS
    from jbkv_cli.utils.fields import declared_specs

    for cls in (*METHODS.values(), *PRUNERS.values()):
        assert [f.name for f in fields(cls)] == list(declared_specs(cls)), cls.__name__


def test_every_model_option_has_a_spec():
    from jbkv_cli.models.magi1 import OPTIONS as MAGI1
    from jbkv_cli.models.tiny import OPTIONS as TINY
    from jbkv_cli.models.wan.self_forcing.model import OPTIONS as SELF_FORCING
    from jbkv_cli.models.wan.self_forcing.model import PRESETS as SF_PRESETS
    from jbkv_cli.models.wan.skyreels_v2.model import OPTIONS as SKYREELS
    from jbkv_cli.models.wan.skyreels_v2.model import PRESETS as SKY_PRESETS

    assert set(TINY) == {"weights", "device", "num_chunks", "steps", "window", "sink", "ctx_noise"}
    assert {"config", "steps", "num_chunks", "window", "kv_range", "seed"} <= set(MAGI1)
    for presets, options in ((SF_PRESETS, SELF_FORCING), (SKY_PRESETS, SKYREELS)):
        for preset in presets.values():
            assert set(preset) <= set(options)


def test_the_longest_prompt_fits_every_temp_name_on_any_host(tmp_path, monkeypatch):
    """With a 64-character host name and a 10-digit pid, the temp file of every file of a video
    named after the longest accepted prompt is created (NAME_MAX is 255 bytes here)."""
    from jbkv_cli.run.directory import LOSSLESS_SUFFIX, MAX_PROMPT_BYTES, check_prompt, video_name
    from jbkv_cli.utils import atomic

    monkeypatch.setattr(atomic, "_HOST", atomic.host_tag("h" * 64))
    monkeypatch.setattr(atomic.os, "getpid", lambda: 4_294_967_295)
    longest = "€" * (MAX_PROMPT_BYTES // 3) + "a" * (MAX_PROMPT_BYTES % 3)
    assert check_prompt(longest) == longest and len(longest.encode()) == MAX_PROMPT_BYTES
    with pytest.raises(JbkvError, match="too long"):
        check_prompt(longest + "a")
    name = video_name(longest, 999_999)  # INDEX_DIGITS digits
    for suffix in (LOSSLESS_SUFFIX, ".mp4", ".json"):
        with atomic.atomic_path(tmp_path / f"{name}{suffix}") as tmp:
            assert len(tmp.name.encode()) <= atomic.NAME_MAX
            tmp.write_bytes(b"x")
        assert (tmp_path / f"{name}{suffix}").read_bytes() == b"x"
