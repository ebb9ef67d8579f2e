"""``hp.text_batches``: the README's way from a tokenizer and a list of texts to the ``batches`` the library
scores on, checked against batches padded by hand and against the evaluator's own batches."""

from __future__ import annotations

import pytest
import torch
import transformers as T

import headprune as hp
from headprune.errors import ConfigError, DataError
from headprune.evaluation import Classification
from tiny import build, word_tokenizer

TEXTS = ["the film was good", "dull", "a very long and very dull plot that goes on and on", "fine cast",
         "great", "poor plot and bad cast"]
LABELS = [1, 0, 0, 1, 1, 0]


@pytest.fixture(scope="module")
def tok():
    return word_tokenizer(TEXTS)


@pytest.fixture(scope="module")
def model():
    torch.manual_seed(0)
    config = T.BertConfig(vocab_size=64, hidden_size=32, num_hidden_layers=2, num_attention_heads=4,
                          intermediate_size=37, max_position_embeddings=64, pad_token_id=0,
                          id2label={0: "negative", 1: "positive"})
    return T.BertForSequenceClassification(config).eval()


def _by_hand(tok, texts: list[str], max_length: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Each text alone, cut to max_length, padded on the right with the pad id: [B, longest]."""
    rows = [tok(t)["input_ids"][:max_length] for t in texts]
    longest = max(len(r) for r in rows)
    ids = torch.tensor([r + [tok.pad_token_id] * (longest - len(r)) for r in rows])
    mask = torch.tensor([[1] * len(r) + [0] * (longest - len(r)) for r in rows])
    return ids, mask


def test_batches_are_the_texts_in_order_truncated_and_padded(tok):
    batches = hp.text_batches(tok, TEXTS, LABELS, batch_size=4, max_length=5)
    assert [len(b["labels"]) for b in batches] == [4, 2]
    for batch, start in zip(batches, (0, 4), strict=True):
        ids, mask = _by_hand(tok, TEXTS[start:start + 4], 5)
        assert torch.equal(batch["input_ids"], ids) and torch.equal(batch["attention_mask"], mask)
        assert batch["labels"].tolist() == LABELS[start:start + 4] and batch["labels"].dtype == torch.long
    assert batches[0]["input_ids"].shape == (4, 5)  # the long text is cut to max_length
    assert "labels" not in hp.text_batches(tok, TEXTS)[0]  # a causal LM scores its own next tokens


def test_string_labels_through_a_mapping_or_the_models_config(tok, model):
    names = ["positive", "NEGATIVE", "negative", "Positive", "1", "0"]  # names in any case, or ids
    by_config = hp.text_batches(tok, TEXTS, names, label2id=model.config)
    assert by_config[0]["labels"].tolist() == LABELS
    by_map = hp.text_batches(tok, TEXTS, ["p", "n", "n", "p", "p", "n"], label2id={"n": 0, "p": 1})
    assert by_map[0]["labels"].tolist() == LABELS
    with pytest.raises(DataError, match=r"labels\[0\] = 'p' \(str\); allowed: a class id .* label2id="):
        hp.text_batches(tok, TEXTS, ["p", "n", "n", "p", "p", "n"])
    with pytest.raises(DataError, match="unknown label 'maybe' at row 2"):
        hp.text_batches(tok, TEXTS, ["p", "n", "maybe", "p", "p", "n"], label2id={"n": 0, "p": 1})


def test_importance_from_text_batches_equals_the_evaluators_batches(tok, model):
    """I_h is a mean over examples, so the in-order batches of text_batches and the evaluator's length-bucketed
    ones must give the same scores (the evaluator builds its batches with its own padding code)."""
    ours = hp.head_importance(model, hp.text_batches(tok, TEXTS, LABELS, batch_size=4))
    theirs = hp.head_importance(model, Classification(tok, (TEXTS, [str(y) for y in LABELS]), config=model.config,
                                                      batch_size=3).batches())
    for site in theirs:
        scale = float(theirs[site].abs().max())
        assert float((ours[site] - theirs[site]).abs().max()) <= 1e-5 * scale, site


def test_pairs_are_encoded_as_pairs_and_bad_input_is_named(tok):
    bert_tok = T.BertTokenizer(vocab={w: i for i, w in enumerate(["[PAD]", "[UNK]", "[CLS]", "[SEP]", "x", "y"])})
    batch = hp.text_batches(bert_tok, ["x", "x y x"], [1, 0], text_pairs=["y y", "y"])[0]
    for i, (a, b) in enumerate([("x", "y y"), ("x y x", "y")]):
        alone = bert_tok(a, b)
        n = len(alone["input_ids"])
        for key in ("input_ids", "token_type_ids"):
            assert batch[key][i, :n].tolist() == alone[key], key
        assert batch["attention_mask"][i].tolist() == [1] * n + [0] * (batch["input_ids"].shape[1] - n)
    with pytest.raises(DataError, match="text_pairs: 1 entries for 2 texts"):
        hp.text_batches(tok, TEXTS[:2], text_pairs=["x"])
    with pytest.raises(DataError, match="labels: 3 entries for 6 texts"):
        hp.text_batches(tok, TEXTS, [0, 1, 0])
    with pytest.raises(DataError, match=r"labels\[1\] = True \(bool\)"):
        hp.text_batches(tok, TEXTS[:2], [0, True])
    with pytest.raises(DataError, match=r"texts\[1\] = 3 \(int\)"):
        hp.text_batches(tok, ["a", 3])
    with pytest.raises(ConfigError, match="batch_size=0"):
        hp.text_batches(tok, TEXTS, batch_size=0)
    no_pad = word_tokenizer(TEXTS)
    no_pad.pad_token = None
    with pytest.raises(ConfigError, match="tokenizer has no pad token"):
        hp.text_batches(no_pad, TEXTS)


def test_batches_follow_the_device_asked_for(tok):
    model = build("gpt2")
    batches = hp.text_batches(tok, TEXTS, device=next(model.parameters()).device)
    assert all(v.device == next(model.parameters()).device for b in batches for v in b.values())
    scores = hp.head_importance(model, batches)  # a causal LM scores its own next tokens: no labels needed
    assert set(scores) == {s.name for s in hp.find_sites(model)}
