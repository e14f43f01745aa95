"""Option groups (jbkv_cli/cli/groups.py): one declaration, every command that takes it."""

from __future__ import annotations

from dataclasses import dataclass, fields
from pathlib import Path
from typing import Annotated, ClassVar

import pytest
import typer
from typer.main import get_command
from typer.testing import CliRunner

from jbkv_cli.cli.app import app
from jbkv_cli.cli.groups import Inputs, ModelFlags, OptionGroup, with_groups
from jbkv_cli.cli.variants import CacheFlags, SweepFlags
from jbkv_cli.utils.errors import UsageError


def _params(command: str) -> set[str]:
    return {p.name for p in get_command(app).commands[command].params}


@pytest.mark.parametrize(
    ("command", "groups"),
    [
        ("generate", (CacheFlags, Inputs, ModelFlags)),
        ("quantize-eval", (SweepFlags, Inputs, ModelFlags)),
        ("profile-heads", (Inputs, ModelFlags)),
    ],
)
def test_every_field_of_a_group_is_an_option_of_each_command_that_takes_it(command, groups):
    names = _params(command)
    for group in groups:
        assert {f.name for f in fields(group)} <= names, group.__name__


@dataclass(frozen=True)
class _Knobs(OptionGroup):
    panel: ClassVar[str] = "Knobs"
    level: Annotated[int, typer.Option("--level", min=0, help="A level.")] = 1
    tags: Annotated[list[str] | None, typer.Option("--tag", "-t", help="Tags.")] = None
    loud: Annotated[bool, typer.Option("--loud/--quiet", help="Loudness.")] = False


def _app(seen: list) -> typer.Typer:
    one = typer.Typer()

    @one.command()
    @with_groups
    def run(name: str = "x", knobs: _Knobs = _Knobs(), flags: ModelFlags = ModelFlags()) -> None:
        seen.append((name, knobs, flags))

    return one


def test_a_field_added_to_a_group_reaches_the_command_parsed_and_packed():
    seen: list = []
    args = ["--name", "y", "--level", "3", "-t", "a", "--tag", "b", "--loud", "--steps", "2"]
    result = CliRunner().invoke(_app(seen), args)
    assert result.exit_code == 0, result.output
    assert seen == [("y", _Knobs(3, ["a", "b"], True), ModelFlags(steps=2))]
    result = CliRunner().invoke(_app(seen), ["--level", "-1"])  # the field's bounds hold
    assert result.exit_code == 2
    result = CliRunner().invoke(_app(seen), ["--help"], env={"COLUMNS": "100"})
    assert "Knobs" in result.output and "Model" in result.output  # each group its help panel


def test_argv_gives_back_the_group_it_was_written_from():
    knobs = _Knobs(level=5, tags=["a b", "c"], loud=True)
    flags = ModelFlags(weights=Path("w dir"), window=0, model_option=["config=tiny-random"])
    assert flags.argv() == [
        "--weights",
        "w dir",
        "--window",
        "0",
        "--model-option",
        "config=tiny-random",
    ]
    assert _Knobs().argv() == [] and ModelFlags().argv() == []
    seen: list = []
    result = CliRunner().invoke(_app(seen), [*knobs.argv(), *flags.argv()])
    assert result.exit_code == 0, result.output
    assert seen[-1][1:] == (knobs, flags)
    assert _Knobs(loud=False, level=2).argv() == ["--level", "2"]
    assert _Switch(on=False).argv() == ["--off"] and _Switch().argv() == []


@dataclass(frozen=True)
class _Switch(OptionGroup):
    on: Annotated[bool, typer.Option("--on/--off", help="A switch on by default.")] = True


def test_two_groups_naming_one_option_are_refused_when_the_command_is_declared():
    with pytest.raises(TypeError, match="repeat weights"):

        @with_groups
        def both(a: ModelFlags = ModelFlags(), b: ModelFlags = ModelFlags()) -> None:
            pass


@pytest.mark.parametrize(
    ("flags", "message"),
    [
        (CacheFlags(correction="nope"), "--correction must be"),
        (CacheFlags(quantizer="nope"), "--quantizer must be"),
        (CacheFlags(bits=16, correct=True), "need a quantized cache"),
        (CacheFlags(bits=4, key_bits=16, correct=True), "needs quantized keys"),
        (CacheFlags(bits=4, ablation="keys-only", value_bits=2), "one --bits"),
        (CacheFlags(bits=4, ablation="bias-only", correct=True), "cannot be --correct-ed"),
        (CacheFlags(bits=4, group_size=0), "positive channel count"),
        (CacheFlags(bits=4, pruner="forcing-kv", ablation="keys-only"), "full variants"),
        (SweepFlags(corrections="taylor,nope"), "corrections"),
        (SweepFlags(bits="2,x"), "bits"),
    ],
)
def test_the_variant_groups_refuse_bad_combinations_before_any_model(flags, message):
    build = flags.spec if isinstance(flags, CacheFlags) else flags.specs
    with pytest.raises(UsageError, match=message):
        build()


def test_the_variant_groups_name_the_variants_of_their_flags():
    spec = CacheFlags(bits=2, correct=True, correction="signed", group_size=16).spec()
    assert (spec.key.bits, spec.correction, spec.key.group_size) == (2, "signed", 16)
    assert CacheFlags().spec().variant_id == "reference"
    ids = [s.variant_id for s in SweepFlags(bits="2", quantizers="rtn").specs()]
    assert ids[0] == "reference" and len(ids) == 3  # reference, none, taylor
