"""CompactVocab: exact round trips, UNK for inputs only, JSON persistence."""
from __future__ import annotations

import pytest
from hypothesis import given, strategies as st

from rl.errors import DataContractError, InputError, ParseError
from rl.vocab import CompactVocab

IM_START = 248045


def test_from_texts_keeps_specials_and_puts_unk_last() -> None:
    vocab = CompactVocab.from_texts(["ab", "ba c"], lambda text: [ord(ch) for ch in text], 248_320, extra_ids=[IM_START])
    assert vocab.num_known == 5  # a b c space im_start
    assert vocab.unk_id == vocab.size - 1 == 5
    assert vocab.decode(vocab.encode_targets([IM_START, ord("a")])) == [IM_START, ord("a")]
    assert vocab.encode_inputs([ord("z"), ord("a")]) == [vocab.unk_id, vocab.encode_targets([ord("a")])[0]]


def test_unknown_target_raises_and_unk_never_decodes() -> None:
    vocab = CompactVocab([5, 9, 11], 100)
    with pytest.raises(DataContractError, match="outside the compact vocabulary"):
        vocab.encode_targets([5, 6])
    with pytest.raises(DataContractError, match="UNK never decodes"):
        vocab.decode([vocab.unk_id])


@given(st.sets(st.integers(0, 999), min_size=1, max_size=50))
def test_roundtrip_and_order(ids: set[int]) -> None:
    vocab = CompactVocab(ids, 1000)
    ordered = sorted(ids)
    assert vocab.encode_targets(ordered) == list(range(len(ordered)))
    assert vocab.decode(range(len(ordered))) == ordered


def test_identity_has_no_unk() -> None:
    vocab = CompactVocab.identity(300)
    assert vocab.size == 300 and vocab.unk_id is None
    assert vocab.encode_inputs([0, 299]) == [0, 299] == vocab.decode([0, 299])
    with pytest.raises(DataContractError):
        vocab.encode_inputs([300])


def test_save_load(tmp_path) -> None:
    vocab = CompactVocab([3, 1, 2], 10)
    vocab.save(tmp_path / "vocab.json")
    assert CompactVocab.load(tmp_path / "vocab.json") == vocab
    CompactVocab.identity(50).save(tmp_path / "id.json")
    assert CompactVocab.load(tmp_path / "id.json").size == 50
    (tmp_path / "bad.json").write_text("{}")
    with pytest.raises(ParseError):
        CompactVocab.load(tmp_path / "bad.json")


def test_bad_construction() -> None:
    with pytest.raises(InputError):
        CompactVocab([], 10)
    with pytest.raises(InputError, match=r"\[0, 10\)"):
        CompactVocab([10], 10)
