"""Where the prompts come from, and how each (example, length bin, chunk size) is cut.

Sources (``--data``):

- ``longbench-pro``: ``longbench_pro.json`` of the Hugging Face dataset ``caskcsg/LongBench-Pro``
  (Apache-2.0), fetched on request by ``jbkv weights fetch longbench-pro`` at a pinned revision;
  the English samples only (``language == "English"``), as the paper uses; text = ``context``.
- ``synthetic``: documents of the embedded LM's language (:mod:`jbkv_cli.llm.tiny.corpus`),
  drawn from the seed on a stream disjoint from its training data.
- ``FILE.jsonl``: one record per line with a ``text`` (or ``context``) string; ``FILE.json``: a
  list of such records (LongBench-Pro's own file works: records with a ``language`` that is not
  English are skipped); any other file: plain UTF-8 text, cut into consecutive windows of the
  longest length the run needs (one example per window).

The protocol (paper §5.4 / App. O, where it is silent the choices are ours and stated here): for
length bin ``[lo, hi)`` and chunk size ``B``, an example's **cached prefix** has ``A`` tokens,
``A`` drawn uniformly in ``[lo, hi)`` from ``(seed, example, bin)`` alone (so every variant and
chunk size of that example and bin share it); the **current chunk** is the next ``B`` tokens;
the NLL is teacher-forced over the chunk's ``B`` next-token predictions (positions ``A … A+B−1``
predicting tokens ``A+1 … A+B``), so an example needs ``A + B + 1`` tokens. The bin is the
prefix length because that is what the cache holds; the paper's wording ("prompts truncated to
lengths drawn inside bins") leaves open whether it counts the chunk too. Examples are taken in a
seeded order, skipping those too short, until ``--examples`` are found per (bin, chunk size).
"""

from __future__ import annotations

import itertools
import re
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

from jbkv_cli.models.seeding import derive_seed
from jbkv_cli.utils.errors import JbkvError, UsageError, WeightsNotFoundError, shown
from jbkv_cli.utils.jsonio import parse_json, read_text

LONGBENCH = "longbench-pro"
SYNTHETIC = "synthetic"
LONGBENCH_ENTRY = "longbench-pro"  # the weights-manifest entry that fetches it
ENGLISH = ("english", "en")
CHARS_PER_TOKEN = 8  # text cut before tokenizing (then the whole text if that was too short)
MAX_SYNTHETIC = 100_000
MAX_DATA_BYTES = 4 * 2**30  # a --data file is read whole; LongBench-Pro's size is not pinned


@dataclass(frozen=True)
class Bin:
    """A prefix-length bin ``[lo, hi)``."""

    lo: int
    hi: int

    @property
    def name(self) -> str:
        return f"{self.lo}-{self.hi}"

    def draw(self, seed: int, example: str) -> int:
        """The prefix length of ``example`` in this bin: uniform in ``[lo, hi)``, from
        ``sha256(seed, example, bin)`` (stable across processes and runs)."""
        return self.lo + derive_seed(seed, f"{example}\0{self.name}") % (self.hi - self.lo)


def parse_bins(text: str) -> list[Bin]:
    """``"256-512,512-1024"`` -> bins; each ``1 <= lo < hi``, none overlapping."""
    bins = []
    for part in (p.strip() for p in text.split(",")):
        if not part:
            continue
        m = re.fullmatch(r"(\d+)\s*-\s*(\d+)", part)
        if not m or not 1 <= int(m[1]) < int(m[2]):
            raise UsageError(f"bad --bins {shown(text)}: use e.g. 256-512,512-1024 (1 <= lo < hi)")
        bins.append(Bin(int(m[1]), int(m[2])))
    if not bins:
        raise UsageError(f"bad --bins {shown(text)}: use e.g. 256-512,512-1024")
    bins = sorted(dict.fromkeys(bins), key=lambda b: (b.lo, b.hi))
    for a, b in itertools.pairwise(bins):
        if b.lo < a.hi:
            raise UsageError(f"--bins {a.name} and {b.name} overlap")
    return bins


def parse_sizes(text: str, what: str = "chunk-sizes") -> list[int]:
    """Positive integers, sorted, duplicates dropped."""
    try:
        sizes = [int(x) for x in text.split(",") if x.strip()]
    except ValueError:
        sizes = []
    if not sizes or any(s < 1 for s in sizes):
        raise UsageError(f"bad --{what} {shown(text)}: give positive token counts, e.g. 128,512")
    return sorted(set(sizes))


@dataclass(frozen=True)
class Document:
    """One source text: a file-safe ``key`` (names its records) and the text."""

    key: str
    text: str


_SAFE = re.compile(r"[^A-Za-z0-9_.-]+")


def safe_key(raw: str, index: int) -> str:
    """A file-safe, unique key for a record id (its index keeps it unique when cleaned)."""
    cleaned = _SAFE.sub("_", str(raw)).strip("._")[:48]
    return f"{index:05d}-{cleaned}" if cleaned else f"{index:05d}"


class Source:
    """Documents in a seeded order, tokenized on demand (each once)."""

    def __init__(
        self,
        name: str,
        documents: Callable[[], Iterator[Document]],
        description: str,
        fingerprint: str,
    ) -> None:
        self.name = name
        self._documents = documents
        self.description = description
        self.fingerprint = fingerprint  # what identifies the data in the run's settings

    def documents(self) -> Iterator[Document]:
        return self._documents()


def longbench_path() -> Path:
    """Where ``jbkv weights fetch longbench-pro`` puts the file (the manifest's destination)."""
    from jbkv_cli.weights import load_manifest

    entries = [e for e in load_manifest() if e.name == LONGBENCH_ENTRY]
    if not entries:
        raise JbkvError(f"the weights manifest has no {LONGBENCH_ENTRY!r} entry")
    return entries[0].destination()


def data_file(data: str) -> Path | None:
    """The file ``--data`` reads (None for the synthetic language, made in code)."""
    if data == SYNTHETIC:
        return None
    return longbench_path() if data == LONGBENCH else Path(data)


def open_source(data: str, seed: int, longest: int, *, embedded: bool) -> Source:
    """The source named by ``--data`` (see the module docstring). ``longest``: the most tokens
    one example needs (plain-text windows are cut that long)."""
    if data == SYNTHETIC:
        if not embedded:
            raise UsageError("--data synthetic is the embedded LM's language (--model tiny)")
        return _synthetic(seed, longest)
    if data == LONGBENCH:
        path = longbench_path()
        if not path.is_file():
            raise WeightsNotFoundError(
                f"LongBench-Pro is not downloaded ({path}); run `jbkv weights fetch "
                f"{LONGBENCH_ENTRY}` first (or give --data FILE)"
            )
        return _records(path, LONGBENCH, seed)
    path = Path(data)
    if not path.is_file():
        raise UsageError(
            f"--data {shown(data)} is neither {LONGBENCH}, {SYNTHETIC} nor a readable file"
        )
    if path.suffix.lower() in (".json", ".jsonl"):
        return _records(path, str(path.resolve()), seed)
    return _plain(path, longest, seed)


def _read_text(path: Path) -> str:
    """The file's UTF-8 text: a regular file of at most :data:`MAX_DATA_BYTES` (a FIFO or a
    device is refused without blocking, :mod:`jbkv_cli.utils.jsonio`); else one line naming it."""
    return read_text(path, "--data", MAX_DATA_BYTES)


def _file_fingerprint(path: Path) -> str:
    from jbkv_cli.weights.status import sha256_of

    return f"sha256:{sha256_of(path)}"


def _records(path: Path, name: str, seed: int) -> Source:
    """JSON list / JSONL records with ``text`` or ``context``; non-English records skipped."""
    raw = _read_text(path)
    if path.suffix.lower() == ".jsonl":
        lines = enumerate(raw.splitlines(), 1)
        items = [parse_json(ln, f"{path} line {n}", "--data") for n, ln in lines if ln.strip()]
    else:
        items = parse_json(raw, path, "--data")
    if not isinstance(items, list):
        raise JbkvError(f"--data {path}: expected a list of records (or one record per line)")
    docs = []
    for i, item in enumerate(items):
        if not isinstance(item, dict):
            raise JbkvError(f"--data {path}: record {i} is not an object")
        text = item.get("text", item.get("context"))
        if not isinstance(text, str):
            raise JbkvError(f"--data {path}: record {i} has no 'text' or 'context' string")
        language = item.get("language")
        if isinstance(language, str) and language.strip().lower() not in ENGLISH:
            continue
        docs.append(Document(safe_key(item.get("id", ""), i), text))
    if not docs:
        raise JbkvError(f"--data {path}: no English records with text")
    order = _seeded_order(len(docs), seed, path.name)  # stable when the file moves
    return Source(
        name,
        lambda: (docs[i] for i in order),
        f"{len(docs)} English records of {path.name}",
        _file_fingerprint(path),
    )


def _plain(path: Path, longest: int, seed: int) -> Source:
    """A plain text cut into consecutive windows (by characters here, by tokens later)."""
    text = _read_text(path)
    if not text.strip():
        raise JbkvError(f"--data {path} is empty")
    step = longest * CHARS_PER_TOKEN
    docs = [Document(f"c{start:010d}", text[start:]) for start in range(0, len(text), step)]
    order = _seeded_order(len(docs), seed, str(path.name))
    return Source(
        str(path.resolve()),
        lambda: (docs[i] for i in order),
        f"plain text {path.name}, windows of {step} characters",
        _file_fingerprint(path),
    )


def _synthetic(seed: int, longest: int) -> Source:
    from jbkv_cli.llm.tiny.corpus import eval_document

    def documents() -> Iterator[Document]:
        for i in range(MAX_SYNTHETIC):
            yield Document(f"synthetic-{i:05d}", eval_document(seed, i, longest))

    return Source(SYNTHETIC, documents, "synthetic documents (embedded LM language)", SYNTHETIC)


def _seeded_order(n: int, seed: int, name: str) -> list[int]:
    return sorted(range(n), key=lambda i: derive_seed(seed, f"{name}\0{i}"))


@dataclass(frozen=True)
class Example:
    """One teacher-forced job: ``ids`` hold ``prefix + chunk + 1`` tokens of ``document``."""

    document: str
    bin: Bin
    chunk: int
    prefix: int
    ids: tuple[int, ...]

    @property
    def key(self) -> str:
        """The record name: chunk size, bin, document (file-safe)."""
        return f"c{self.chunk}-b{self.bin.name}-{self.document}"


Tokenize = Callable[[str], list[int]]


def tokens_of(doc: Document, tokenize: Tokenize, need: int, cache: dict[str, list[int]]):
    """The first tokens of ``doc`` (at least ``need`` when the text has them), tokenized once."""
    ids = cache.get(doc.key)
    if ids is None or (len(ids) < need and cache.get(doc.key + "\0cut")):
        cut = doc.text[: need * CHARS_PER_TOKEN]
        ids = tokenize(cut)
        was_cut = len(cut) < len(doc.text)
        if len(ids) < need and was_cut:
            ids, was_cut = tokenize(doc.text), False
        cache[doc.key] = ids
        cache[doc.key + "\0cut"] = was_cut  # type: ignore[assignment]
    return ids


def select_examples(
    source: Source,
    tokenize: Tokenize,
    bins: list[Bin],
    chunks: list[int],
    per_cell: int,
    seed: int,
    *,
    scan_limit: int = 100_000,
) -> tuple[list[Example], dict[str, int]]:
    """``per_cell`` examples for every (bin, chunk size), in the source's seeded order; returns
    the examples and, per cell ``c{B}-b{bin}``, how many were found (fewer when the data runs
    out of long-enough documents)."""
    cache: dict[str, list[int]] = {}
    examples: list[Example] = []
    found: dict[str, int] = {}
    for chunk in chunks:
        for b in bins:
            got = 0
            for scanned, doc in enumerate(source.documents()):
                if got == per_cell or scanned >= scan_limit:
                    break
                prefix = b.draw(seed, doc.key)
                need = prefix + chunk + 1
                ids = tokens_of(doc, tokenize, need, cache)
                if len(ids) < need:
                    continue
                examples.append(Example(doc.key, b, chunk, prefix, tuple(ids[:need])))
                got += 1
            found[f"c{chunk}-b{b.name}"] = got
    return examples, found
