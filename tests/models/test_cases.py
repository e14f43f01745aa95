"""The Case protocol: case files (``--cases FILE``), prompt-only cases keeping the names and seeds
runs had before cases existed, and runs registering cases (with their plans) in the manifest."""

import json
from functools import partial
from pathlib import Path

import pytest
import torch

from jbkv_cli.models.cases import Case, default_id, read_case_file
from jbkv_cli.run.schema import manifest_problem
from jbkv_cli.utils.errors import UsageError
from tests.installed import run_jbkv

pytestmark = pytest.mark.slow

jbkv = partial(run_jbkv, columns=120)


def write(path: Path, text: str) -> Path:
    path.write_text(text)
    return path


# --- case files -----------------------------------------------------------------------------


def test_case_file_upstream_csv_with_a_pose_column(tmp_path, monkeypatch):
    """HY-WorldPlay's ``assets/test_case.csv`` columns (``image_name,caption``) plus ``pose``;
    a relative image is found next to the case file, else in the current directory."""
    (tmp_path / "assets" / "img").mkdir(parents=True)
    (tmp_path / "assets" / "img" / "1.png").write_bytes(b"png")
    (tmp_path / "cases").mkdir()
    (tmp_path / "cases" / "2.png").write_bytes(b"png")
    write(tmp_path / "cases" / "turn.json", "{}")
    monkeypatch.chdir(tmp_path)
    path = write(
        tmp_path / "cases" / "c.csv",
        "image_name,caption,pose\n"
        './assets/img/1.png,A quiet street,"w-3, right-1, d-4"\n'
        "2.png,A lake,turn.json\n",
    )
    a, b = read_case_file(path)
    assert a == Case(
        "A quiet street",
        str(tmp_path / "assets/img/1.png"),
        "w-3, right-1, d-4",
        "1-w-3,right-1,d-4",
    )
    assert b.image == str(tmp_path / "cases" / "2.png")
    assert b.trajectory == str(tmp_path / "cases" / "turn.json") and b.name == "2-turn"


def test_case_file_ids_and_prompt_only_rows(tmp_path):
    path = write(tmp_path / "c.csv", "Prompt,ID\na red ball,\na blue cube,cube\n")
    ball, cube = read_case_file(path)
    assert ball == Case("a red ball") and ball.prompt_only and ball.name == "a red ball"
    assert cube.name == "cube" and not cube.prompt_only
    assert default_id(None, None, "p") is None and default_id("x/7.jpg", None, "p") == "7"


@pytest.mark.parametrize(
    ("text", "needle"),
    [
        ("", "is empty"),
        ("image,pose\n1.png,w-3\n", "has no prompt column (one of: prompt, caption)"),
        ("prompt\n", "lists no cases"),
        ("prompt,image\nx,\n,1.png\n", "line 3: empty prompt"),
        ("prompt,image\na,missing.png\n", "line 2: image 'missing.png' is not a file"),
        ("prompt,pose\na,gone.json\n", "line 2: pose JSON 'gone.json' is not a file"),
        ("prompt\na\nb\na\n", "line 4: a second case named 'a' (line 2)"),
        ("prompt,id\na,x\nb,x\n", "line 3: a second case named 'x' (line 2)"),
        # what used to pass: an unterminated quote swallowed the rest of the file
        ('prompt,id\na,x\n"b,y\nc,z\n', "line 3: an unterminated quote"),
        ('prompt\n"a"b\n', "line 2: ',' expected after '\"'"),
        # the second image column was ignored
        ("prompt,image,image_path\na,1.png,2.png\n", "has 2 image columns (image, image_path)"),
        ("caption,prompt\na,b\n", "has 2 prompt columns (caption, prompt)"),
        # a NUL or a line break inside a prompt (a quoted cell may hold one)
        ("prompt,id\na\0b,x\n", "line 2: the prompt holds U+0000"),
        ('prompt,id\n"a\nb",x\nc,y\n', "line 2: the prompt holds U+000A"),
        ("caption,id\na\tb,x\n", "line 2: the caption holds U+0009"),
        # an id that cannot name the videos' files is named with its line
        ("prompt,id\na,x\nb,c/d\n", "line 3: id 'c/d' cannot name a file"),
        ("prompt,id\n\nb,.d\n", "line 3: id '.d' cannot name a file"),
        ("prompt\na\n\n.b\n", "line 4: prompt '.b' cannot name a file"),
    ],
)
def test_case_file_problems_are_usage_errors(tmp_path, text, needle):
    path = write(tmp_path / "c.csv", text)
    with pytest.raises(UsageError) as err:
        read_case_file(path)
    assert needle in str(err.value) and "\n" not in str(err.value)


CLI_BAD = [
    ('prompt,id\na,x\n"b,y\n', "c.csv line 3: an unterminated quote"),
    ("prompt,image,image_name\na,1.png,2.png\n", "has 2 image columns"),
    ("prompt,id\na\0b,x\n", "c.csv line 2: the prompt holds U+0000"),
    ('prompt,id\n"a\nb",x\n', "c.csv line 2: the prompt holds U+000A"),
    ("prompt,id\na,x\n\nb,y/z\n", "c.csv line 4: id 'y/z' cannot name a file"),
]


def test_case_file_problems_through_the_installed_jbkv(tmp_path):
    """Exit 2, one line naming the file and the line, nothing created: a bad id used to be
    refused later without its line, and the others were taken."""
    from concurrent.futures import ThreadPoolExecutor

    def one(n: int) -> tuple[str, object]:
        folder = tmp_path / str(n)
        folder.mkdir()
        (folder / "c.csv").write_bytes(CLI_BAD[n][0].encode())
        return folder, jbkv("generate", "--cases", "c.csv", "--out", "run", cwd=folder)

    with ThreadPoolExecutor(max_workers=3) as pool:
        results = list(pool.map(one, range(len(CLI_BAD))))
    for (_, needle), (folder, r) in zip(CLI_BAD, results, strict=True):
        assert r.returncode == 2, (needle, r.stderr)
        lines = r.stderr.splitlines()
        assert len(lines) == 1 and needle in lines[0], (needle, r.stderr)
        assert not (folder / "run").exists()


def test_case_file_unreadable_is_a_usage_error(tmp_path):
    with pytest.raises(UsageError, match="case file"):
        read_case_file(tmp_path)  # a directory
    with pytest.raises(UsageError):
        read_case_file(tmp_path / "missing.csv")


def test_case_round_trip_keeps_the_plan_out_of_identity():
    case = Case("p", "i.png", "w-3", "x", plan={"memory": [[]]})
    again = Case.from_dict(case.to_dict() | {"plan": case.plan})
    assert again == case == Case("p", "i.png", "w-3", "x") and again.plan == case.plan
    assert Case.of("p") == Case("p") and Case.of(case) is case


# --- prompt-only cases keep names and seeds -------------------------------------------------


def test_prompt_only_case_keeps_the_old_noise_and_frames():
    """The tiny model generates ``Case(prompt)`` exactly as it generated ``prompt`` before cases,
    from noise seeded by ``sha256(f"{seed}\\0{prompt}")`` (``jbkv_cli/models/seeding.py``)."""
    import hashlib

    from jbkv_cli.kvcache import FULL_PRECISION
    from jbkv_cli.models.tiny import load_model
    from jbkv_cli.models.tiny.sampler import draw_noise

    model = load_model(num_chunks=2, steps=1)
    prompt, seed = "a red circle moves right on a dark background", 3
    digest = hashlib.sha256(f"{seed}\0{prompt}".encode()).digest()
    old_seed = int.from_bytes(digest[:8], "little") & ((1 << 63) - 1)
    g = torch.Generator().manual_seed(old_seed)
    cfg = model.model.cfg
    expected = torch.randn(2, 2, cfg.chunk_len, cfg.patch_dim, generator=g)
    assert torch.equal(draw_noise(model.model, 2, seed, Case(prompt).name), expected)
    a = model.generate(prompt, seed, FULL_PRECISION).frames
    b = model.generate(Case(prompt), seed, FULL_PRECISION).frames
    assert torch.equal(a, b)


def test_prompt_runs_keep_their_layout_and_case_files_pair_with_them(tmp_path):
    """A run made from prompts writes no ``cases`` and names videos ``{prompt}-{index}`` (as
    before cases); a case file of the same prompts finds those videos done; a case that reuses
    a prompt's name with other inputs is refused, and the manifest is left as it was."""
    tiny = ["--model", "tiny", "--num-chunks", "2", "--steps", "1"]
    r = jbkv(
        "generate",
        *tiny,
        "--prompt",
        "a red circle moves right on a dark background",
        "--out",
        "run",
        cwd=tmp_path,
    )
    assert r.returncode == 0, r.stderr
    manifest = (tmp_path / "run" / "manifest.json").read_text()
    assert "cases" not in json.loads(manifest)
    assert (
        tmp_path
        / "run"
        / "videos"
        / "reference"
        / "a red circle moves right on a dark background-0.mkv"
    ).is_file()
    write(tmp_path / "c.csv", "prompt\na red circle moves right on a dark background\n")
    r = jbkv("generate", *tiny, "--cases", "c.csv", "--out", "run", cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    assert "0 videos generated, 1 already done" in " ".join((r.stdout + r.stderr).split())
    assert (tmp_path / "run" / "manifest.json").read_text() == manifest
    write(
        tmp_path / "d.csv",
        "prompt,id\na blue square moves left on a light background,a red circle moves right on a dark background\n",
    )
    r = jbkv("generate", *tiny, "--cases", "d.csv", "--out", "run", cwd=tmp_path)
    assert r.returncode == 2 and len(r.stderr.strip().splitlines()) == 1, r.stderr
    assert "made from other inputs" in r.stderr
    assert (tmp_path / "run" / "manifest.json").read_text() == manifest


# --- the manifest's cases -------------------------------------------------------------------


def manifest(**extra):
    return {"model": "m", "settings": {}, "prompts": ["a", "1-w-3"], "seeds": [0], **extra}


def test_manifest_without_cases_is_still_valid():
    assert manifest_problem(manifest()) is None
    case = {"prompt": "p", "image": "/x/1.png", "trajectory": "w-3", "id": "1-w-3", "plan": {}}
    assert manifest_problem(manifest(cases={"1-w-3": case})) is None


@pytest.mark.parametrize(
    ("cases", "needle"),
    [
        ([], "'cases' is not an object"),
        ({"b": {"prompt": "p"}}, "'cases' holds 'b', which 'prompts' does not list"),
        ({"a": {"image": "x"}}, "'cases.a' is not an object with a 'prompt'"),
        ({"a": {"prompt": "p", "image": 3}}, "'cases.a.image' is not a string or null"),
    ],
)
def test_manifest_with_bad_cases_is_named(cases, needle):
    assert needle in manifest_problem(manifest(cases=cases))
