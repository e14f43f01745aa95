"""The command line's copies of the library's names (:mod:`jbkv_cli.cli.names`) equal their
homes: a method, pruner, correction, kernel, dtype or profiling rule added there and not here
fails one of these."""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

from jbkv_cli.attention.correction import CORRECTIONS
from jbkv_cli.cli import names
from jbkv_cli.llm.job import BACKENDS, DTYPES
from jbkv_cli.prune import profile
from jbkv_cli.prune.registry import PRUNERS
from jbkv_cli.quant.registry import METHODS, register_method
from jbkv_cli.quant.rtn import RTN


def test_methods_and_pruners_are_the_registries_in_their_order():
    assert tuple(METHODS) == names.METHODS
    assert tuple(PRUNERS) == names.PRUNERS


def test_corrections_are_the_registered_ones_but_the_ablations():
    assert tuple(n for n, c in CORRECTIONS.items() if not c.ablation) == names.CORRECTIONS
    assert set(CORRECTIONS) - set(names.CORRECTIONS) == {"bias-only"}


def test_llm_prefill_choices_are_the_jobs():
    assert (names.LLM_BACKENDS, names.LLM_DTYPES) == (BACKENDS, DTYPES)


def test_profiling_rules_and_defaults_are_the_profilers():
    assert names.PROFILE_RULES == profile.RULES
    assert names.PROFILE_DEFAULT_RULE == profile.DEFAULT_RULE
    assert names.PROFILE_THRESHOLDS == profile.THRESHOLDS
    assert names.PROFILE_LAST_FRAMES == profile.LAST_FRAMES
    assert names.PROFILE_SKIP_FRAMES == profile.SKIP_FRAMES
    assert names.PROFILE_ANCHOR_FRAMES == profile.DEFAULT_ANCHOR_FRAMES


@dataclass(frozen=True)
class _Renamed(RTN):
    name: ClassVar[str] = "rtn-renamed"


def test_once_the_registry_is_imported_the_names_are_its_own():
    """A method registered at run time is a name the command line accepts (its registry is
    imported here, as registering needs it)."""
    register_method(_Renamed)
    try:
        assert names.method_names() == (*names.METHODS, "rtn-renamed")
    finally:
        METHODS.pop("rtn-renamed", None)
    assert names.method_names() == names.METHODS
    assert names.pruner_names() == names.PRUNERS
