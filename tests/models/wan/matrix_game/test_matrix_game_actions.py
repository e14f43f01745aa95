"""The actions file format and the case checks, in-process (``check_cases`` is what every
command calls before creating anything; the CLI path is in test_matrix_game_cli.py)."""

import json

import pytest

from jbkv_cli.models.cases import Case
from jbkv_cli.models.wan.matrix_game import check_cases, check_options
from jbkv_cli.models.wan.matrix_game.actions import read_actions
from jbkv_cli.models.wan.matrix_game.config import TINY
from jbkv_cli.models.wan.matrix_game.dit import action_windows
from jbkv_cli.utils.errors import UsageError


def refused(folder, row, needle, actions=None, **options):
    if actions is not None:
        (folder / "a.json").write_text(actions)
    image, pose = row
    case = Case("a room", image and str(folder / image), pose and str(folder / pose), "c")
    with pytest.raises(UsageError) as err:
        check_cases([case], config="tiny-random", **options)
    assert needle in str(err.value) and "\n" not in str(err.value)


@pytest.mark.parametrize(
    ("row", "actions", "needle"),
    [
        (("1.png", "a.json"), "not json", "invalid JSON"),
        (("1.png", "a.json"), "[" * 100_000 + "]" * 100_000, "nested too deeply"),
        (("1.png", "a.json"), '{"keyboard": [[' + "9" * 5000 + "]]}", "too many digits"),
        (("1.png", "a.json"), '{"keyboard": [], "jump": 1}', "unknown key 'jump'"),
        (("1.png", "a.json"), "[1, 2]", "must be a JSON object"),
        (("1.png", None), None, "needs an actions file"),
        ((None, "a.json"), None, "needs an image"),
        (("1.png", "a.txt"), None, "is a .json file"),
    ],
)
def test_matrix_game_case_checks(tmp_path, inputs, row, actions, needle):
    inputs(tmp_path)
    refused(tmp_path, row, needle, actions)


def test_matrix_game_action_rows_are_checked(tmp_path, inputs):
    inputs(tmp_path)
    data = json.loads((tmp_path / "a.json").read_text())
    for key, n, bad, needle in (
        ("mouse", 5, [0.1], "'mouse' row 5 must be 2 finite numbers"),
        ("keyboard", 0, [1, 0, 0, True], "'keyboard' row 0 must be 4"),
        ("keyboard", 2, [1, 0, 0, 1e9], "'keyboard' row 2"),
    ):
        broken = json.loads(json.dumps(data))
        broken[key][n] = bad
        refused(tmp_path, ("1.png", "a.json"), needle, json.dumps(broken))
    broken = json.loads(json.dumps(data))
    broken["keyboard"][3] = [float("nan"), 0, 0, 0]  # json writes NaN, which JSON parsers take
    refused(tmp_path, ("1.png", "a.json"), "'keyboard' row 3 must be 4 finite", json.dumps(broken))


def test_matrix_game_templerun_takes_no_mouse(tmp_path, inputs):
    inputs(tmp_path, keyboard_dim=7)
    with pytest.raises(UsageError, match="takes no mouse"):
        read_actions(str(tmp_path / "a.json"), "c", 33, keyboard_dim=7, mouse_dim=0)


def test_matrix_game_length_and_frames_options():
    with pytest.raises(UsageError, match="past the rotary table"):
        check_options(config="tiny-random", num_chunks=342)
    check_options(config="tiny-random", num_chunks=341)  # 1,023 latent frames
    with pytest.raises(UsageError, match=r"4·\(3·chunks − 1\) \+ 1"):
        check_options(config="tiny-random", num_frames=30)
    check_options(config="tiny-random", num_frames=21)


def test_matrix_game_action_windows_are_upstreams():
    """Latent frame f reads raw frames [4f − 12, 4f), frame 0 repeated before the video
    (upstream: pad_t copies of frame 0, slices [4(i − 3) + 12, 4i + 12))."""
    import torch

    cond = torch.arange(1, 34, dtype=torch.float32).view(1, 33, 1)
    win = action_windows(cond, TINY.dit.action, 0, 9)[0, :, :, 0]
    assert win[0].tolist() == [1.0] * 12
    assert win[1].tolist() == [1.0] * 8 + [1, 2, 3, 4]
    assert win[4].tolist() == list(map(float, range(5, 17)))
