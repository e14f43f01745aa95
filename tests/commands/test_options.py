import re
from pathlib import Path

import pytest

import jbkv_cli
from jbkv_cli.commands.options import parse_seeds, read_prompt_items, read_prompts
from jbkv_cli.errors import JbkvError
from jbkv_cli.resources import PROMPTS_DIR

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
