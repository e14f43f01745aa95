"""``torchrun --nproc-per-node 2`` on the CPU (gloo), against one process, as subprocesses.

- quantize-eval on 2 ranks gives the rows (every metric) and the video bytes of one process;
  both ranks made videos and none was made twice (per-rank counts add up to the total, each
  record names its rank);
- scoring streams: each rank scores its videos while it is still generating (a video as soon as
  it and its reference exist), every video once, each score in its own file (no rank rewrites
  a shared file, nothing is merged); one process scores each video right after making it (the
  order of the files they commit, logged by ``tests/write_log/sitecustomize.py``);
- videos generated but not scored (a kill between the two) are scored on resume, also when
  their reference is made by another rank during the resumed job;
- fidelity on 2 ranks gives the JSON of one process;
- ``kill -9`` of one rank mid-run (held while it writes a video: ``JBKV_TEST_PAUSE``) fails the
  job; one process resumes it to identical results;
- ``kill -9`` of a single process mid-run (held the same way); 2 ranks resume it to identical
  results;
- a rank that cannot write its file fails the job at once, with that rank's one-line error;
  once it can write, one process finishes the job;
- SIGTERM to every rank while each writes a video: each rank prints its one line, removes its
  temp file and exits 143;
- ``report`` prints its table once (rank 0).

The one-process and 2-rank runs of ``EVAL`` are made once (the module fixture ``runs``); a test
that needs a partial run starts from a copy of the one-process run (a process start costs about
3.5 s of CPU importing torch; torchrun starts 3).
"""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path

import pytest

from jbkv_cli.metrics.fidelity import compare_dirs
from jbkv_cli.metrics.fidelity_stats import fidelity_statistics
from tests.installed import JBKV, run_jbkv

pytestmark = pytest.mark.slow

PYTHON_BIN = Path(sys.executable).parent
TORCHRUN = str(PYTHON_BIN / "torchrun")
TORCH_RUN = "torch.distributed.run"
SMALL = ["--prompts", "tiny-ci", "--seeds", "0-1", "--num-chunks", "2", "--steps", "1"]
EVAL = ["quantize-eval", *SMALL, "--bits", "2", "--quantizers", "rtn"]
EVAL += ["--corrections", "none,taylor", "--no-lpips", "--no-plots"]
VIDEOS = 2 * 2 * 3  # prompts x seeds x (reference, int2, int2 + taylor)
RECORD_TIMING = {"seconds", "diagnostics_seconds", "rank", "world_size"}
# a kill mid-run lands while a process writes the video of the last (prompt, seed): one process
# has made the 9 videos before it; rank 1's second video (references go first, round-robin)
PAUSE_AT = "writing:a blue square moves left on a light background-1.mkv"


WRITE_LOG_HOOK = Path(__file__).parents[1] / "support" / "write_log"


def _env(write_log: Path | None = None) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k not in ("RANK", "WORLD_SIZE", "LOCAL_RANK")}
    if write_log is not None:  # log the files the job commits, in order
        path = os.pathsep.join(filter(None, [str(WRITE_LOG_HOOK), env.get("PYTHONPATH")]))
        env |= {"PYTHONPATH": path, "JBKV_TEST_WRITE_LOG": str(write_log)}
    return env | {"JBKV_DIST_TIMEOUT": "900"}


def _jbkv(*args: object, cwd: Path, log: Path | None = None) -> subprocess.CompletedProcess:
    return run_jbkv(*args, cwd=cwd, environ=_env(log))


def _torchrun_cmd(*args: object) -> list[str]:
    # the torchrun script, or the module it runs where a venv has no script (same program)
    launcher = [TORCHRUN] if Path(TORCHRUN).is_file() else [sys.executable, "-m", TORCH_RUN]
    return [*launcher, "--standalone", "--nproc-per-node", "2", "-m", "jbkv_cli", *map(str, args)]


def _torchrun(*args: object, cwd: Path, log: Path | None = None) -> subprocess.CompletedProcess:
    return subprocess.run(
        _torchrun_cmd(*args), capture_output=True, text=True, cwd=cwd, env=_env(log), timeout=900
    )


def _rows(path: Path) -> list[dict]:
    return [
        {k: v for k, v in r.items() if k != "seconds"} for r in json.loads(path.read_text())["rows"]
    ]


def _records(run: Path) -> dict[str, dict]:
    # not the hidden temp files of a live writer (pathlib's glob matches them; they vanish)
    return {
        str(p.relative_to(run)): json.loads(p.read_text())
        for p in sorted(run.glob("videos/*/*-*.json"))
        if not p.name.startswith(".")
    }


def _videos(run: Path) -> dict[str, bytes]:
    return {
        str(p.relative_to(run)): p.read_bytes()
        for p in sorted(run.glob("videos/*/*"))
        if p.suffix in (".mkv", ".mp4") and not p.name.startswith(".")
    }


def _leftovers(run: Path) -> list[Path]:
    temps = [p for p in run.rglob(".*") if p.is_file()]
    return temps + list(run.glob("metrics/shards"))


def _partial_copy(run: Path, dest: Path, videos: tuple[str, ...]) -> None:
    """``dest``: the finished one-process ``run`` cut back to its manifest and the ``videos``
    folders (no scores, no report): what a run that made only those videos holds."""
    dest.mkdir(parents=True)
    shutil.copy2(run / "manifest.json", dest / "manifest.json")
    for vid in videos:
        shutil.copytree(run / "videos" / vid, dest / "videos" / vid)


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    root = tmp_path_factory.mktemp("torchrun")
    one = _jbkv(*EVAL, "--out", "one", "--json", "one.json", cwd=root, log=root / "one.log")
    assert one.returncode == 0, one.stderr
    two = _torchrun(*EVAL, "--out", "two", "--json", "two.json", cwd=root, log=root / "two.log")
    assert two.returncode == 0, two.stderr
    return root, two


def test_two_ranks_give_the_rows_and_videos_of_one_process(runs):
    root, two = runs
    assert _rows(root / "two.json") == _rows(root / "one.json")
    assert _videos(root / "two/tiny") == _videos(root / "one/tiny")
    a, b = _records(root / "one/tiny"), _records(root / "two/tiny")
    assert sorted(a) == sorted(b) and len(a) == VIDEOS
    for key in a:
        assert {k: v for k, v in a[key].items() if k not in RECORD_TIMING} == {
            k: v for k, v in b[key].items() if k not in RECORD_TIMING
        }, key
    assert not _leftovers(root / "two/tiny")
    assert _table_rows(two.stdout, "INT2 rtn g32 +taylor") == 1  # rank 0 alone prints the table


def test_both_ranks_worked_and_no_video_was_made_twice(runs):
    root, two = runs
    records = _records(root / "two/tiny").values()
    by_rank = Counter(r["rank"] for r in records)
    assert {r["world_size"] for r in records} == {2}
    assert set(by_rank) == {0, 1} and abs(by_rank[0] - by_rank[1]) <= 1
    m = re.search(r"(\d+) videos generated, 0 already done .* per rank: (\d+), (\d+)", two.stderr)
    assert m, two.stderr
    made = [int(m[2]), int(m[3])]
    assert int(m[1]) == sum(made) == VIDEOS  # every video made once, by exactly one rank
    assert made == [by_rank[0], by_rank[1]]
    one = _records(root / "one/tiny").values()
    assert {(r["rank"], r["world_size"]) for r in one} == {(0, 1)}


def _commits(log: Path) -> list[dict]:
    """The files a job committed, in order: rank, kind (record: a video is done; score: one
    video's scores, in its own file; metrics or shard: a variant's whole score file or a rank's
    shard, which jbkv no longer writes), variant, video name."""
    out = []
    for line in log.read_text().splitlines():
        e = json.loads(line)
        path = Path(e["path"])
        if "/metrics/shards/fidelity/" in e["path"]:
            kind = "shard"
        elif path.parent.name == "fidelity" and path.parent.parent.name == "metrics":
            kind = "metrics"
        elif path.parent.parent.name == "fidelity" and path.parent.parent.parent.name == "metrics":
            kind = "score"
        elif path.parent.parent.name == "videos" and path.suffix == ".json":
            kind = "record" if path.name != "variant.json" else "variant"
        else:
            continue
        vid = path.stem if kind == "metrics" else path.parent.name
        out.append(dict(rank=int(e["rank"]), kind=kind, vid=vid, name=path.stem))
    return out


def _scored_once(commits: list[dict]) -> Counter:
    """(variant, video) -> how often a rank saved its score; nothing else holds scores."""
    assert not [c for c in commits if c["kind"] in ("shard", "metrics")], "a whole-file rewrite"
    return Counter((c["vid"], c["name"]) for c in commits if c["kind"] == "score")


def test_ranks_score_while_generating_each_video_once_in_its_own_file(runs):
    root, _ = runs
    commits = _commits(root / "two.log")
    for rank in (0, 1):  # one rank's lines are in its program order
        kinds = [c["kind"] for c in commits if c["rank"] == rank]
        last_video = max(i for i, k in enumerate(kinds) if k == "record")
        assert "score" in kinds[:last_video], f"rank {rank} scored only after generating"
    scored = _scored_once(commits)
    assert len(scored) == VIDEOS * 2 // 3 and set(scored.values()) == {1}
    records = _records(root / "two/tiny")
    for c in commits:  # each video is scored by the rank that made it
        if c["kind"] == "score":
            assert records[f"videos/{c['vid']}/{c['name']}.json"]["rank"] == c["rank"]


def test_one_process_scores_each_video_right_after_making_it(runs):
    root, _ = runs
    commits = [c for c in _commits(root / "one.log") if c["kind"] in ("record", "score")]
    variants = [
        i for i, c in enumerate(commits) if c["kind"] == "record" and c["vid"] != "reference"
    ]
    assert len(variants) == VIDEOS * 2 // 3
    for i in variants:  # the next file committed is that video's score, in its own file
        made, scored = commits[i], commits[i + 1]
        assert scored["kind"] == "score", (made, scored)
        assert (scored["vid"], scored["name"]) == (made["vid"], made["name"]), (made, scored)
    assert set(_scored_once(_commits(root / "one.log")).values()) == {1}  # once each


def test_videos_made_but_not_scored_are_scored_on_resume(runs):
    """The INT2 videos of one process without their scores and without their references (what
    ``generate --bits 2 --no-reference`` makes): the state a kill between generating and
    scoring leaves. 2 ranks then make the references
    and the other variant, and score the INT2 videos once, waiting for references the other
    rank makes."""
    root, _ = runs
    _partial_copy(root / "one/tiny", root / "late/tiny", ("int2-rtn-g32",))
    r = _torchrun(*EVAL, "--out", "late", "--json", "late.json", cwd=root, log=root / "late.log")
    assert r.returncode == 0, r.stderr
    assert f"{VIDEOS * 2 // 3} videos generated, {VIDEOS // 3} already done" in r.stderr
    assert _rows(root / "late.json") == _rows(root / "one.json")
    scored = _scored_once(_commits(root / "late.log"))
    assert len(scored) == VIDEOS * 2 // 3 and set(scored.values()) == {1}
    assert not _leftovers(root / "late/tiny")


def _table_rows(stdout: str, label: str) -> int:
    """How many table rows of ``label`` (a row starts with it; summary lines name it later)."""
    return sum(line.startswith(label + " ") for line in stdout.splitlines())


def test_fidelity_on_two_ranks_matches_one_process(runs):
    root, _ = runs
    ref, test = root / "one/tiny/videos/reference", root / "one/tiny/videos/int2-rtn-g32"
    r = _torchrun("fidelity", ref, test, "--no-lpips", "--json", "fid.json", cwd=root)
    assert r.returncode == 0, r.stderr
    result = compare_dirs(ref, test, lpips=False)
    expected = result.to_dict() | {"statistics": fidelity_statistics(result.videos)}
    assert json.loads((root / "fid.json").read_text()) | {
        "thresholds": None,
        "violations": None,
    } == (expected | {"thresholds": None, "violations": None})
    assert r.stdout.count("mean ± SE") == 1


def _children(pid: int) -> list[int]:
    kids = []
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        if int(fields[1]) == pid:
            kids.append(int(stat.parent.name))
    return kids


def _rank_pid(agent: int, rank: int) -> int | None:
    for child in _children(agent):
        try:
            environ = Path(f"/proc/{child}/environ").read_bytes().split(b"\0")
        except OSError:
            continue
        if f"RANK={rank}".encode() in environ:
            return child
    return None


def _until_paused(marks: list[Path], proc: subprocess.Popen) -> Path | None:
    """Wait until a process of ``proc`` is held at ``PAUSE_AT`` (its mark exists; the caller
    kills it) and return that mark, or None when ``proc`` ended first."""
    deadline = time.monotonic() + 900
    while proc.poll() is None and time.monotonic() < deadline:
        for mark in marks:
            if mark.exists():
                return mark
        time.sleep(0.01)
    return None


def _pause_env(mark: Path) -> dict[str, str]:
    return _env() | {"JBKV_TEST_PAUSE": PAUSE_AT, "JBKV_TEST_PAUSE_FILE": str(mark)}


def test_kill_9_of_one_rank_then_one_process_resumes_to_identical_results(runs):
    root, _ = runs
    run = root / "killed/tiny"
    agent = subprocess.Popen(
        _torchrun_cmd(*EVAL, "--out", "killed"),
        cwd=root,
        env=_pause_env(root / "killed.pause"),
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
    )
    mark = _until_paused([root / f"killed.pause.rank{r}" for r in (0, 1)], agent)
    assert mark is not None, "the job ended before the kill"
    victim = _rank_pid(agent.pid, int(mark.name[-1]))
    assert victim is not None and agent.poll() is None, "the job ended before the kill"
    os.kill(victim, signal.SIGKILL)
    _, stderr = agent.communicate(timeout=900)
    assert agent.returncode != 0, stderr
    assert 0 < len(_records(run)) < VIDEOS, "the kill did not land mid-run"

    resumed = _jbkv(*EVAL, "--out", "killed", "--json", "killed.json", cwd=root)
    assert resumed.returncode == 0, resumed.stderr
    assert _rows(root / "killed.json") == _rows(root / "one.json")
    assert _videos(run) == _videos(root / "one/tiny")
    assert len(_records(run)) == VIDEOS
    assert not _leftovers(run)


def test_kill_9_of_one_process_then_two_ranks_resume_to_identical_results(runs):
    root, _ = runs
    run = root / "single/tiny"
    proc = subprocess.Popen(
        [JBKV, *EVAL, "--out", "single"],
        cwd=root,
        env=_pause_env(root / "single.pause"),
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    assert _until_paused([root / "single.pause"], proc), "the run ended before the kill"
    assert proc.poll() is None, "the run ended before the kill"
    proc.kill()
    proc.wait(timeout=900)
    made_alone = len(_records(run))
    assert 0 < made_alone < VIDEOS, "the kill did not land mid-run"

    resumed = _torchrun(*EVAL, "--out", "single", "--json", "single.json", cwd=root)
    assert resumed.returncode == 0, resumed.stderr
    assert _rows(root / "single.json") == _rows(root / "one.json")
    assert _videos(run) == _videos(root / "one/tiny")
    records = _records(run).values()
    assert len(records) == VIDEOS and not _leftovers(run)
    worlds = Counter(r["world_size"] for r in records)
    assert worlds[1] == made_alone and worlds[2] == VIDEOS - made_alone
    assert {r["rank"] for r in records if r["world_size"] == 2} == {0, 1}


def test_a_rank_that_cannot_write_fails_the_job_with_its_error(runs):
    """A directory where one video's record goes: that rank's write fails for real."""
    root, _ = runs
    gen = ["generate", *SMALL, "--bits", "2", "--out", "fail"]
    _partial_copy(root / "one/tiny", root / "fail", ("reference",))  # the references exist
    blocker = (
        root / "fail/videos/int2-rtn-g32/a blue square moves left on a light background-1.json"
    )
    blocker.mkdir(parents=True)
    r = _torchrun(*gen, cwd=root)
    assert r.returncode != 0
    # the ranks share one stderr: a rank's line may follow the other's unended progress text
    errors = re.findall(r"error: [^\n]*", r.stderr)
    failing = [ln for ln in errors if "Is a directory" in ln]
    assert len(failing) == 1, r.stderr
    assert re.fullmatch(
        r"error: rank [01]/2: cannot write .*background-1\.json: Is a directory", failing[0]
    )
    assert "timed out" not in r.stderr, "the other rank waited for a timeout instead of stopping"

    blocker.rmdir()  # one process finishes the job (2 ranks resume: the tests above)
    resumed = _jbkv(*gen, cwd=root)
    assert resumed.returncode == 0, resumed.stderr
    assert len(_records(root / "fail")) == VIDEOS * 2 // 3
    assert not _leftovers(root / "fail")


def test_sigterm_to_every_rank_is_one_line_each_and_exit_143(tmp_path):
    """What SLURM does on a time limit: every process of the job gets SIGTERM. Each rank is
    caught while a video's temp file exists (``JBKV_TEST_PAUSE``, synchronised on the files
    the ranks write there): each one removes it, prints one line and exits 143."""
    mark = tmp_path / "pause"
    env = _env() | {"JBKV_TEST_PAUSE": "writing:*.mkv", "JBKV_TEST_PAUSE_FILE": str(mark)}
    agent = subprocess.Popen(
        _torchrun_cmd("generate", *SMALL, "--out", "run"),
        cwd=tmp_path,
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
    )
    marks = [tmp_path / f"pause.rank{r}" for r in (0, 1)]
    deadline = time.monotonic() + 900
    while not all(m.exists() for m in marks) and agent.poll() is None:
        assert time.monotonic() < deadline, "the ranks never reached their first video write"
        time.sleep(0.01)
    ranks = [_rank_pid(agent.pid, r) for r in (0, 1)]
    assert None not in ranks and agent.poll() is None, "a rank ended before the signal"
    for pid in ranks:
        os.kill(pid, signal.SIGTERM)
    _, stderr = agent.communicate(timeout=900)
    assert agent.returncode != 0
    for r in (0, 1):  # the ranks share one stderr: a line may follow another's unended text
        line = f"error: rank {r}/2: interrupted (SIGTERM); completed files are kept, no partial"
        assert stderr.count(line) == 1, stderr
        assert f"traceback : rank {r}/2: interrupted (SIGTERM)" in stderr  # its error file
    assert stderr.count("error:") == 2, stderr
    assert len(re.findall(r"exitcode\s+:\s*143\b", stderr)) == 2, stderr  # torchrun's summary
    assert not _leftovers(tmp_path / "run"), "a rank left its temp file"
    assert not list((tmp_path / "run").rglob("*.mkv")), "a video being written was kept"


def test_report_prints_its_table_once(runs):
    root, _ = runs
    r = _torchrun("report", root / "one/tiny", cwd=root)
    assert r.returncode == 0, r.stderr
    assert _table_rows(r.stdout, "INT2 rtn g32 +taylor") == 1, r.stdout  # rank 0 alone reports
