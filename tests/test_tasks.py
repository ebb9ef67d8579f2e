"""Evaluators on real data slices with tiny random models: mask == no mask, mask == prune, data order,
metrics == headprune.evaluation.metrics, BLEU == sacrebleu, bootstrap hooks, the `evaluate` command and its refusals."""

from __future__ import annotations

import copy
import json
from pathlib import Path

import numpy as np
import pytest
import sacrebleu
import torch
import transformers as T
from typer.testing import CliRunner

import headprune as hp
from headprune.cli import app
from headprune.errors import ConfigError, DataError
from headprune.evaluation import Classification, Translation, bleu_from_stats, metrics, significance
from headprune.evaluation.data import encode_labels, load_classification, load_parallel
from headprune.evaluation.translation import new_token_bound
from shared_data import shared_file, shared_root

SETS = {  # name -> (file, metric, rows)
    "sst2": ("sst2/dev.tsv", "accuracy", 48),
    "mrpc": ("mrpc/dev.tsv", "f1", 40),
    "cola": ("cola/dev.tsv", "matthews", 40),
}
EN, FR = "multi30k/test_2016_flickr.en.gz", "multi30k/test_2016_flickr.fr.gz"
DROP = {"encoder.0.self": [1], "encoder.1.self": [0, 2, 3]}
DROP_S2S = {"encoder.0.self": [1], "decoder.0.self": [0, 2], "decoder.1.cross": [3], "decoder.1.self": [1]}
runner = CliRunner()


@pytest.fixture(scope="module", autouse=True)
def one_thread():
    """Tiny models gain nothing from threads, and on a shared CPU extra threads cost 10x in contention."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


@pytest.fixture(scope="module")
def shared(tmp_path_factory) -> Path:
    """``$HEADPRUNE_SHARED_DATA`` (a missing file fails), or without it small generated files in the same
    layout and formats (GLUE TSVs, headerless CoLA, gzipped Multi30k), so these tests run on any clone."""
    if shared_root() is not None:
        for rel in [rel for rel, _, _ in SETS.values()] + [EN, FR]:
            shared_file(rel)
        return shared_file()
    return _generated(tmp_path_factory.mktemp("generated_shared"))


def _generated(root: Path) -> Path:
    """Random sentences over a small vocabulary, labels balanced: the shared files' formats, not their text."""
    import gzip
    import random

    rng = random.Random(0)
    words = ("the a man woman dog cat film story runs sits looks good bad very not red green on in at with "
             "park street water ball old young small big").split()
    mots = "le la un une homme femme chien chat court regarde rouge vert dans sur avec parc rue eau".split()

    def sentence(vocab, lo=4, hi=12):
        return " ".join(rng.choice(vocab) for _ in range(rng.randint(lo, hi)))

    for name in ("sst2", "mrpc", "cola", "multi30k"):
        (root / name).mkdir()
    (root / "sst2/dev.tsv").write_text("sentence\tlabel\n" + "".join(
        f"{sentence(words)} \t{i % 2}\n" for i in range(60)))
    (root / "mrpc/dev.tsv").write_text("\ufeffQuality\t#1 ID\t#2 ID\t#1 String\t#2 String\n" + "".join(
        f"{i % 2}\t{1000 + i}\t{2000 + i}\t{sentence(words)}\t{sentence(words)}\n" for i in range(60)))
    (root / "cola/dev.tsv").write_text("".join(f"src{i % 3}\t{(i // 2) % 2}\t{'' if i % 4 else '*'}\t"
                                               f"{sentence(words)}.\n" for i in range(60)))
    for rel, vocab in ((EN, words), (FR, mots)):
        rng.seed(1)
        with gzip.open(root / rel, "wt", encoding="utf-8") as f:
            f.write("".join(sentence(vocab).capitalize() + " .\n" for _ in range(30)))
    return root


@pytest.fixture(scope="module")
def sets(shared):
    data = {name: load_classification(shared / rel, limit=rows) for name, (rel, _, rows) in SETS.items()}
    data["multi30k"] = load_parallel(shared / EN, shared / FR, limit=16)
    return data


@pytest.fixture(scope="module")
def tok(sets):
    """A word-level tokenizer trained on the test slices: <pad> 0, <s> 1, </s> 2, <unk> 3."""
    from tokenizers import Tokenizer, models, pre_tokenizers, processors, trainers

    texts = [t for name in SETS for t in (*sets[name].texts, *(sets[name].text_pairs or []))]
    texts += sets["multi30k"].sources + sets["multi30k"].targets
    core = Tokenizer(models.WordLevel(unk_token="<unk>"))
    core.pre_tokenizer = pre_tokenizers.Whitespace()
    core.train_from_iterator(texts, trainers.WordLevelTrainer(
        vocab_size=300, special_tokens=["<pad>", "<s>", "</s>", "<unk>"], show_progress=False))
    core.post_processor = processors.TemplateProcessing(
        single="<s> $A </s>", pair="<s> $A </s> $B:1 </s>:1", special_tokens=[("<s>", 1), ("</s>", 2)])
    return T.PreTrainedTokenizerFast(tokenizer_object=core, pad_token="<pad>", bos_token="<s>", eos_token="</s>",
                                     unk_token="<unk>", model_input_names=["input_ids", "token_type_ids", "attention_mask"])


def ids(tok) -> dict:
    return dict(vocab_size=len(tok), pad_token_id=0, bos_token_id=1, eos_token_id=2)


def bert(tok, num_labels=2, seed=3):
    torch.manual_seed(seed)
    model = T.BertForSequenceClassification(T.BertConfig(
        hidden_size=32, num_hidden_layers=2, num_attention_heads=4, intermediate_size=37, num_labels=num_labels,
        max_position_embeddings=130, type_vocab_size=2, initializer_range=0.3, **ids(tok)))
    return model.eval()


def marian(tok, seed=0):
    torch.manual_seed(seed)
    model = T.MarianMTModel(T.MarianConfig(
        d_model=32, encoder_layers=2, decoder_layers=2, encoder_attention_heads=4, decoder_attention_heads=4,
        encoder_ffn_dim=37, decoder_ffn_dim=37, max_position_embeddings=128, decoder_start_token_id=0, init_std=0.3,
        **ids(tok)))
    return model.eval()


def same(a, b) -> None:
    """Identical evaluation results (scores, metrics and every per-example array)."""
    assert a.score == b.score and a.n == b.n and set(a.per_example) == set(b.per_example)
    for key in a.per_example:
        np.testing.assert_array_equal(a.per_example[key], b.per_example[key])
    assert {k: v for k, v in a.extra.items()} == {k: v for k, v in b.extra.items()}


# ---------------------------------------------------------------- classification


@pytest.mark.parametrize("name", list(SETS))
def test_classification_invariants_and_metrics(sets, tok, name):
    metric = SETS[name][1]
    data = sets[name]
    model = bert(tok)
    task = Classification(tok, data, config=model.config, metric=metric, batch_size=8, max_length=64)
    base = task.evaluate(model)
    same(base, task.evaluate(model, hp.ones_mask(model)))  # all-ones mask == no mask, bit for bit

    pred, label = base.per_example["pred"], base.per_example["label"]
    assert 0 < pred.mean() < 1  # both classes predicted: the metrics below are not degenerate
    np.testing.assert_array_equal(label, encode_labels(data.labels, model.config))  # data order
    np.testing.assert_array_equal(base.per_example["correct"], pred == label)
    assert base.extra["accuracy"] == metrics.accuracy(pred, label)
    assert base.extra["matthews"] == metrics.matthews_corrcoef(pred, label)
    assert base.extra["f1"] == metrics.f1_binary(pred, label)
    assert base.score == base.extra[metric] and base.metric == metric and base.n == len(data)
    assert base.tokens == sum(map(len, tok(data.texts, data.text_pairs, truncation=True, max_length=64)["input_ids"]))
    recorded = base.extra["signature"]["data"]  # the data by its own name or relative path, never this machine's
    assert recorded.endswith(Path(data.source).name) and not Path(recorded).is_absolute() and base.examples_per_s > 0

    masked = task.evaluate(model, hp.mask_from_heads(model, DROP))
    pruned = copy.deepcopy(model)
    hp.prune_heads(pruned, DROP)
    physical = task.evaluate(pruned)
    np.testing.assert_array_equal(masked.per_example["pred"], physical.per_example["pred"])
    np.testing.assert_allclose(masked.per_example["loss"], physical.per_example["loss"], atol=1e-5, rtol=0)
    assert masked.score == physical.score
    assert np.abs(masked.per_example["loss"] - base.per_example["loss"]).max() > 1e-4  # the mask did something

    boot = significance.paired_bootstrap_accuracy(base.per_example["correct"], masked.per_example["correct"],
                                           n_resamples=50)
    assert boot.score_a == base.extra["accuracy"] and boot.score_b == masked.extra["accuracy"]
    boot = significance.paired_bootstrap_classification(pred, masked.per_example["pred"], label, metric=metric,
                                                 n_resamples=50)
    assert boot.score_a == pytest.approx(base.score, abs=1e-12)


def test_classification_order_and_inputs(sets, tok):
    data = sets["mrpc"]
    model = bert(tok, seed=1)
    task = Classification(tok, data, config=model.config, batch_size=6, max_length=64)
    lengths = [len(f["input_ids"]) for f in task.features]
    assert lengths != sorted(lengths, reverse=True)  # the buckets really reorder the examples
    base = task.evaluate(model)
    with torch.no_grad():  # example 5 alone, through the model directly
        alone = model(**tok(data.texts[5], data.text_pairs[5], return_tensors="pt")).logits
    assert base.per_example["pred"][5] == alone.argmax(-1).item()
    perm = np.random.default_rng(0).permutation(len(data))
    shuffled = Classification(tok, ([data.texts[i] for i in perm], [data.labels[i] for i in perm],
                                    [data.text_pairs[i] for i in perm]), label2id={"0": 0, "1": 1},
                              batch_size=6, max_length=64)
    result = shuffled.evaluate(model)
    np.testing.assert_array_equal(result.per_example["pred"], base.per_example["pred"][perm])
    np.testing.assert_allclose(result.per_example["loss"], base.per_example["loss"][perm], atol=1e-5, rtol=0)
    assert result.score == base.score

    limited = task.evaluate(model, limit=10)
    assert limited.n == 10
    np.testing.assert_array_equal(limited.per_example["label"], base.per_example["label"][:10])
    batches = list(task.batches(limit=20))
    assert sum(len(b["labels"]) for b in batches) == 20 and all("token_type_ids" in b for b in batches)
    scores = hp.head_importance(model, task.batches(limit=20))
    assert set(scores) == {"encoder.0.self", "encoder.1.self"} and all(torch.isfinite(s).all() for s in scores.values())


# ---------------------------------------------------------------- translation


@pytest.mark.parametrize("beams", [1, 2])
def test_translation_invariants_bleu_and_bootstrap(sets, tok, beams):
    data = sets["multi30k"]
    model = marian(tok)
    task = Translation(tok, data, batch_size=6, num_beams=beams, max_new_tokens=10)
    base = task.evaluate(model)
    same(base, task.evaluate(model, hp.ones_mask(model)))
    hyps, refs = base.extra["hypotheses"], data.targets
    assert len(hyps) == len(data) and all(isinstance(h, str) for h in hyps) and any(hyps)
    assert base.score == sacrebleu.corpus_bleu(hyps, [refs]).score
    assert base.score == pytest.approx(bleu_from_stats(base.per_example["bleu_stats"]), abs=1e-9)
    assert base.extra["chrf"] == sacrebleu.corpus_chrf(hyps, [refs]).score
    assert base.extra["sacrebleu"].startswith("nrefs:1|case:mixed|eff:no|tok:13a|smooth:exp|version:")
    assert base.per_example["bleu_stats"].shape == (len(data), 10)

    mask = hp.mask_from_heads(model, DROP_S2S)
    masked = task.evaluate(model, mask)
    pruned = copy.deepcopy(model)
    hp.prune_heads(pruned, DROP_S2S)
    physical = task.evaluate(pruned)
    assert masked.extra["hypotheses"] == physical.extra["hypotheses"] and masked.score == physical.score
    np.testing.assert_array_equal(masked.per_example["bleu_stats"], physical.per_example["bleu_stats"])
    assert masked.extra["hypotheses"] != hyps  # the mask changed the translations

    boot = significance.paired_bootstrap_bleu(hyps, masked.extra["hypotheses"], task.references(), n_resamples=50)
    assert boot.score_a == pytest.approx(base.score) and boot.score_b == pytest.approx(masked.score)
    boot = significance.paired_bootstrap(base.per_example["bleu_stats"], masked.per_example["bleu_stats"],
                                  bleu_from_stats, n_resamples=50)
    assert boot.score_a == pytest.approx(base.score) and boot.score_b == pytest.approx(masked.score)


def test_translation_order_loss_and_importance(sets, tok):
    data = sets["multi30k"]
    model = marian(tok, seed=2)
    one = Translation(tok, data, batch_size=1, max_new_tokens=8).evaluate(model, limit=6)
    reverse = Translation(tok, (data.sources[:6][::-1], data.targets[:6][::-1]), batch_size=1,
                          max_new_tokens=8).evaluate(model)
    assert reverse.extra["hypotheses"] == one.extra["hypotheses"][::-1]
    np.testing.assert_array_equal(reverse.per_example["bleu_stats"], one.per_example["bleu_stats"][::-1])
    with torch.no_grad():  # sentence 3 alone, through generate directly
        alone = model.generate(tok(data.sources[3], return_tensors="pt")["input_ids"], max_new_tokens=8,
                               do_sample=False)
    assert one.extra["hypotheses"][3] == tok.decode(alone[0], skip_special_tokens=True).strip()
    assert new_token_bound(model, 20) == 40 and new_token_bound(model, 200) == 127  # 1.5 * 20 + 10; positions - 1

    task = Translation(tok, data, batch_size=5)
    nll = task.loss(model)
    assert nll.score == pytest.approx(nll.per_example["nll_sum"].sum() / nll.per_example["tokens"].sum())
    np.testing.assert_array_equal(nll.per_example["tokens"], [len(t) for t in tok(text_target=data.targets)["input_ids"]])
    same(nll, task.loss(model, hp.ones_mask(model)))
    pruned = copy.deepcopy(model)
    hp.prune_heads(pruned, DROP_S2S)
    np.testing.assert_allclose(task.loss(model, hp.mask_from_heads(model, DROP_S2S)).per_example["nll_sum"],
                               task.loss(pruned).per_example["nll_sum"], atol=1e-4, rtol=1e-6)
    batches = list(task.batches(limit=9))
    assert sum(len(b["labels"]) for b in batches) == 9 and any((b["labels"] == -100).any() for b in batches)
    scores = hp.head_importance(model, task.batches(limit=9))
    assert len(scores) == 6 and all(torch.isfinite(s).all() and s.sum() > 0 for s in scores.values())

    with pytest.raises(ConfigError, match=r"batched \[batch, heads\] mask"):
        task.evaluate(model, hp.ones_mask(model, batch=5))
    with pytest.raises(ConfigError, match="not an encoder-decoder"):
        task.evaluate(bert(tok))
    with pytest.raises(ConfigError, match="MarianMTModel is a generative model"):
        Classification(tok, sets["sst2"], label2id={"0": 0, "1": 1}).evaluate(model)


# ---------------------------------------------------------------- library refusals


@pytest.mark.parametrize("make, error, message", [
    (lambda tok, d: Classification(tok, d), ConfigError, "give config="),
    (lambda tok, d: Classification(tok, d, config=bert(tok, 3).config, metric="f1"), ConfigError, "has 3 labels"),
    (lambda tok, d: Classification(tok, d, label2id={"0": 0, "1": 1}, metric="auc"), ConfigError, "metric='auc'"),
    (lambda tok, d: Classification(tok, d, label2id={"0": 0, "1": 1}, batch_size=0), ConfigError, "batch_size=0"),
    (lambda tok, d: Classification(tok, (d.texts, d.labels[:3]), label2id={"0": 0, "1": 1}), DataError,
     "3 entries for 48 texts"),
    (lambda tok, d: Classification(tok, d, label2id={"neg": 0}), DataError, "unknown label '1'"),
    (lambda tok, d: Classification(tok, ([1, 2], ["0", "1"]), label2id={"0": 0, "1": 1}), DataError,
     r"texts\[0\] = 1 \(int\)"),
    (lambda tok, d: Translation(tok, (["a b"], ["c", "d"])), DataError, "1 sentences but targets has 2"),
    (lambda tok, d: Translation(tok, (["a"], ["b"]), num_beams=0), ConfigError, "num_beams=0"),
    (lambda tok, d: Translation(tok, (["a"], ["b"]), tokenize="moses"), ConfigError, "tokenize='moses'"),
])
def test_bad_library_input(sets, tok, make, error, message):
    with pytest.raises(error, match=message):
        make(tok, sets["sst2"])


def test_batched_mask_and_limit_refused(sets, tok):
    model = bert(tok)
    task = Classification(tok, sets["sst2"], config=model.config)
    with pytest.raises(ConfigError, match="batched"):
        task.evaluate(model, hp.ones_mask(model, batch=4))
    with pytest.raises(DataError, match="limit=0"):
        task.evaluate(model, limit=0)


# ---------------------------------------------------------------- the CLI


@pytest.fixture(scope="module")
def model_dirs(tmp_path_factory, tok):
    root = tmp_path_factory.mktemp("models")
    hp.save_pruned(bert(tok), root / "bert", tok)
    hp.save_pruned(marian(tok), root / "marian", tok)
    torch.manual_seed(0)
    gpt2 = T.GPT2LMHeadModel(T.GPT2Config(n_embd=32, n_layer=2, n_head=4, n_positions=64, **ids(tok)))
    hp.save_pruned(gpt2, root / "gpt2", tok)
    return root


def cli(*args):
    result = runner.invoke(app, ["evaluate", *map(str, args)])
    return result


def test_cli_evaluate_matches_the_library(shared, sets, tok, model_dirs):
    heads = '{"encoder.1.self": [0, 2]}'
    result = cli(model_dirs / "bert", "--task", "classification", "--data", shared / "cola/dev.tsv", "--limit", 40,
                 "--metric", "matthews", "--heads-off", heads, "--json")
    assert result.exit_code == 0, result.output
    out = json.loads(result.stdout)
    model = hp.load_pruned(model_dirs / "bert")
    want = Classification(tok, sets["cola"], config=model.config, metric="matthews").evaluate(
        model, hp.mask_from_heads(model, json.loads(heads)))
    assert out["score"] == want.score and out["n"] == 40 and out["metric"] == "matthews"
    assert out["signature"]["heads_off"] == json.loads(heads) and "transformers" in out["signature"]["versions"]
    assert out["examples_per_s"] > 0 and set(out["extra"]) == {"accuracy", "f1", "matthews"}

    result = cli(model_dirs / "marian", "--task", "translation", "--data", shared / EN, "--data2", shared / FR,
                 "--limit", 8, "--beams", 2, "--max-new-tokens", 8, "--json")
    assert result.exit_code == 0, result.output
    out = json.loads(result.stdout)
    want = Translation(tok, (sets["multi30k"].sources[:8], sets["multi30k"].targets[:8]), num_beams=2,
                       max_new_tokens=8).evaluate(
        hp.load_pruned(model_dirs / "marian"))
    assert out["score"] == want.score and out["extra"]["sacrebleu"] == want.extra["sacrebleu"]
    assert "hypotheses" not in out["extra"] and out["signature"]["num_beams"] == 2

    result = cli(model_dirs / "gpt2", "--task", "lm", "--data", "builtin:pydoc", "--limit", 3, "--block-size", 32)
    assert result.exit_code == 0, result.output
    assert result.stdout.startswith("perplexity: ") and "signature: task=lm, block_size=32, blocks=3" in result.stdout


@pytest.mark.parametrize("args, message", [
    (["--task", "classification", "--data", "{shared}/sst2/nope.tsv"], "does not exist"),
    (["--task", "classification", "--data", "{shared}/sst2/dev.tsv", "--label-column", "gold"],
     "--label-column 'gold': no such column"),  # the CLI's flag, not the library's label_column='gold
    (["--task", "classification", "--data", "{shared}/sst2/dev.tsv", "--label-column", "sentence"],
     "distinct labels"),  # every sentence a label: more than the model's num_labels=2
    (["--task", "classify", "--data", "{shared}/sst2/dev.tsv"], "--task 'classify'; allowed: classification"),
    (["--task", "classification", "--data", "{shared}/sst2/dev.tsv", "--data2", "x"], "--data2 does not apply"),
    (["--task", "classification", "--data", "{shared}/sst2/dev.tsv", "--heads-off", '{"encoder.7.self": [0]}'],
     "unknown site 'encoder.7.self'"),
    (["--task", "classification", "--data", "{shared}/sst2/dev.tsv", "--heads-off", '{"encoder.0.self": 1}'],
     "allowed: a list of head indices"),
    (["--task", "classification", "--data", "{shared}/sst2/dev.tsv", "--limit", "0"], "--limit 0 must be"),
    (["--task", "classification", "--data", "{shared}/sst2/dev.tsv", "--metric", "bleu"], "--metric 'bleu'; allowed"),
    (["--task", "translation", "--data", "{shared}/" + EN, "--data2", "{shared}/sst2/dev.tsv"],
     "parallel files differ in length"),
    (["--task", "lm", "--data", "builtin:pydoc"], "--task lm needs a causal language model"),
])
def test_cli_bad_input_one_line_exit_2(shared, model_dirs, args, message):
    model = model_dirs / ("marian" if "translation" in args else "bert")  # a model that fits: the data is wrong
    result = cli(model, *[a.replace("{shared}", str(shared)) for a in args])
    assert result.exit_code == 2, result.output
    assert message in result.stderr and "Traceback" not in result.output
    assert len(result.stderr.strip().splitlines()) == 1
