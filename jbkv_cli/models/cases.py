"""Cases: what one video is generated from, and the case files that list them.

A :class:`Case` is a prompt, optionally a conditioning image and a camera trajectory (what
image- and action-conditioned models such as HY-WorldPlay read), and an id. Every model's
``generate`` takes a case (:class:`~jbkv_cli.models.contract.VideoModel`); a text-only model takes
a *prompt-only* case, the case a bare prompt makes (:meth:`Case.of`).

The run folder pairs videos by (case, seed): a case's :attr:`~Case.name` names its videos
(``{name}-{index}``, :func:`~jbkv_cli.run.directory.video_name`) and seeds its noise. A prompt-only
case's name is its prompt, so a run made from prompts names and seeds every video exactly as
before cases existed (``sha256(seed, prompt)``, :mod:`jbkv_cli.models.seeding`).

A case file (``--cases FILE``) is a CSV with a header; columns by name, any order:

    prompt | caption        the prompt (required)
    image | image_name | image_path   the conditioning image (optional)
    pose | trajectory       a pose string (``w-63``, ``w-3, right-1, d-4``) or a pose JSON file
    id                      the case's name (optional; see :func:`default_id`)

HY-WorldPlay's ``assets/test_case.csv`` (``image_name,caption``) is one; add a ``pose`` column
or give the model a default trajectory. A relative image or JSON path is looked up in the case
file's folder, then in the current directory (upstream's CSV lists ``./assets/img/1.png``
relative to its repository root). Every problem (no prompt column, two columns of one kind, an
unterminated quote, a control character or line break in a cell, an empty prompt, a missing
image, an id that cannot name a file, two cases of one name) is one usage error naming the
file and the line, before anything is created.
"""

from __future__ import annotations

import csv
import io
import unicodedata
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from jbkv_cli.utils.errors import JbkvError, UsageError, shown
from jbkv_cli.utils.jsonio import MAX_TEXT_BYTES, read_text

PROMPT_COLUMNS = ("prompt", "caption")
IMAGE_COLUMNS = ("image", "image_name", "image_path")
POSE_COLUMNS = ("pose", "trajectory")
MAX_CASES = 10_000


@dataclass(frozen=True)
class Case:
    """One video's inputs. ``image``: a path; ``trajectory``: a pose string or the path of a
    pose JSON (a string ending in ``.json``, upstream's rule); ``id``: the name of its videos
    (None: the prompt). ``plan``: what a model computed once for this case and the run keeps
    (HY-WorldPlay's memory index lists); ``sha256``: the digests of its files
    (:func:`jbkv_cli.run.fingerprints.case_digests`), which the run keeps to refuse a resume from
    changed files. Neither is part of the case's identity."""

    prompt: str
    image: str | None = None
    trajectory: str | None = None
    id: str | None = None
    plan: Any = field(default=None, compare=False, repr=False)
    sha256: Mapping[str, str] | None = field(default=None, compare=False, repr=False)

    @classmethod
    def of(cls, prompt: Case | str) -> Case:
        """``prompt`` as a case (a prompt-only one for a string)."""
        return prompt if isinstance(prompt, Case) else cls(prompt)

    @property
    def name(self) -> str:
        """What names this case's videos and seeds their noise: the id, else the prompt."""
        return self.id if self.id is not None else self.prompt

    @property
    def prompt_only(self) -> bool:
        """A bare prompt: no image, no trajectory, no id of its own."""
        return self.image is None and self.trajectory is None and self.id is None

    def to_dict(self) -> dict[str, Any]:
        """The case as JSON (without its plan), as run manifests and records keep it."""
        return {
            "prompt": self.prompt,
            "image": self.image,
            "trajectory": self.trajectory,
            "id": self.id,
        }

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> Case:
        """Inverse of :meth:`to_dict` (``plan`` and ``sha256`` keys are kept as such)."""
        return cls(
            data["prompt"],
            data.get("image"),
            data.get("trajectory"),
            data.get("id"),
            plan=data.get("plan"),
            sha256=data.get("sha256"),
        )


def as_cases(items: Iterable[Case | str]) -> list[Case]:
    """Cases from cases or prompts (a prompt makes a prompt-only case)."""
    return [Case.of(x) for x in items]


def default_id(image: str | None, trajectory: str | None, prompt: str) -> str | None:
    """The name of a case file's row without an ``id``: ``{image stem}`` and, with a
    trajectory, ``-{pose}`` (a pose string without spaces, or a pose JSON's stem), e.g.
    ``1-w-63``; None (the prompt names it) when the row has neither."""
    if image is None and trajectory is None:
        return None
    parts = [Path(image).stem] if image is not None else []
    if trajectory is not None:
        t = trajectory.strip()
        parts.append(Path(t).stem if t.endswith(".json") else "".join(t.split()))
    return "-".join(parts) or prompt


def _column(header: list[str], names: tuple[str, ...], path: Path) -> int | None:
    """The index of the header cell named one of ``names``; a usage error when two are."""
    lowered = [h.strip().lower() for h in header]
    found = [i for i, h in enumerate(lowered) if h in names]
    if len(found) > 1:
        both = ", ".join(header[i].strip() for i in found)
        raise UsageError(f"case file {path} has {len(found)} {names[0]} columns ({both}); keep one")
    return found[0] if found else None


_NOT_IN_CELLS = ("Cc", "Zl", "Zp")  # controls (NUL, tab, line breaks), line/paragraph separators


def _check_cell(text: str, column: str, source: str) -> None:
    """A cell is one line of text: no NUL, no line break (a quoted cell may hold one)."""
    bad = next((c for c in text if unicodedata.category(c) in _NOT_IN_CELLS), None)
    if bad is not None:
        raise UsageError(
            f"{source}: the {column} holds U+{ord(bad):04X} (a case file's cells hold no control "
            "characters or line breaks)"
        )


def _rows(text: str, path: Path) -> Iterator[tuple[int, list[str]]]:
    """(first line, cells) of each CSV row that is not blank; an unterminated quote or a stray
    one is a usage error naming its line."""
    reader = csv.reader(io.StringIO(text), strict=True)
    last = 0
    while True:
        try:
            row = next(reader)
        except StopIteration:
            return
        except csv.Error as exc:
            problem = "an unterminated quote" if "end of data" in str(exc) else str(exc)
            raise UsageError(f"{path} line {last + 1}: {problem}") from None
        first, last = last + 1, reader.line_num
        if any(cell.strip() for cell in row):
            yield first, row


def resolve_input(value: str, folder: Path, what: str, source: str) -> str:
    """The path of a case's image or pose JSON: ``value`` if absolute, else in ``folder``
    (the case file's), else in the current directory; a usage error when it is no file."""
    path = Path(value).expanduser()
    candidates = [path] if path.is_absolute() else [folder / path, Path.cwd() / path]
    for candidate in candidates:
        if candidate.is_file():
            return str(candidate.resolve())
    raise UsageError(f"{source}: {what} {shown(value)} is not a file")


def read_case_file(path: str | Path) -> list[Case]:
    """The cases of a CSV case file (module docstring); one usage error for any problem, naming
    the file and the line."""
    from jbkv_cli.run.directory import check_prompt  # runs imports this module

    path = Path(path)
    try:
        text = read_text(path, "case file", MAX_TEXT_BYTES)
    except JbkvError as exc:
        raise UsageError(str(exc)) from None
    rows = list(_rows(text, path))
    if not rows:
        raise UsageError(f"case file {path} is empty (a CSV with a header row)")
    (_, header), body = rows[0], rows[1:]
    p_col = _column(header, PROMPT_COLUMNS, path)
    if p_col is None:
        raise UsageError(
            f"case file {path} has no prompt column (one of: {', '.join(PROMPT_COLUMNS)})"
        )
    i_col, t_col, id_col = (
        _column(header, IMAGE_COLUMNS, path),
        _column(header, POSE_COLUMNS, path),
        _column(header, ("id",), path),
    )
    if not body:
        raise UsageError(f"case file {path} lists no cases")
    if len(body) > MAX_CASES:
        raise UsageError(f"case file {path} lists {len(body):,} cases; at most {MAX_CASES:,}")
    cases, seen = [], {}
    for n, row in body:
        source = f"{path} line {n}"
        for col, cell_text in enumerate(row):
            name = header[col].strip() if col < len(header) else f"column {col + 1}"
            _check_cell(cell_text, name or f"column {col + 1}", source)

        def cell(col: int | None, row: list[str] = row) -> str | None:
            if col is None or col >= len(row) or not row[col].strip():
                return None
            return row[col].strip()

        prompt = cell(p_col)
        if prompt is None:
            raise UsageError(f"{source}: empty prompt")
        image = cell(i_col)
        if image is not None:
            image = resolve_input(image, path.parent, "image", source)
        pose = cell(t_col)
        if pose is not None and pose.endswith(".json"):
            pose = resolve_input(pose, path.parent, "pose JSON", source)
        raw_image, raw_pose = cell(i_col), cell(t_col)
        case_id = cell(id_col) or default_id(raw_image, raw_pose, prompt)
        case = Case(prompt, image, pose, case_id)
        try:  # the name names its videos' files
            check_prompt(case.name)
        except UsageError as exc:
            if cell(id_col):
                what = "id"
            else:
                what = "prompt" if case.id is None else "id made from the image and pose"
            raise UsageError(f"{source}: {what} {str(exc).removeprefix('prompt ')}") from None
        if case.name in seen:
            raise UsageError(
                f"{source}: a second case named {shown(case.name)} (line {seen[case.name]}); "
                "give each row its own id"
            )
        seen[case.name] = n
        cases.append(case)
    return cases
