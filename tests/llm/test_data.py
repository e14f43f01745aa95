"""Prompts, bins and the deterministic cut of each (example, bin, chunk size)."""

from __future__ import annotations

import json

import pytest

from jbkv_cli.llm.data import Bin, open_source, parse_bins, parse_sizes, select_examples
from jbkv_cli.llm.tiny.corpus import CorpusConfig, answer_mask, document_ids, eval_document
from jbkv_cli.llm.tiny.tokenizer import build_tokenizer
from jbkv_cli.utils.errors import JbkvError, UsageError


def _words(text: str) -> list[int]:
    return [len(w) for w in text.split()]  # one "token" per word


def test_bins_parse_sort_and_refuse_overlaps():
    assert parse_bins("512-1024, 256-512") == [Bin(256, 512), Bin(512, 1024)]
    for bad in ("", "5", "3-3", "0-4", "a-b"):
        with pytest.raises(UsageError):
            parse_bins(bad)
    with pytest.raises(UsageError, match="overlap"):
        parse_bins("1-10,5-20")
    assert parse_sizes("512,128,128") == [128, 512]
    with pytest.raises(UsageError):
        parse_sizes("0")


def test_prefix_length_is_uniform_in_the_bin_and_depends_on_seed_example_bin_only():
    b = Bin(100, 110)
    draws = [b.draw(0, f"doc{i}") for i in range(2000)]
    assert set(draws) == set(range(100, 110))  # every length of [lo, hi), nothing else
    counts = [draws.count(v) for v in range(100, 110)]
    assert max(counts) - min(counts) < 80  # ~200 each: uniform (binomial sd ~13)
    assert b.draw(0, "doc1") == Bin(100, 110).draw(0, "doc1")
    assert [b.draw(1, f"doc{i}") for i in range(50)] != draws[:50]


def test_examples_are_cut_deterministically_and_skip_short_documents(tmp_path):
    path = tmp_path / "d.jsonl"
    rows = [{"id": "short", "text": "a " * 50}, *({"text": "w " * 900} for _ in range(4))]
    path.write_text("\n".join(json.dumps(r) for r in rows))
    source = open_source(str(path), 0, 700, embedded=False)
    bins, chunks = [Bin(200, 300), Bin(300, 400)], [64, 128]
    picked, found = select_examples(source, _words, bins, chunks, 3, 0)
    again, _ = select_examples(open_source(str(path), 0, 700, embedded=False), _words, bins,
                               chunks, 3, 0)  # fmt: skip
    assert picked == again
    assert found == {"c64-b200-300": 3, "c64-b300-400": 3, "c128-b200-300": 3, "c128-b300-400": 3}
    for ex in picked:
        assert ex.bin.lo <= ex.prefix < ex.bin.hi
        assert len(ex.ids) == ex.prefix + ex.chunk + 1
        assert "short" not in ex.document
    assert len({ex.key for ex in picked}) == len(picked)


def test_records_filter_english_and_refuse_bad_files(tmp_path):
    path = tmp_path / "lb.json"
    data = [
        {"id": "a/1", "context": "x " * 10, "language": "English"},
        {"id": "b", "context": "y " * 10, "language": "Chinese"},
    ]
    path.write_text(json.dumps(data))
    docs = list(open_source(str(path), 0, 10, embedded=False).documents())
    assert [d.key for d in docs] == ["00000-a_1"]
    bad = tmp_path / "bad.json"
    bad.write_text("{")
    with pytest.raises(JbkvError, match=r"cannot read --data .*bad\.json: invalid JSON"):
        open_source(str(bad), 0, 10, embedded=False)
    lines = tmp_path / "bad.jsonl"  # jsonio's rules: the line is named, NaN is not a number
    lines.write_text('{"text": "a"}\n{"text": "b", "score": NaN}\n')
    with pytest.raises(JbkvError, match=r"bad\.jsonl line 2: invalid JSON .*NaN"):
        open_source(str(lines), 0, 10, embedded=False)
    bad.write_text(json.dumps([{"id": 1}]))
    with pytest.raises(JbkvError, match="no 'text'"):
        open_source(str(bad), 0, 10, embedded=False)


def test_plain_text_is_cut_into_windows(tmp_path):
    path = tmp_path / "book.txt"
    path.write_text("word " * 4000)
    docs = list(open_source(str(path), 0, 100, embedded=False).documents())
    assert len(docs) == -(-len(path.read_text()) // 800)
    assert sorted(d.key for d in docs)[0] == "c0000000000"


def test_synthetic_language_round_trips_through_its_tokenizer():
    cc = CorpusConfig()
    tok = build_tokenizer(cc)
    text = eval_document(0, 3, 300)
    ids = tok(text)["input_ids"]
    assert len(ids) == 301 and ids[0] == tok.bos_token_id
    assert tok.unk_token_id not in ids
    assert len(tok.get_vocab()) == cc.vocab_size


def test_answers_are_the_latest_binding_of_the_queried_key():
    import torch

    cc = CorpusConfig()
    ids = document_ids(3000, cc, torch.Generator().manual_seed(0))
    latest: dict[int, int] = {}
    answers = 0
    for t, tok in enumerate(ids):
        if cc.binding(0, 0) <= tok < cc.query(0):
            key, value = divmod(tok - cc.binding(0, 0), cc.values)
            latest[key] = value
        elif tok >= cc.answer(0):
            answers += 1
            assert cc.answer(latest[ids[t - 1] - cc.query(0)]) == tok
    assert answers == int(answer_mask(torch.tensor(ids), cc).sum()) > 100
