"""Data loading: every format on small files in tmp_path, every shared real set, and the bad-input errors."""

from __future__ import annotations

import gzip
import json
import sys
from pathlib import Path
from types import ModuleType, SimpleNamespace

import pytest

from headprune.errors import DataError
from headprune.evaluation.data import (
    ClassificationData,
    encode_labels,
    load_classification,
    load_parallel,
    load_text,
    python_docs_text,
)
from shared_data import shared_file


def write(path: Path, text: str, *, gz: bool = False, encoding: str = "utf-8") -> Path:
    data = text.encode(encoding)
    path.write_bytes(gzip.compress(data) if gz else data)
    return path


@pytest.fixture
def shared() -> Path:
    """``$HEADPRUNE_SHARED_DATA``: skipped when unset; a file missing under it fails the test that reads it."""
    return shared_file()


# ---------------------------------------------------------------- formats on small files


@pytest.mark.parametrize("gz", [False, True])
def test_tsv_with_header_and_limit(tmp_path, gz):
    path = write(tmp_path / ("d.tsv.gz" if gz else "d.tsv"), "sentence\tlabel\na good film \t1\n\nbad\t0\nok\t1\n", gz=gz)
    data = load_classification(path)
    assert data.texts == ["a good film ", "bad", "ok"] and data.labels == ["1", "0", "1"]
    assert (data.text_column, data.text_pair_column, data.label_column) == ("sentence", None, "label")
    assert data.text_pairs is None and data.source == str(path) and len(data) == 3
    assert load_classification(path, limit=2).texts == ["a good film ", "bad"]


def test_tsv_keeps_quotes_and_drops_bom(tmp_path):
    """MRPC: a BOM before the header and unbalanced quotes in the text (read with QUOTE_NONE)."""
    path = write(tmp_path / "mrpc.tsv", "\ufeffQuality\t#1 ID\t#2 ID\t#1 String\t#2 String\n"
                 '1\t1\t2\tHe said " yes .\tShe said " no "\n0\t3\t4\tA\tB\n')
    data = load_classification(path)
    assert data.texts == ['He said " yes .', "A"] and data.text_pairs == ['She said " no "', "B"]
    assert data.labels == ["1", "0"] and data.label_column == "Quality"


def test_headerless_cola_layout_is_detected(tmp_path):
    path = write(tmp_path / "cola.tsv", "gj04\t1\t\tThe dog barked.\ngj04\t0\t*\tDog the barked.\nc\t1\t\tYes.\n")
    data = load_classification(path)
    assert data.texts == ["The dog barked.", "Dog the barked.", "Yes."] and data.labels == ["1", "0", "1"]
    assert (data.text_column, data.label_column) == ("3", "1")
    by_index = load_classification(path, text_column=3, label_column=1)
    assert by_index.texts == data.texts and by_index.labels == data.labels


def test_integer_columns_on_a_headered_file(tmp_path):
    path = write(tmp_path / "d.tsv", "id\tsentence\tlabel\n0\tfine\tpos\n1\tbad\tneg\n")
    data = load_classification(path, text_column=1, label_column=2, header=True)
    assert data.texts == ["fine", "bad"] and data.labels == ["pos", "neg"] and data.label_column == "label"


@pytest.mark.parametrize("gz", [False, True])
def test_csv_with_quoted_commas(tmp_path, gz):
    path = write(tmp_path / ("d.csv.gz" if gz else "d.csv"),
                 'premise,hypothesis,label\n"A man, tall, walks.",A man walks.,entailment\nX,Y,neutral\n', gz=gz)
    data = load_classification(path)
    assert data.texts == ["A man, tall, walks.", "X"] and data.text_pairs == ["A man walks.", "Y"]
    assert data.labels == ["entailment", "neutral"]


@pytest.mark.parametrize("name", ["d.jsonl", "d.jsonl.gz", "d.json"])
def test_jsonl_drops_unlabelled_rows(tmp_path, name):
    rows = [{"sentence1": "a", "sentence2": "b", "gold_label": "neutral"},
            {"sentence1": "c", "sentence2": "d", "gold_label": "-"},
            {"sentence1": "e", "sentence2": "f", "gold_label": "entailment", "extra": 1}]
    path = write(tmp_path / name, "\n".join(json.dumps(r) for r in rows) + "\n\n", gz=name.endswith(".gz"))
    data = load_classification(path)
    assert data.texts == ["a", "e"] and data.text_pairs == ["b", "f"] and data.labels == ["neutral", "entailment"]
    assert data.dropped == 1


def test_json_array_and_int_labels(tmp_path):
    path = write(tmp_path / "d.json", json.dumps([{"text": "x", "label": 1}, {"text": "y", "label": 0}]))
    data = load_classification(path)
    assert data.texts == ["x", "y"] and data.labels == ["1", "0"]


def test_datasets_directory(tmp_path):
    import datasets  # the study extra installs it: this test must run, not skip
    features = datasets.Features({"sentence": datasets.Value("string"),
                                  "label": datasets.ClassLabel(names=["negative", "positive"])})
    ds = datasets.Dataset.from_dict({"sentence": ["good", "bad", "fine"], "label": [1, 0, 1]}, features=features)
    ds.save_to_disk(str(tmp_path / "single"))
    data = load_classification(tmp_path / "single", limit=2)
    assert data.texts == ["good", "bad"] and data.labels == ["1", "0"]
    datasets.DatasetDict({"train": ds, "validation": ds.select([2])}).save_to_disk(str(tmp_path / "dict"))
    assert load_classification(tmp_path / "dict", split="validation").texts == ["fine"]
    with pytest.raises(DataError, match=r"holds several splits \(train, validation\); pass split="):
        load_classification(tmp_path / "dict")


def fake_datasets(saved: dict) -> ModuleType:
    """A stand-in for the parts of `datasets` the loader uses (load_from_disk, DatasetDict, ClassLabel)."""

    class ClassLabel:
        pass

    class Dataset:
        def __init__(self, columns: dict, label_is_class: bool = True):
            self.column_names = list(columns)
            self.features = {k: ClassLabel() if k == "label" and label_is_class else object() for k in columns}
            self._rows = [dict(zip(columns, values, strict=True)) for values in zip(*columns.values(), strict=True)]

        def __iter__(self):
            return iter(self._rows)

    class DatasetDict(dict):
        pass

    module = ModuleType("datasets")
    module.ClassLabel, module.Dataset, module.DatasetDict = ClassLabel, Dataset, DatasetDict
    module.load_from_disk = lambda path: saved[Path(path).name](module)
    return module


def test_datasets_directory_with_a_stand_in_module(tmp_path, monkeypatch):
    saved = {
        "single": lambda m: m.Dataset({"sentence": ["good", "bad"], "label": [1, 0]}),
        "dict": lambda m: m.DatasetDict(train=m.Dataset({"question": ["q"], "sentence": ["s"], "label": [0]}),
                                        test=m.Dataset({"question": ["q2"], "sentence": ["s2"], "label": [-1]})),
    }
    for name in saved:
        (tmp_path / name).mkdir()
        (tmp_path / name / ("dataset_dict.json" if name == "dict" else "state.json")).write_text("{}")
    monkeypatch.setitem(sys.modules, "datasets", fake_datasets(saved))
    single = load_classification(tmp_path / "single")
    assert single.texts == ["good", "bad"] and single.labels == ["1", "0"]  # ClassLabel ids as strings
    train = load_classification(tmp_path / "dict", split="train")
    assert (train.texts, train.text_pairs, train.labels) == (["q"], ["s"], ["0"])
    assert load_classification(tmp_path / "dict", split="test").labels is None  # -1: datasets' "no label"
    with pytest.raises(DataError, match="split='dev' is not in .*; splits present: train, test"):
        load_classification(tmp_path / "dict", split="dev")
    with pytest.raises(DataError, match="split='train' given, but .* is a single dataset"):
        load_classification(tmp_path / "single", split="train")


def test_encode_labels_by_name_and_by_int():
    config = SimpleNamespace(label2id={"Entailment": 0, "NOT_ENTAILMENT": 1}, num_labels=2)
    assert encode_labels(["entailment", "not_entailment", "ENTAILMENT"], config) == [0, 1, 0]
    assert encode_labels(["0", "1", " 1"], config) == [0, 1, 1]
    assert encode_labels(["b", "a"], {"a": 0, "b": 1}) == [1, 0]


def test_encode_labels_with_a_transformers_config():
    transformers = pytest.importorskip("transformers")
    config = transformers.BertConfig(num_labels=3)  # label2id: LABEL_0..LABEL_2
    assert encode_labels(["2", "0", "label_1"], config) == [2, 0, 1]
    named = transformers.BertConfig(id2label={0: "negative", 1: "positive"})
    assert encode_labels(["Positive", "negative"], named) == [1, 0]


def test_parallel_two_files_and_tables(tmp_path):
    src = write(tmp_path / "s.de.gz", "hallo welt\n\nzwei\n", gz=True)
    tgt = write(tmp_path / "t.en", "hello world\r\n\ntwo\r\n")
    data = load_parallel(src, tgt)
    assert data.sources == ["hallo welt", "", "zwei"] and data.targets == ["hello world", "", "two"]
    assert load_parallel(src, tgt, limit=1).targets == ["hello world"]
    bare = write(tmp_path / "p.tsv", "a\tA\nb\tB\n")
    assert load_parallel(bare).sources == ["a", "b"] and load_parallel(bare).targets == ["A", "B"]
    named = write(tmp_path / "n.tsv", "id\tsrc\ttgt\n1\ta\tA\n")
    assert (load_parallel(named).sources, load_parallel(named).targets) == (["a"], ["A"])
    chosen = load_parallel(named, source_column="tgt", target_column=1)
    assert (chosen.sources, chosen.targets) == (["A"], ["a"])


def test_load_text_lines_and_paragraphs(tmp_path):
    path = write(tmp_path / "t.txt.gz", "First line\n  wrapped here.\n\n\nSecond para.\n", gz=True)
    assert load_text(path) == ["First line", "wrapped here.", "Second para."]
    assert load_text(path, unit="paragraph") == ["First line wrapped here.", "Second para."]
    assert load_text(path, limit=1) == ["First line"]


def test_python_docs_text_is_prose():
    paragraphs = python_docs_text()
    assert len(paragraphs) > 200 and sum(map(len, paragraphs)) > 50_000
    assert all(p.endswith(".") and ">>>" not in p and "  " not in p for p in paragraphs)
    short = python_docs_text(max_chars=1000)
    assert short == paragraphs[: len(short)] and 1000 <= sum(map(len, short)) < 1000 + max(map(len, short))


# ---------------------------------------------------------------- bad input


def test_missing_file(tmp_path):
    with pytest.raises(DataError, match=r"file '.*nope\.tsv' does not exist"):
        load_classification(tmp_path / "nope.tsv")


def test_missing_column_lists_columns(tmp_path):
    path = write(tmp_path / "d.tsv", "sentence\tlabel\nx\t1\n")
    with pytest.raises(DataError, match=r"label_column='gold'.*columns present: \['sentence', 'label'\]"):
        load_classification(path, label_column="gold")


def test_unguessable_text_column_lists_columns(tmp_path):
    path = write(tmp_path / "d.csv", "body,y\nx,1\n")
    with pytest.raises(DataError, match=r"cannot guess the text column.*\['body', 'y'\].*text_column="):
        load_classification(path)


def test_empty_after_dropping_unlabelled(tmp_path):
    path = write(tmp_path / "d.jsonl", '{"sentence": "a", "label": "-"}\n')
    with pytest.raises(DataError, match=r"holds no examples \(1 rows dropped for label '-'\)"):
        load_classification(path)
    with pytest.raises(DataError, match="is empty"):
        load_classification(write(tmp_path / "e.tsv", "\n"))


def test_unknown_label_names_value_row_and_allowed():
    with pytest.raises(DataError, match=r"unknown label 'maybe' at row 2 .*\['no', 'yes'\] or integer ids 0\.\.1"):
        encode_labels(["yes", "no", "maybe"], {"yes": 1, "no": 0})
    with pytest.raises(DataError, match="unknown label '2' at row 0"):  # int label out of range
        encode_labels(["2"], SimpleNamespace(label2id={"LABEL_0": 0, "LABEL_1": 1}, num_labels=2))
    with pytest.raises(DataError, match="no label column"):
        encode_labels(None, {"a": 0})


def test_parallel_length_mismatch_names_both_files(tmp_path):
    src, tgt = write(tmp_path / "a.de", "1\n2\n3\n"), write(tmp_path / "b.en", "1\n2\n")
    with pytest.raises(DataError, match=r"'.*a\.de' has 3 lines, '.*b\.en' has 2"):
        load_parallel(src, tgt, limit=1)  # counted over the whole files, not only the first `limit`


def test_bad_encoding_suggests_encoding_argument(tmp_path):
    path = write(tmp_path / "d.tsv", "sentence\tlabel\ncaf\u00e9\t1\n", encoding="latin-1")
    with pytest.raises(DataError, match=r"not valid UTF-8 text.*encoding="):
        load_classification(path)
    assert load_classification(path, encoding="latin-1").texts == ["caf\u00e9"]
    with pytest.raises(DataError, match="encoding='klingon'"):
        load_text(path, encoding="klingon")


def test_unsupported_suffix(tmp_path):
    path = write(tmp_path / "d.xlsx", "x")
    with pytest.raises(DataError, match=r"unsupported suffix '\.xlsx'; allowed: .*\.csv"):
        load_classification(path)


@pytest.mark.parametrize("limit", [0, -3, 1.5, True])
def test_bad_limit(tmp_path, limit):
    path = write(tmp_path / "d.tsv", "sentence\tlabel\nx\t1\n")
    with pytest.raises(DataError, match=f"limit={limit!r} must be a positive int"):
        load_classification(path, limit=limit)
    with pytest.raises(DataError, match="limit="):
        load_text(path, limit=limit)


def test_malformed_jsonl_names_line(tmp_path):
    path = write(tmp_path / "d.jsonl", '{"text": "a", "label": 1}\n\n{"text": "b", label: 0}\n')
    with pytest.raises(DataError, match=r"line 3: invalid JSON"):
        load_classification(path)


def test_jsonl_row_without_column_names_line(tmp_path):
    path = write(tmp_path / "d.jsonl", '{"text": "a", "label": 1}\n{"text": "b"}\n')
    with pytest.raises(DataError, match=r"line 2: no column 'label'"):
        load_classification(path)


def test_short_tsv_row_names_line(tmp_path):
    path = write(tmp_path / "d.tsv", "sentence\tlabel\nx\t1\ny\n")
    with pytest.raises(DataError, match=r"line 3: no column 'label' \(row has 1 fields\)"):
        load_classification(path)


def test_column_position_out_of_range_and_name_without_header(tmp_path):
    path = write(tmp_path / "cola.tsv", "gj04\t1\t\tThe dog barked.\n")
    with pytest.raises(DataError, match=r"text_column=7 is out of range .* 4 columns"):
        load_classification(path, text_column=7)
    with pytest.raises(DataError, match="names a column, but .* has no header row"):
        load_classification(path, header=False, text_column="sentence")


def test_not_gzip_and_not_a_datasets_dir(tmp_path):
    with pytest.raises(DataError, match="not a readable gzip file"):
        load_text(write(tmp_path / "t.txt.gz", "plain text"))
    (tmp_path / "folder").mkdir()
    with pytest.raises(DataError, match="is not a Hugging Face datasets directory"):
        load_classification(tmp_path / "folder")


def test_datasets_not_installed(tmp_path, monkeypatch):
    (tmp_path / "ds").mkdir()
    (tmp_path / "ds" / "dataset_info.json").write_text("{}")
    monkeypatch.setitem(sys.modules, "datasets", None)  # import datasets -> ImportError
    with pytest.raises(DataError, match="'datasets' package is not installed"):
        load_classification(tmp_path / "ds")


def test_classification_data_checks_lengths():
    with pytest.raises(DataError, match="labels has 1 entries but texts has 2"):
        ClassificationData(["a", "b"], None, ["1"], "x")


# ---------------------------------------------------------------- the shared real data sets


REAL_CLASSIFICATION = [
    # path, rows, (text, pair, label) columns, label set, dropped
    ("sst2/dev.tsv", 872, ("sentence", None, "label"), {"0", "1"}, 0),
    ("cola/dev.tsv", 1043, ("3", None, "1"), {"0", "1"}, 0),
    ("cola/cola_public_v1.1/dev_in_domain.tsv", 527, ("3", None, "1"), {"0", "1"}, 0),
    ("cola/cola_public_v1.1/dev_out_of_domain.tsv", 516, ("3", None, "1"), {"0", "1"}, 0),
    ("mrpc/dev.tsv", 408, ("#1 String", "#2 String", "Quality"), {"0", "1"}, 0),
    ("qnli/dev.tsv", 5463, ("question", "sentence", "label"), {"entailment", "not_entailment"}, 0),
    ("rte/dev.tsv", 277, ("sentence1", "sentence2", "label"), {"entailment", "not_entailment"}, 0),
    ("snli/test.jsonl.gz", 9824, ("sentence1", "sentence2", "gold_label"), {"entailment", "neutral", "contradiction"},
     176),
]


@pytest.mark.parametrize(("rel", "rows", "columns", "label_set", "dropped"), REAL_CLASSIFICATION)
def test_real_classification_sets(shared, rel, rows, columns, label_set, dropped):
    data = load_classification(shared / rel)
    assert len(data) == rows and data.dropped == dropped  # the official counts (shared/data/README.md)
    assert (data.text_column, data.text_pair_column, data.label_column) == columns
    assert set(data.labels) == label_set and all(t.strip() for t in data.texts)
    assert (data.text_pairs is None) == (columns[1] is None)


def test_real_mrpc_row_with_quotes_and_unlabelled_test(shared):
    data = load_classification(shared / "mrpc/dev.tsv", limit=1)
    assert data.text_pairs == ['" The foodservice pie business does not fit our long-term growth strategy .']
    test = load_classification(shared / "mrpc/test_unlabeled_glue_format.tsv", limit=5)
    assert test.labels is None and len(test) == 5 and test.text_pairs is not None
    snli = load_classification(shared / "snli/train_20k.jsonl.gz", limit=50)
    assert len(snli) == 50 and encode_labels(snli.labels, {"entailment": 0, "neutral": 1, "contradiction": 2})


@pytest.mark.parametrize(("src", "tgt", "rows", "first"), [
    ("multi30k/test_2016_flickr.en.gz", "multi30k/test_2016_flickr.fr.gz", 1000,
     ("A man in an orange hat starring at something.", "Un homme avec un chapeau orange regardant quelque chose.")),
    ("multi30k/test_2017_mscoco.en.gz", "multi30k/test_2017_mscoco.fr.gz", 461, None),
    ("iwslt14_de_en/valid.de", "iwslt14_de_en/valid.en", 7283, ("es ist diese pyramide .", "it &apos;s that pyramid .")),
    ("iwslt14_de_en/test.de", "iwslt14_de_en/test.en", 6750, None),
])
def test_real_parallel_sets(shared, tmp_path, src, tgt, rows, first):
    data = load_parallel(shared / src, shared / tgt, limit=20)
    assert len(data) == 20 and all(s.strip() and t.strip() for s, t in zip(data.sources, data.targets, strict=True))
    if first is not None:
        assert (data.sources[0], data.targets[0]) == first
    longer = write(tmp_path / "longer.txt", "x\n" * (rows + 1))
    with pytest.raises(DataError, match=f"has {rows} lines"):  # pins the full line count of the set
        load_parallel(shared / src, longer)


def test_real_text(shared):
    lines = load_text(shared / "iwslt14_de_en/test.en", limit=10)
    assert len(lines) == 10 and lines[0] and all("\n" not in line for line in lines)


def test_named_column_on_cola_file_is_not_overridden(tmp_path):
    path = write(tmp_path / "cola.tsv", "gj04\t1\t\tThe dog barked.\ngj04\t0\t*\tDog the barked.\n")
    with pytest.raises(DataError, match="text_column='sentence' names a column, but .* has no header row"):
        load_classification(path, text_column="sentence")


def test_json_record_that_is_not_an_object(tmp_path):
    path = write(tmp_path / "d.jsonl", '{"text": "a"}\n[1, 2]\n')
    with pytest.raises(DataError, match=r"line 2: no column 'text' \(row has a list, not an object\)"):
        load_classification(path)
