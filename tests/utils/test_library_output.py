"""What transformers, diffusers, torch, Pillow and numpy print goes through jbkv: chatter
dropped, a load report in one line, library warnings dropped only around jbkv's loads."""

from __future__ import annotations

import logging
import warnings

import pytest

from jbkv_cli.utils import library_output
from jbkv_cli.utils.library_output import Said, capture, quiet_warnings, show, summary


def _missing_tensor_folder(tmp_path):
    """A tiny Llama folder whose weights file lacks one tensor."""
    from safetensors.torch import load_file, save_file

    from tests.llm.conftest import tiny_lm

    folder = tmp_path / "llama"
    tiny_lm("llama").save_pretrained(folder)
    state = load_file(folder / "model.safetensors")
    del state["model.layers.1.mlp.up_proj.weight"]
    save_file(state, folder / "model.safetensors", metadata={"format": "pt"})
    return folder


def test_a_load_report_is_kept_by_capture_and_summarised_in_one_line(tmp_path, capsys):
    from transformers import AutoModelForCausalLM

    folder = _missing_tensor_folder(tmp_path)
    capsys.readouterr()  # what saving it printed
    with capture() as said:
        AutoModelForCausalLM.from_pretrained(folder)
    reports = [s for s in said if "LOAD REPORT" in s.text]
    assert len(reports) == 1 and reports[0].library == "transformers", said
    assert len(reports[0].text.splitlines()) > 3  # transformers' table, kept whole
    line = summary(reports[0].text)
    assert "\n" not in line and "\x1b" not in line
    assert line.startswith("LlamaForCausalLM from ")
    assert "MISSING model.layers.1.mlp.up_proj.weight" in line, line
    assert capsys.readouterr().err == ""  # nothing printed while captured


def test_records_outside_a_capture_are_one_warning_line_each(tmp_path, capsys):
    from transformers import AutoModelForCausalLM

    folder = _missing_tensor_folder(tmp_path)
    library_output.install()
    capsys.readouterr()
    AutoModelForCausalLM.from_pretrained(folder)
    err = capsys.readouterr().err
    lines = [ln for ln in err.splitlines() if ln.strip()]
    assert len(lines) == 1 and lines[0].startswith("warning: transformers: LlamaForCausalLM"), err
    assert "Loading weights" not in err  # the bar is off


def test_chatter_is_dropped_and_other_records_are_one_line(capsys):
    show(Said("diffusers", "WARNING", "Defaulting to unsafe serialization. Pass `allow_pickle`"))
    show(Said("diffusers", "ERROR", "An error occurred while trying to fetch /x: no file"))
    assert capsys.readouterr().err == ""
    show(Said("diffusers", "WARNING", "first line\nsecond line\n"))
    assert capsys.readouterr().err == "warning: diffusers: first line\n"


def test_the_libraries_own_handlers_are_replaced_once_imported():
    import diffusers.utils.logging as dlog
    import transformers.utils.logging as tlog

    library_output.install()
    for name, log in (("transformers", tlog), ("diffusers", dlog)):
        handlers = logging.getLogger(name).handlers
        assert library_output._handler in handlers, name
        assert not [h for h in handlers if type(h) is logging.StreamHandler], (name, handlers)
        assert not log.is_progress_bar_enabled(), name


def _warn_from(module: str) -> None:
    warnings.warn_explicit("library says hi", UserWarning, "x.py", 1, module=module)


@pytest.mark.parametrize("module", ["torch.serialization", "PIL.Image", "numpy.core", "torch"])
def test_quiet_warnings_drops_library_warnings_only_inside(module):
    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always")
        with quiet_warnings():
            _warn_from(module)
            _warn_from("jbkv_cli.stats")  # jbkv's own stays
            _warn_from("torchvision")  # not torch: a library of another name
        _warn_from(module)  # outside the block: shown as before
    assert [w.filename for w in seen] == ["x.py"] * 3
    assert len(seen) == 3
