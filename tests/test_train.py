"""Training: tiny random models, a few steps each (the whole file runs in well under a minute on 2 cores)."""

from __future__ import annotations

import functools
import gzip
import json
import random
from pathlib import Path

import pytest
import torch
from transformers import (
    AutoModelForSeq2SeqLM,
    AutoModelForSequenceClassification,
    AutoTokenizer,
    BertConfig,
    BertModel,
    BertTokenizer,
)

from headprune.errors import ConfigError, DataError
from headprune.evaluation.batching import length_buckets
from headprune.train import (
    ClassifierData,
    ClassifierTrainSettings,
    TranslationTrainSettings,
    finetune_classifier,
    train_translation,
    translate,
)
from headprune.train.tokenizer import train_tokenizer
from shared_data import shared_file

M30K_FILES = ("train.en.gz", "train.fr.gz", "test_2016_flickr.en.gz", "test_2016_flickr.fr.gz")
LOG_KEYS = {"epoch", "global_step", "loss", "lr", "seconds", "examples_per_s"}
MT_EVAL_KEYS = {"tokens_per_s", "eval_nll", "eval_bleu", "bleu_signature", "eval_seconds", "eval_n"}

POS = "good great fine nice superb lovely".split()
NEG = "bad awful poor dull boring weak".split()
NOUNS = "movie film plot story cast acting".split()


@pytest.fixture(autouse=True, scope="module")
def _one_thread():
    """Tiny models gain nothing from a second thread, and on cores shared with other jobs it costs a lot."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


def _toy_sentiment(n: int, seed: int) -> tuple[list[str], list[int]]:
    rng = random.Random(seed)
    texts, labels = [], []
    for _ in range(n):
        y = rng.randrange(2)
        adj = rng.choice(POS if y else NEG)
        texts.append(f"the {rng.choice(NOUNS)} was {adj}")
        labels.append(y)
    return texts, labels


def _save_tiny_bert(d: Path, dropout: float) -> Path:
    """A tiny random BERT encoder (no head) + word-level tokenizer, saved like a pretrained checkpoint."""
    words = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", "the", "was", *POS, *NEG, *NOUNS]
    tok = BertTokenizer(vocab={w: i for i, w in enumerate(words)})
    torch.manual_seed(0)
    cfg = BertConfig(vocab_size=len(words), hidden_size=32, num_hidden_layers=2, num_attention_heads=4,
                     intermediate_size=64, max_position_embeddings=64,
                     initializer_range=0.2,  # large enough to leave the 0.693 plateau within a few steps
                     hidden_dropout_prob=dropout, attention_probs_dropout_prob=dropout)
    BertModel(cfg).save_pretrained(d)
    tok.save_pretrained(d)
    return d


@pytest.fixture(scope="module")
def bert_dir(tmp_path_factory) -> Path:
    return _save_tiny_bert(tmp_path_factory.mktemp("bert"), dropout=0.0)


@pytest.fixture(scope="module")
def bert_dropout_dir(tmp_path_factory) -> Path:
    """With dropout, so determinism and resuming also cover the dropout RNG."""
    return _save_tiny_bert(tmp_path_factory.mktemp("bert_dropout"), dropout=0.1)


def _cls_settings(**kw) -> ClassifierTrainSettings:
    base = dict(epochs=4, batch_size=8, lr=2e-3, warmup_ratio=0.1, max_length=16, progress=False)
    return ClassifierTrainSettings(**{**base, **kw})


def _state(model) -> dict[str, torch.Tensor]:
    return {k: v.detach().clone() for k, v in model.state_dict().items()}


def _assert_same_state(a: dict, b: dict) -> None:
    assert a.keys() == b.keys()
    diff = [k for k in a if not torch.equal(a[k], b[k])]
    assert not diff, f"tensors differ: {diff[:5]}"


# ---------------------------------------------------------------------------------- classifier
def test_finetune_classifier_learns_and_writes_hf_checkpoints(bert_dir, tmp_path):
    texts, labels = _toy_sentiment(48, seed=1)
    ev_texts, ev_labels = _toy_sentiment(16, seed=2)
    out = tmp_path / "run"
    data = ClassifierData(texts, labels, eval_texts=ev_texts, eval_labels=ev_labels, label_names=["neg", "pos"])
    res = finetune_classifier(bert_dir, None, data, settings=_cls_settings(), output_dir=out)
    assert [r["epoch"] for r in res.log] == [1, 2, 3, 4]
    assert res.log[-1]["loss"] < 0.6 * res.log[0]["loss"]
    assert res.log[-1]["eval_accuracy"] >= 0.75  # separable by one word
    assert res.final_dir == out / "final" and res.resumed_from_epoch == 0
    lines = [json.loads(x) for x in (out / "train_log.jsonl").read_text().splitlines()]
    assert lines == res.log
    for rec in lines:
        assert LOG_KEYS | {"eval_accuracy", "eval_loss", "eval_n", "eval_seconds"} <= rec.keys()
        assert rec["seconds"] > 0 and rec["examples_per_s"] > 0 and rec["eval_n"] == 16
    assert json.loads((out / "run.json").read_text())["num_labels"] == 2
    # every epoch and final reload as ordinary HF directories; only the newest keeps optimizer state
    batch = res.tokenizer(ev_texts[:4], return_tensors="pt", padding=True)
    for name in ("epoch-1", "epoch-2", "epoch-3", "epoch-4", "final"):
        m = AutoModelForSequenceClassification.from_pretrained(out / name)
        assert m.config.id2label == {0: "neg", 1: "pos"} and m.config.num_labels == 2
        reloaded = AutoTokenizer.from_pretrained(out / name)
        assert reloaded(ev_texts[0])["input_ids"] == batch["input_ids"][0].tolist()
        assert (out / name / "optimizer.safetensors").exists() == (name == "epoch-4")
    final = AutoModelForSequenceClassification.from_pretrained(out / "final").eval()
    with torch.no_grad():
        torch.testing.assert_close(final(**batch).logits, res.model.eval()(**batch).logits, rtol=0, atol=0)
    assert not any(p.is_symlink() for p in out.rglob("*"))


def test_classifier_is_deterministic_and_resumes_bit_exact(bert_dropout_dir, tmp_path):
    texts, labels = _toy_sentiment(24, seed=3)
    pairs = [t[::-1] for t in texts]  # exercise sentence pairs (token_type_ids)
    run = functools.partial(finetune_classifier, bert_dropout_dir, None, ClassifierData(texts, labels, text_pairs=pairs))
    s = _cls_settings(epochs=2, batch_size=6)
    a = run(settings=s, output_dir=tmp_path / "a")
    b = run(settings=s, output_dir=tmp_path / "b")
    _assert_same_state(_state(a.model), _state(b.model))
    c = run(settings=_cls_settings(epochs=2, batch_size=6, seed=1), output_dir=tmp_path / "c")
    assert not torch.equal(a.model.classifier.weight, c.model.classifier.weight)

    # stopped after epoch 1, then rerun with the same arguments: continues and ends identical
    d = run(settings=s, output_dir=tmp_path / "d", stop_after_epoch=1)
    assert d.final_dir is None and [p.name for p in d.checkpoints] == ["epoch-1"]
    d = run(settings=s, output_dir=tmp_path / "d")
    assert d.resumed_from_epoch == 1 and len(d.log) == 2 and d.final_dir is not None
    _assert_same_state(_state(a.model), _state(d.model))
    assert d.log[1]["loss"] == a.log[1]["loss"]
    again = run(settings=s, output_dir=tmp_path / "d")  # all done: nothing to train, same model back
    assert again.resumed_from_epoch == 2 and len(again.log) == 2
    _assert_same_state(_state(a.model), _state(again.model))

    with pytest.raises(ConfigError, match="lr=0.002 there, 0.001 now"):  # other settings refuse to resume
        run(settings=_cls_settings(epochs=2, batch_size=6, lr=1e-3), output_dir=tmp_path / "d")
    with pytest.raises(ConfigError, match="epochs"):  # the linear decay depends on the number of epochs
        run(settings=_cls_settings(epochs=3, batch_size=6), output_dir=tmp_path / "d")
    with pytest.raises(DataError, match="other data"):
        finetune_classifier(bert_dropout_dir, None, ClassifierData(texts[:-1], labels[:-1], text_pairs=pairs[:-1]),
                            settings=s, output_dir=tmp_path / "d")


def test_classifier_accepts_a_model_object(bert_dir, tmp_path):
    texts, labels = _toy_sentiment(12, seed=4)
    tok = AutoTokenizer.from_pretrained(bert_dir)
    torch.manual_seed(0)
    model = AutoModelForSequenceClassification.from_pretrained(bert_dir, num_labels=3)
    before = model.classifier.weight.detach().clone()
    one = _cls_settings(epochs=1)
    res = finetune_classifier(model, tok, ClassifierData(texts, labels, num_labels=3), settings=one,
                              output_dir=tmp_path / "o")
    assert res.model is model and not torch.equal(before, model.classifier.weight)
    assert AutoModelForSequenceClassification.from_pretrained(tmp_path / "o" / "final").config.num_labels == 3
    with pytest.raises(ConfigError, match="num_labels"):
        finetune_classifier(model, tok, ClassifierData(texts, labels), settings=one, output_dir=tmp_path / "p")
    with pytest.raises(ConfigError, match="tokenizer"):
        finetune_classifier(model, None, ClassifierData(texts, labels), settings=one, output_dir=tmp_path / "q")


@pytest.mark.parametrize(("kwargs", "error", "match"), [
    (dict(labels=[0, 1]), DataError, "labels must be a list of 4"),
    (dict(labels=[0, 1, 2, -1]), DataError, r"labels\[3\]"),
    (dict(labels=[0, 1, 1, 2], label_names=["a", "b"]), DataError, r"labels\[3\] must be an int in \[0, 1\]"),
    (dict(text_pairs=["x"]), DataError, "text_pairs must have 4"),
    (dict(texts=["a", "b", 3, "d"]), DataError, r"texts\[2\]"),
    (dict(eval_texts=["a"]), DataError, "together"),
    (dict(labels=[0, 0, 0, 0]), ConfigError, "num_labels must be an int >= 2"),
    (dict(stop_after_epoch=0), ConfigError, "stop_after_epoch"),
])
def test_classifier_input_errors(bert_dir, tmp_path, kwargs, error, match):
    args = dict(texts=["the movie", "the film", "the plot", "the cast"], labels=[0, 1, 0, 1])
    args.update(kwargs)
    stop = args.pop("stop_after_epoch", None)
    with pytest.raises(error, match=match):
        finetune_classifier(bert_dir, None, ClassifierData(**args), settings=_cls_settings(),
                            output_dir=tmp_path / "x", stop_after_epoch=stop)
    assert not (tmp_path / "x").exists()  # refused before anything is written


# ---------------------------------------------------------------------------------- translation
WORDS = "red blue green cat dog sun moon tree".split()


def _copy_task(n: int, seed: int) -> list[str]:
    rng = random.Random(seed)
    return [" ".join(rng.choice(WORDS) for _ in range(rng.randint(2, 5))) for _ in range(n)]


def _mt_settings(**kw) -> TranslationTrainSettings:
    base = dict(epochs=3, batch_size=16, lr=3e-3, warmup_steps=10, vocab_size=40, encoder_layers=2,
                decoder_layers=2, d_model=32, attention_heads=4, ffn_dim=64, max_length=12, dropout=0.0,
                progress=False)
    return TranslationTrainSettings(**{**base, **kw})


def test_train_tokenizer_round_trips(tmp_path):
    texts = _copy_task(50, seed=0) + ["Un homme à vélo, près d'un café."]
    for kind in ("bpe", "unigram"):
        tok = train_tokenizer(texts, 60, tmp_path / kind, kind=kind, min_frequency=1)
        assert [tok.pad_token_id, tok.unk_token_id, tok.bos_token_id, tok.eos_token_id] == [0, 1, 2, 3]
        ids = tok(texts[0])["input_ids"]
        assert ids[-1] == tok.eos_token_id and len(tok) <= 60
        for t in texts:
            assert tok.decode(tok(t)["input_ids"], skip_special_tokens=True) == t
        again = AutoTokenizer.from_pretrained(tmp_path / kind)
        assert again(texts[-1])["input_ids"] == tok(texts[-1])["input_ids"]
    with pytest.raises(ConfigError, match="vocab_size"):
        train_tokenizer(texts, 3)
    with pytest.raises(ConfigError, match="kind"):
        train_tokenizer(texts, 50, kind="wordpiece")
    with pytest.raises(DataError, match="non-empty"):
        train_tokenizer(["", " "], 50)


def test_train_translation_copy_task(tmp_path):
    src = _copy_task(96, seed=0)
    ev = _copy_task(8, seed=1)
    out = tmp_path / "mt"
    res = train_translation(src, src, settings=_mt_settings(), output_dir=out, eval_sources=ev,
                            eval_targets=ev)
    assert res.log[-1]["loss"] < res.log[0]["loss"]
    for rec in res.log:
        assert LOG_KEYS | MT_EVAL_KEYS <= rec.keys()
        assert 0 <= rec["eval_bleu"] <= 100 and "nrefs:1" in rec["bleu_signature"]
    assert res.log[-1]["eval_nll"] < res.log[0]["eval_nll"]
    assert (out / "tokenizer" / "tokenizer.json").is_file() and res.info["n_skipped_too_long"] == 0
    for name in ("epoch-1", "epoch-2", "epoch-3", "final"):
        model = AutoModelForSeq2SeqLM.from_pretrained(out / name)
        tok = AutoTokenizer.from_pretrained(out / name)
        assert model.config.decoder_start_token_id == tok.bos_token_id
        x = tok(ev[:2], return_tensors="pt", padding=True)
        gen = model.generate(**x, max_new_tokens=6)  # the saved generation config: greedy
        assert gen.shape[0] == 2 and gen.shape[1] <= 7 and (gen[:, 0] == tok.bos_token_id).all()
        assert all(isinstance(h, str) for h in tok.batch_decode(gen, skip_special_tokens=True))
    hyps = translate(res.model, res.tokenizer, ev, max_length=12)
    assert len(hyps) == len(ev)


def test_translation_same_seed_same_weights_and_resume(tmp_path):
    src, tgt = _copy_task(40, seed=2), _copy_task(40, seed=3)

    def settings(epochs: int) -> TranslationTrainSettings:  # with dropout, batches by token count
        return _mt_settings(epochs=epochs, dropout=0.1, max_tokens=48, batch_size=None)

    a = train_translation(src, tgt, settings=settings(2), output_dir=tmp_path / "a")
    b = train_translation(src, tgt, settings=settings(2), output_dir=tmp_path / "b")
    _assert_same_state(_state(a.model), _state(b.model))
    # epochs may grow on resume (inverse-sqrt schedule): one epoch, then a second call for epoch 2
    c1 = train_translation(src, tgt, settings=settings(1), output_dir=tmp_path / "c")
    assert c1.final_dir is not None
    c2 = train_translation(src, tgt, settings=settings(2), output_dir=tmp_path / "c")
    assert c2.resumed_from_epoch == 1
    _assert_same_state(_state(a.model), _state(c2.model))
    with pytest.raises(ConfigError, match="epochs must be >= 2"):
        train_translation(src, tgt, settings=settings(1), output_dir=tmp_path / "c")


def test_length_buckets_cover_every_index_once():
    lengths = [random.Random(i).randint(1, 30) for i in range(200)]
    by_count = length_buckets(lengths, rng=random.Random(0), sort_chunk=50, batch_size=7)
    by_tokens = length_buckets(lengths, rng=random.Random(0), sort_chunk=50, max_tokens=64)
    for batches in (by_count, by_tokens):
        assert sorted(i for b in batches for i in b) == list(range(200))
    assert all(len(b) <= 7 for b in by_count)
    assert all(len(b) * max(lengths[i] for i in b) <= 64 for b in by_tokens)
    unsorted = length_buckets(lengths, rng=random.Random(0), sort_chunk=1, batch_size=7)

    def padding(bs):
        return sum(len(b) * max(lengths[i] for i in b) - sum(lengths[i] for i in b) for b in bs)

    assert padding(by_count) < padding(unsorted) / 2


@pytest.mark.parametrize(("cls", "field", "value"), [
    (ClassifierTrainSettings, "lr", 0.0),
    (ClassifierTrainSettings, "lr", float("nan")),
    (ClassifierTrainSettings, "epochs", 0),
    (ClassifierTrainSettings, "batch_size", 0),
    (ClassifierTrainSettings, "warmup_ratio", 1.5),
    (ClassifierTrainSettings, "max_grad_norm", -1.0),
    (ClassifierTrainSettings, "max_length", 1),
    (ClassifierTrainSettings, "seed", -1),
    (ClassifierTrainSettings, "adam_betas", (0.9, 1.0)),
    (ClassifierTrainSettings, "epochs", True),
    (TranslationTrainSettings, "lr", -1e-3),
    (TranslationTrainSettings, "epochs", 0),
    (TranslationTrainSettings, "batch_size", 0),
    (TranslationTrainSettings, "label_smoothing", 1.0),
    (TranslationTrainSettings, "dropout", -0.1),
    (TranslationTrainSettings, "warmup_steps", 0),
    (TranslationTrainSettings, "d_model", 250),
    (TranslationTrainSettings, "vocab_size", 4),
    (TranslationTrainSettings, "tokenizer_kind", "wordpiece"),
])
def test_settings_validation_names_the_field(cls, field, value):
    with pytest.raises(ConfigError, match=rf"{cls.__name__}\.{field}=.*; allowed: "):
        cls(**{field: value})


def test_translation_settings_batching_and_presets():
    with pytest.raises(ConfigError, match="exactly one of batch_size and max_tokens"):
        TranslationTrainSettings(batch_size=None)
    with pytest.raises(ConfigError, match="exactly one of batch_size and max_tokens"):
        TranslationTrainSettings(max_tokens=4096)
    iwslt = TranslationTrainSettings.iwslt()
    shape = (iwslt.encoder_layers, iwslt.decoder_layers, iwslt.attention_heads, iwslt.d_model)
    assert shape == (6, 6, 8, 512) and iwslt.max_tokens == 4096 and iwslt.batch_size is None
    assert TranslationTrainSettings.iwslt(epochs=2).epochs == 2


@pytest.mark.shared_data(*(f"multi30k/{name}" for name in M30K_FILES))
def test_multi30k_smoke(tmp_path):
    multi30k = shared_file("multi30k")

    def read(name: str, n: int) -> list[str]:
        with gzip.open(multi30k / name, "rt", encoding="utf-8") as f:
            return [next(f).rstrip("\n") for _ in range(n)]

    en, fr = read("train.en.gz", 300), read("train.fr.gz", 300)
    ev_en, ev_fr = read("test_2016_flickr.en.gz", 20), read("test_2016_flickr.fr.gz", 20)
    s = _mt_settings(epochs=1, vocab_size=500, max_length=48, batch_size=32)
    res = train_translation(en, fr, settings=s, output_dir=tmp_path / "m30k", eval_sources=ev_en,
                            eval_targets=ev_fr)
    assert res.info["n_train"] + res.info["n_skipped_too_long"] == 300 and res.info["n_train"] > 250
    rec = res.log[0]
    assert rec["eval_n"] == 20 and 0 <= rec["eval_bleu"] <= 100 and rec["loss"] > 0
    assert res.tokenizer.decode(res.tokenizer(fr[0])["input_ids"], skip_special_tokens=True) == fr[0]
