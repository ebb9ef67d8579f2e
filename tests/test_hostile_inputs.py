"""Bad and hostile inputs, tried as a new user would: each is refused in one line (exit 2, no traceback),
the message names the real cause, and nothing is written. Every fixture is built here, on the spot."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
import torch
import transformers as T
from typer.testing import CliRunner

import headprune as hp
from headprune.cli import app
from headprune.core import load_tokenizer
from headprune.errors import ConfigError, DataError, UnsupportedModelError
from tiny import bert, llama, word_tokenizer

runner = CliRunner()
TEXTS = ["a good film", "a bad film", "not good at all", "very good indeed"] * 4


@pytest.fixture(scope="module")
def dirs(tmp_path_factory):
    """A sound classifier with its tokenizer, and broken copies of it."""
    root = tmp_path_factory.mktemp("hostile")
    tok = word_tokenizer(TEXTS)
    torch.manual_seed(0)
    model = bert()
    good = root / "good"
    model.save_pretrained(good)
    tok.save_pretrained(good)

    llama_over_bert = root / "llama_over_bert"  # a Llama config over BERT weights
    shutil.copytree(good, llama_over_bert)
    config = llama().config
    config.architectures = ["LlamaForCausalLM"]
    config.save_pretrained(llama_over_bert)

    headless = root / "headless"  # a classifier config over an encoder's weights: no classification head
    T.BertModel(model.config).save_pretrained(headless)
    tok.save_pretrained(headless)
    raw = json.loads((headless / "config.json").read_text())
    raw["architectures"] = ["BertForSequenceClassification"]
    (headless / "config.json").write_text(json.dumps(raw))

    bad_config = root / "bad_config"  # hidden size 32 with 5 heads: transformers refuses to build it
    shutil.copytree(good, bad_config)
    raw = json.loads((bad_config / "config.json").read_text())
    raw["num_attention_heads"] = 5
    (bad_config / "config.json").write_text(json.dumps(raw))

    pickled = root / "pickled"  # a pickle checkpoint whose unpickling would run code
    shutil.copytree(good, pickled)
    (pickled / "model.safetensors").unlink()
    torch.save({**model.state_dict(), "x": _Payload()}, pickled / "pytorch_model.bin")

    bad_tokenizer = root / "bad_tokenizer"
    shutil.copytree(good, bad_tokenizer)
    (bad_tokenizer / "tokenizer.json").write_text("{not json", encoding="utf-8")

    resized = root / "resized"  # the config says intermediate_size 40; the weights hold 37
    shutil.copytree(good, resized)
    raw = json.loads((resized / "config.json").read_text())
    raw["intermediate_size"] = 40
    (resized / "config.json").write_text(json.dumps(raw))

    bad_json = root / "bad_json"  # a config.json that is not JSON
    shutil.copytree(good, bad_json)
    (bad_json / "config.json").write_text("{oops", encoding="utf-8")

    data = root / "data.tsv"
    data.write_text("sentence\tlabel\n" + "".join(f"{t}\t{i % 2}\n" for i, t in enumerate(TEXTS)), encoding="utf-8")
    return root


class _Payload:
    def __reduce__(self):
        return (print, ("unpickled: code ran",))


def _commands(model_dir, data, out):
    task = ["--task", "classification", "--data", str(data)]
    return {
        "sites": ["sites", str(model_dir)],
        "prune": ["prune", str(model_dir), "--drop", '{"encoder.0.self": [0]}', "-o", str(out)],
        "compress": ["compress", str(model_dir), *task, "--allow-same-data", "--share", "0.25", "-o", str(out)],
        "evaluate": ["evaluate", str(model_dir), *task],  # writes nothing in any case
        "importance": ["importance", str(model_dir), *task, "-o", str(out)],
    }


def _refused(args, out, *messages):
    result = runner.invoke(app, args)
    assert result.exit_code == 2, result.output
    assert "Traceback" not in result.output and result.exception is None or isinstance(result.exception, SystemExit)
    # a refusal after work began follows that work's progress lines (headprune.progress): they are not the error
    lines = [line for line in result.output.splitlines() if line.strip() and not line.startswith("headprune: ")]
    assert len(lines) == 1 and lines[0].startswith("error: "), result.output
    for message in messages:
        assert message in result.output, result.output
    assert not out.exists(), f"{args[0]} wrote {out}"
    return result.output


@pytest.mark.parametrize("command", ["sites", "prune", "compress", "evaluate", "importance"])
@pytest.mark.parametrize("broken, keys", [
    ("llama_over_bert", ["21 newly initialised", "lm_head.weight", "model.embed_tokens.weight"]),
    ("headless", ["2 newly initialised", "classifier.bias", "classifier.weight"]),
])
def test_weights_that_do_not_match_the_config_are_refused_by_every_command(dirs, tmp_path, command, broken, keys):
    out = tmp_path / "out"
    args = _commands(dirs / broken, dirs / "data.tsv", out)[command]
    _refused(args, out, "weights do not match config.json", *keys)


def test_the_sound_model_passes_the_same_commands(dirs, tmp_path):
    """The fixture itself is sound: the refusals above are about the weights, not the command lines."""
    for command in ("sites", "evaluate"):
        out = tmp_path / command
        result = runner.invoke(app, _commands(dirs / "good", dirs / "data.tsv", out)[command])
        assert result.exit_code == 0, result.output


def test_library_load_refuses_newly_initialised_weights_and_names_them(dirs):
    with pytest.raises(DataError, match=r"21 newly initialised .*lm_head\.weight.* \(21 in all\).*41 keys"):
        hp.load_model(dirs / "llama_over_bert")
    with pytest.raises(DataError, match="classifier.bias, classifier.weight"):
        hp.load_pruned(dirs / "headless")


def test_weights_of_another_shape_are_refused_naming_both_shapes(dirs, tmp_path):
    with pytest.raises(DataError, match=r"6 of another shape in the weights \(bert.encoder.layer.0.intermediate.dense"
                                        r".bias \(37,\) vs \(40,\)"):
        hp.load_model(dirs / "resized")
    out = tmp_path / "out"
    _refused(_commands(dirs / "resized", dirs / "data.tsv", out)["prune"], out, "of another shape", "(37, 32) vs (40, 32)")


def test_training_replaces_a_head_for_another_number_of_labels(dirs, tmp_path):
    """The saved classifier has 3 labels, the data 2: train classifier draws a 2-label head and keeps the body."""
    out = tmp_path / "out"
    result = runner.invoke(app, ["train", "classifier", str(dirs / "good"), "--data", str(dirs / "data.tsv"),
                                 "--epochs", "1", "-o", str(out)])
    assert result.exit_code == 0, result.output
    trained = hp.load_model(out / "final")
    assert trained.config.num_labels == 2 and trained.classifier.out_features == 2


def test_a_fresh_head_only_when_asked_and_never_scored_as_trained(dirs):
    """``new_head=True`` allows the missing head (and only it: a Llama over BERT stays refused); the
    head is random, so evaluation refuses to report its accuracy."""
    from headprune.evaluation.classification import Classification
    from headprune.evaluation.data import ClassificationData

    model = hp.load_model(dirs / "headless", new_head=True)
    reference = T.BertModel.from_pretrained(dirs / "headless")
    assert torch.equal(model.bert.encoder.layer[0].attention.self.query.weight,
                       reference.encoder.layer[0].attention.self.query.weight)  # the body is the checkpoint's
    with pytest.raises(DataError, match="newly initialised"):
        hp.load_model(dirs / "llama_over_bert", new_head=True)
    data = ClassificationData(texts=TEXTS[:4], text_pairs=None, labels=["0", "1", "0", "1"], source="inline")
    task = Classification(load_tokenizer(dirs / "headless"), data, label2id={"0": 0, "1": 1})
    with pytest.raises(ConfigError, match="new, untrained head .*classifier"):
        task.evaluate(model)


@pytest.mark.parametrize("broken, error, message", [
    ("bad_config", UnsupportedModelError, "cannot build the model its config.json describes (ValueError: The "
     "hidden size (32) is not a multiple of the number of attention heads (5))"),
    ("pickled", DataError, "a pickle checkpoint (pytorch_model.bin) that torch refuses to load safely"),
])
def test_load_failures_are_one_typed_line(dirs, tmp_path, capsys, broken, error, message):
    with pytest.raises(error) as e:
        hp.load_model(dirs / broken)
    assert message in str(e.value) and "\n" not in str(e.value)
    assert "code ran" not in capsys.readouterr().out  # the pickle was never run
    out = tmp_path / "out"
    _refused(_commands(dirs / broken, dirs / "data.tsv", out)["prune"], out, message)
    assert "code ran" not in capsys.readouterr().out


@pytest.mark.parametrize("command", [["sites", "{m}"], ["evaluate", "{m}", "--task", "classification", "--data", "{d}"],
                                     ["train", "classifier", "{m}", "--data", "{d}", "-o", "{o}"],
                                     ["train", "classifier", "{m}", "--data", "{d}", "--max-length", "16", "-o", "{o}"]])
def test_a_config_that_is_not_json_is_named_as_the_config(dirs, tmp_path, command):
    out = tmp_path / "out"
    args = [a.format(m=dirs / "bad_json", d=dirs / "data.tsv", o=out) for a in command]
    text = _refused(args, out, "config.json in", "cannot be read as JSON")
    assert "tokenizer" not in text


def test_a_tokenizer_that_is_not_json_is_one_line(dirs, tmp_path):
    with pytest.raises(DataError, match="tokenizer in .*bad_tokenizer.* cannot be loaded"):
        load_tokenizer(dirs / "bad_tokenizer")
    out = tmp_path / "out"
    _refused(_commands(dirs / "bad_tokenizer", dirs / "data.tsv", out)["evaluate"], out, "cannot be loaded")


def test_a_file_given_as_the_model_directory_is_called_a_file(dirs, tmp_path):
    out = tmp_path / "out"
    text = _refused(["sites", str(dirs / "good" / "config.json")], out, "is a file, not a directory")
    assert "does not exist" not in text


def test_training_a_head_refuses_a_body_the_weights_do_not_hold(dirs, tmp_path):
    """``train classifier`` adds a fresh head on purpose; the encoder under it must still be the checkpoint's."""
    out = tmp_path / "out"
    _refused(["train", "classifier", str(dirs / "llama_over_bert"), "--data", str(dirs / "data.tsv"), "--epochs", "1",
              "-o", str(out)], out, "weights do not match config.json", "model.embed_tokens.weight")


# ---------------------------------------------------------------- selection: no silent answers


def test_select_heads_refuses_non_finite_scores():
    nan = {"encoder.0.self": torch.full((4,), float("nan")), "encoder.1.self": torch.rand(4)}
    with pytest.raises(ConfigError, match=r"scores\['encoder.0.self'\] holds 4 non-finite values"):
        hp.select_heads(nan, None, hp.Budget.of(n_drop=2))
    inf = {"encoder.0.self": torch.tensor([1.0, float("inf"), 2.0, 3.0])}
    with pytest.raises(ConfigError, match=r"head 1: inf"):
        hp.select_heads(inf, None, hp.Budget.of(fraction=0.5))


@pytest.mark.parametrize("mode, min_per_site", [("uniform", 0), ("groups", 0), ("uniform", 3), ("free", 3)])
def test_n_keep_keeps_exactly_n_or_names_the_nearest_feasible_counts(mode, min_per_site):
    """Brute force over the GQA layout (2 sites x 2 key/value groups x 3 query heads): uniform keeps k heads of
    every group of a site (2k per site), groups keeps whole groups (3 per group), free any number; min_per_site
    keeps at least that many per site. Any other count is refused, naming the nearest feasible ones."""
    import warnings

    model = llama()
    groups = hp.kv_groups(model)
    per_site = {"uniform": {0, 2, 4, 6}, "groups": {0, 3, 6}, "free": set(range(7))}[mode]
    per_site = {k for k in per_site if k >= min_per_site}
    feasible = {a + b for a in per_site for b in per_site}
    g = torch.Generator().manual_seed(0)
    scores = {site: torch.rand(len(kv), generator=g) for site, kv in groups.items()}
    for n in range(13):
        if n in feasible:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore", hp.errors.KVCacheWarning)  # free: uneven groups are its choice
                drop = hp.select_heads(scores, groups, hp.Budget.of(n_keep=n),
                                       hp.HeadRule(gqa=mode, min_per_site=min_per_site))
            assert 12 - sum(len(v) for v in drop.values()) == n
        else:
            near = " or ".join(str(k) for k in (max((k for k in feasible if k < n), default=None),
                                               min(k for k in feasible if k > n)) if k is not None)
            with pytest.raises(ConfigError, match=rf"n_keep={n}: cannot keep exactly {n} heads .*allowed: {near} \("):
                hp.select_heads(scores, groups, hp.Budget.of(n_keep=n),
                                hp.HeadRule(gqa=mode, min_per_site=min_per_site))


def test_n_keep_with_the_same_heads_per_site_keeps_a_multiple_of_the_sites():
    model = bert()  # 2 sites x 4 heads, no GQA: same_per_site keeps 2k heads
    g = torch.Generator().manual_seed(1)
    scores = {s.name: torch.rand(s.num_heads, generator=g) for s in hp.find_sites(model)}
    groups = hp.kv_groups(model)
    for n in (2, 4, 6):
        drop = hp.select_heads(scores, groups, hp.Budget.of(n_keep=n), hp.HeadRule(same_per_site=True))
        assert {4 - len(drop.get(site, [])) for site in scores} == {n // 2}
    with pytest.raises(ConfigError, match=r"n_keep=3: .*same_per_site=True keeps the same number in each of the 2 "
                                          r"sites\); allowed: 2 or 4 \("):
        hp.select_heads(scores, groups, hp.Budget.of(n_keep=3), hp.HeadRule(same_per_site=True))


def test_compress_n_keep_on_gqa_refuses_a_count_it_cannot_keep(tmp_path):
    model = T.LlamaForCausalLM(T.LlamaConfig(hidden_size=48, num_hidden_layers=2, num_attention_heads=6,
                                             num_key_value_heads=2, intermediate_size=37, max_position_embeddings=160,
                                             vocab_size=64, pad_token_id=0, bos_token_id=1, eos_token_id=2))
    texts = [f"the cat {w} on the mat and the dog ran far away" for w in ("sat", "lay", "slept", "ate")] * 6
    hp.save_pruned(model, tmp_path / "llama", word_tokenizer(texts))
    (tmp_path / "a.txt").write_text("\n".join(texts[:12]), encoding="utf-8")
    (tmp_path / "b.txt").write_text("\n".join(texts[12:]), encoding="utf-8")
    out = tmp_path / "out"
    _refused(["compress", str(tmp_path / "llama"), "--task", "lm", "--data", str(tmp_path / "a.txt"),
              "--calib-data", str(tmp_path / "b.txt"), "--n-keep", "5", "-o", str(out)], out,
             "cannot keep exactly 5 heads", "allowed: 4 or 6")


# ---------------------------------------------------------------- refusals name the flags typed


@pytest.mark.parametrize("args, message, library", [
    (["compress", "{good}", "--task", "classification", "--data", "{data}", "--allow-same-data", "--share", "0.5",
      "--min-per-site", "10"], "--share 0.5: --min-per-site 10 keeps more than that; allowed: a larger --share or a "
     "smaller --min-per-site", ["flops=", "min_per_site"]),
    (["ablate", "{good}", "--task", "classification", "--data", "{data}", "--resamples", "1"],
     "--resamples 1 is too few for 8 tests at --alpha 0.01", ["n_resamples"]),
    (["train", "classifier", "{good}", "--data", "{data}", "--epochs", "0"], "--epochs 0; allowed: an integer >= 1",
     ["Settings", "epochs="]),
])
def test_refusals_name_the_flags_not_the_library_parameters(dirs, tmp_path, args, message, library):
    out = tmp_path / "out"
    args = [a.format(good=dirs / "good", data=dirs / "data.tsv") for a in args] + ["-o", str(out)]
    text = _refused(args, out, message)
    assert not any(word in text for word in library), text


# ---------------------------------------------------------------- data files as users write them

ROWS = "sentence\tlabel\na good film\t1\nnot good at all\t0\n"


@pytest.mark.parametrize("encoding", ["utf-8", "utf-8-sig", "utf-16", "utf-32"])
def test_data_files_read_in_every_encoding_their_byte_order_mark_names(tmp_path, encoding):
    from headprune.evaluation.data import load_classification

    path = tmp_path / "d.tsv"
    path.write_bytes(ROWS.encode(encoding))  # Python's utf-16/utf-32 codecs write the mark
    data = load_classification(path)
    assert data.texts == ["a good film", "not good at all"] and data.labels == ["1", "0"]


@pytest.mark.parametrize("raw, library, cli", [
    (ROWS.encode("utf-16-le"), "line 1 holds NUL bytes, so it is not UTF-8 text; it looks like UTF-16-LE without a "
     "byte-order mark", "iconv -f utf-16le -t utf-8"),
    (ROWS.encode("utf-16-be"), "it looks like UTF-16-BE without a byte-order mark", "iconv -f utf-16be -t utf-8"),
    ("sentence\tlabel\ncaf\u00e9 ok\t1\n".encode("latin-1"), "not valid UTF-8 text (invalid continuation byte: byte "
     "0xe9 at offset 18, line 2; no byte-order mark)", "iconv -f cp1252 -t utf-8"),
])
def test_data_in_another_encoding_is_refused_naming_what_was_found(dirs, tmp_path, raw, library, cli):
    from headprune.evaluation.data import load_classification

    path = tmp_path / "d.tsv"
    path.write_bytes(raw)
    with pytest.raises(DataError) as e:
        load_classification(path)
    assert library in str(e.value)
    text = _refused(["evaluate", str(dirs / "good"), "--task", "classification", "--data", str(path)],
                    tmp_path / "out", library.split(";")[0], cli)
    assert "latin1" not in text


def test_a_field_longer_than_the_csv_module_limit_is_read(tmp_path):
    """csv's default limit is 131,072 characters per field; a long valid line is data, not an error."""
    from headprune.evaluation.data import load_classification

    long = "word " * 30000  # 150,000 characters
    tsv, quoted = tmp_path / "d.tsv", tmp_path / "d.csv"
    tsv.write_text(f"sentence\tlabel\n{long}\t1\nshort\t0\n", encoding="utf-8")
    quoted.write_text(f'sentence,label\n"{long}",1\nshort,0\n', encoding="utf-8")
    for path in (tsv, quoted):
        data = load_classification(path)
        assert data.texts == [long, "short"] and data.labels == ["1", "0"]
    import csv

    assert csv.field_size_limit() == 131072  # raised only while a row is read


def test_an_unclosed_quote_is_reported_where_it_opens_and_a_closed_one_spans_lines(dirs, tmp_path):
    from headprune.evaluation.data import load_classification

    ok = tmp_path / "ok.csv"
    ok.write_text('sentence,label\n"two\nlines",1\nnext,0\n', encoding="utf-8")
    assert load_classification(ok).texts == ["two\nlines", "next"]
    bad = tmp_path / "bad.csv"
    bad.write_text('sentence,label\n"never closed,1\nsecond,0\nthird,1\n', encoding="utf-8")
    with pytest.raises(DataError, match=r"line 2: a quoted field opens on this line and its quote is not closed "
                                        r"\(the row runs to line 4"):
        load_classification(bad)
    text = _refused(["evaluate", str(dirs / "good"), "--task", "classification", "--data", str(bad)],
                    tmp_path / "out", "line 2: a quoted field opens on this line")
    assert "no column" not in text and "line 3" not in text


def test_a_header_with_a_repeated_name_is_refused_as_a_duplicate(dirs, tmp_path):
    path = tmp_path / "d.tsv"
    path.write_text("sentence\tlabel\tsentence\na good film\t1\tb\n", encoding="utf-8")
    text = _refused(["evaluate", str(dirs / "good"), "--task", "classification", "--data", str(path)],
                    tmp_path / "out", "the header names column 'sentence' twice (positions 0, 2)")
    assert "--text-column" not in text and "no such column" not in text


# ---------------------------------------------------------------- what a newcomer sees is true and consistent


def test_help_shows_switches_as_switches():
    """``--json <bool>`` read as if it took a value (and ``--json true`` is refused: a switch takes none)."""
    for args in ([], ["sites"], ["compress"], ["evaluate"], ["train", "classifier"], ["demo"]):
        result = runner.invoke(app, [*args, "--help"], terminal_width=200)
        assert result.exit_code == 0, result.output
        assert "<bool>" not in result.output, args
        assert ("<path>" in result.output or "<str>" in result.output) or not args  # typed options keep their type
    result = runner.invoke(app, ["sites", "x", "--json", "true"])
    assert result.exit_code == 2  # a switch takes no value (click: unexpected extra argument)


def test_evaluate_prints_scores_in_the_format_every_command_uses(dirs):
    args = ["evaluate", str(dirs / "good"), "--task", "classification", "--data", str(dirs / "data.tsv")]
    text = runner.invoke(app, args)
    data = json.loads(runner.invoke(app, [*args, "--json"]).stdout)
    assert text.exit_code == 0, text.output
    lines = dict(line.split(": ", 1) for line in text.stdout.splitlines() if ": " in line)
    assert lines["accuracy"].split()[0] == f"{100 * data['score']:.2f}"  # 46.88, not 0.4688
    assert lines["matthews"] == f"{100 * data['extra']['matthews']:.2f}"


def test_progress_lines_go_to_a_terminal_only(monkeypatch):
    import io
    import sys

    from headprune.progress import note

    class Terminal(io.StringIO):
        def isatty(self):
            return True

    tty, pipe = Terminal(), io.StringIO()
    for stream in (tty, pipe):
        monkeypatch.setattr(sys, "stderr", stream)
        note("loading m ...")
        note("quiet m ...", show=False)
    assert tty.getvalue() == "headprune: loading m ...\n" and pipe.getvalue() == ""


def test_a_noisy_speed_up_is_not_printed_as_a_number():
    from headprune.bench.figures import bench_table

    class Result:
        runs = [{"model": m, "batch": 2, "examples_per_s": e, "examples_per_s_q25": e, "examples_per_s_q75": e,
                 "latency_s": 0.01} for m, e in (("a", 100.0), ("b", 232.0))]
        speedups = [{"model": "b", "reference": "a", "batch": 2, "measured": 2.3217, "measured_q25": 0.91,
                     "measured_q75": 3.9, "noisy": True, "ratio_of_medians": 2.3217, "flop_limit": 1.35,
                     "efficiency": 3.8}]
        settings = {"noisy_times": 0.1}

    table = bench_table(Result())
    row = next(line for line in table.splitlines() if line.startswith("b "))
    assert row.split()[6] == "noisy!" and "3.80" not in row and "1.350x" in row  # the limit stays, the speed-up goes
    Result.speedups[0]["noisy"] = False
    assert "2.322x" in bench_table(Result())


def test_compress_on_an_encoder_prints_no_empty_kv_cache_line(dirs, tmp_path):
    out = tmp_path / "out"
    result = runner.invoke(app, ["compress", str(dirs / "good"), "--task", "classification", "--data",
                                 str(dirs / "data.tsv"), "--allow-same-data", "--share", "0.5", "--no-bench", "-o",
                                 str(out)])
    assert result.exit_code == 0, result.output
    assert "KV cache per token" not in result.output and "0 -> 0 bytes" not in result.output
    assert "accuracy" in result.output


# ---------------------------------------------------------------- no deprecated transformers usage


def test_a_transformers_deprecation_reached_from_headprune_code_is_an_error():
    """The suite's own guard (conftest + pyproject filterwarnings): transformers logs some deprecations instead of
    warning (``out.past_key_values``); read from a headprune frame, they fail the test run."""
    import conftest

    code = compile("out.past_key_values", str(Path(conftest.SOURCE) / "bench" / "decode.py"), "eval")
    out = T.modeling_outputs.CausalLMOutputWithPast(logits=torch.zeros(1), **{_cache_key(): torch.ones(1)})
    T.utils.logging.get_logger("transformers.utils.generic").warning_once.cache_clear()
    with pytest.raises(FutureWarning, match="transformers: .*deprecated"):
        eval(code, {"__name__": "headprune.bench.decode"}, {"out": out})


def _cache_key() -> str:
    fields = T.modeling_outputs.CausalLMOutputWithPast.__dataclass_fields__
    return "cache" if "cache" in fields else "past_key_values"


def test_the_generated_cache_is_read_under_either_name():
    from headprune.bench.decode import cache_bytes, generated_cache

    model = llama().eval()
    out = model.generate(input_ids=torch.tensor([[5, 6, 7]]), max_new_tokens=2, do_sample=False, pad_token_id=0,
                         return_dict_in_generate=True)
    cache = generated_cache(out)
    by_hand = sum(t.numel() * t.element_size() for layer in cache.layers for t in (layer.keys, layer.values))
    assert by_hand > 0 and cache_bytes(cache) == by_hand
    assert generated_cache({"sequences": 1, "past_key_values": cache}) is cache  # an older transformers' output
    assert generated_cache({"sequences": 1}) is None


def test_weights_the_model_does_not_use_are_said_not_refused(dirs, caplog):
    """A base model from a classifier's directory leaves the head's weights out: nothing is random, so it loads,
    and the log names what was left out. Its weights are the checkpoint's (compared with transformers' own load)."""
    with caplog.at_level("WARNING", logger="headprune"):
        model = hp.load_pruned(dirs / "good", model_class=T.BertModel)
    assert "2 weights the model has no use for were left out (classifier.bias, classifier.weight)" in caplog.text
    reference = T.BertForSequenceClassification.from_pretrained(dirs / "good")
    assert torch.equal(model.encoder.layer[1].output.dense.weight, reference.bert.encoder.layer[1].output.dense.weight)


@pytest.mark.parametrize("speedup, shown", [
    ({"measured": 1.2, "flop_limit": 1.35}, "x1.20"),
    ({"measured": 1.2, "flop_limit": 1.35, "noisy": True}, "too noisy"),
    ({"measured": 1.2, "flop_limit": 1.35, "reliable": False}, "machine was busy"),
    ({"measured": 2.32, "flop_limit": 1.35}, "above the FLOP limit x1.35"),  # the demo's x2.32 vs a limit of 1.35
])
def test_headlines_never_quote_a_speed_up_their_record_marks_unreadable(speedup, shown):
    from headprune.bench.figures import speed_text

    text = speed_text(speedup)
    assert shown in text
    assert text.startswith("x") == (shown.startswith("x"))  # a bare number only when it may be quoted
