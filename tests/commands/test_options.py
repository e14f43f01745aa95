import pytest

from jbkv_cli.commands.options import parse_seeds, read_prompt_items, read_prompts
from jbkv_cli.errors import JbkvError


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
