"""Recovery (headprune.compression.recover, ``headprune recover``): a run killed after a checkpoint and resumed
ends at the weights of an uninterrupted one, bit for bit; the loss it trains is the KL by torch's kl_div and
falls; the learning rate is the grid's best on the held-out blocks; refusals are one line with nothing written;
the saved model loads with headprune.load_pruned."""

from __future__ import annotations

import copy
import json
import math

import pytest
import torch
import torch.nn.functional as F
from typer.testing import CliRunner

import headprune as hp
from headprune.cli import app
from headprune.compression.recover import RecoverHooks, RecoverSettings, block_order, progress_line, recover
from headprune.errors import ConfigError
from llm_tiny import TEXTS, bpe_tokenizer, tiny_decoder


def _pair(seed: int = 0):
    """(teacher, pruned student): heads and neurons cut, then the weights moved off the teacher's a little."""
    teacher = tiny_decoder(layers=2, seed=seed)
    student = copy.deepcopy(teacher)
    hp.prune_heads(student, {hp.find_sites(student)[0].name: [0, 2]}, verify=False)
    hp.prune_neurons(student, {f.name: list(range(0, f.width, 2)) for f in hp.find_ffns(student)})
    g = torch.Generator().manual_seed(1)
    with torch.no_grad():
        for p in student.parameters():
            p.add_(0.2 * p.std().nan_to_num(0.0) * torch.randn(p.shape, generator=g))
    return teacher, student


def _blocks(n: int, t: int = 16, seed: int = 3) -> torch.Tensor:
    return torch.randint(0, 320, (n, t), generator=torch.Generator().manual_seed(seed))


SETTINGS = RecoverSettings(tokens=6 * 2 * 16, block_size=16, batch_size=2, lr="auto", lr_grid=(1e-4, 1e-3),
                           lr_steps=2, held_out_blocks=3, eval_every=64, checkpoint_every=0)


class Killed(Exception):
    pass


def test_a_run_killed_after_a_checkpoint_resumes_to_the_same_weights_bit_for_bit(tmp_path):
    teacher, pruned = _pair()
    train, held = _blocks(5), _blocks(3, seed=4)
    whole = copy.deepcopy(pruned)
    done = recover(whole, teacher, train, held, SETTINGS, directory=tmp_path / "whole")

    def kill(step):
        if step == 3:
            raise Killed

    cut = copy.deepcopy(pruned)
    with pytest.raises(Killed):
        recover(cut, teacher, train, held, SETTINGS, directory=tmp_path / "cut", hooks=RecoverHooks(on_checkpoint=kill))
    assert sorted(p.name for p in (tmp_path / "cut").iterdir()) == ["checkpoint-3", "recover.json"]
    resumed = copy.deepcopy(pruned)  # a fresh process: the pruned model as saved, the rest from the checkpoint
    again = recover(resumed, teacher, train, held, SETTINGS, directory=tmp_path / "cut")
    assert again.resumed_from == 3 and again.checkpoints == [4, 5, 6] and done.checkpoints == [1, 2, 3, 4, 5, 6]
    a, b = dict(whole.named_parameters()), dict(resumed.named_parameters())
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)
    assert again.log["losses"] == done.log["losses"] and len(done.log["losses"]) == 6
    assert [e["held_out_loss"] for e in again.log["evals"]] == [e["held_out_loss"] for e in done.log["evals"]]
    assert [e["tokens"] for e in done.log["evals"]] == [0, 64, 128, 192]
    assert not torch.equal(a["model.embed_tokens.weight"], dict(pruned.named_parameters())["model.embed_tokens.weight"])
    on_disk = json.loads((tmp_path / "cut" / "recover.json").read_text())
    assert on_disk["done"] and on_disk["losses"] == again.log["losses"]


def test_first_loss_is_the_kl_and_training_lowers_it_on_the_held_out_blocks():
    teacher, student = _pair()
    train, held = _blocks(6), _blocks(3, seed=4)
    settings = RecoverSettings(tokens=12 * 2 * 16, block_size=16, batch_size=2, lr=1e-3, held_out_blocks=3)
    first = train[block_order(6, settings.steps, 2, 0)[:2]]
    with torch.no_grad():  # the reference: torch's kl_div over every position of the first batch
        t, s = teacher(input_ids=first).logits, student(input_ids=first).logits
        want = float(F.kl_div(s.log_softmax(-1), t.log_softmax(-1), log_target=True, reduction="none").sum(-1).mean())

    def held_kl(model):
        with torch.no_grad():
            t, s = teacher(input_ids=held).logits, model(input_ids=held).logits
            return float(F.kl_div(s.log_softmax(-1), t.log_softmax(-1), log_target=True, reduction="batchmean"))

    before = held_kl(student)
    out = recover(student, teacher, train, held, settings)
    assert out.log["losses"][0] == pytest.approx(want, rel=1e-4)
    assert held_kl(student) < 0.9 * before  # never trained on these blocks
    assert sum(out.log["losses"][-3:]) < 0.8 * sum(out.log["losses"][:3])
    evals = out.log["evals"]
    assert [e["step"] for e in evals] == [0, 12]
    with torch.no_grad():  # the held-out loss is the model's own next-token loss
        own = float(student(input_ids=held, labels=held).loss)
    assert evals[-1]["held_out_loss"] == pytest.approx(own, rel=1e-5)
    assert evals[-1]["held_out_perplexity"] == pytest.approx(math.exp(own), rel=1e-5)
    assert not student.training


def test_auto_lr_keeps_the_grid_value_with_the_lowest_held_out_loss():
    teacher, student = _pair()
    out = recover(student, teacher, _blocks(5), _blocks(3, seed=4), SETTINGS)
    sel = out.log["lr_selection"]
    held = {float(k): v["held_out_loss"] for k, v in sel["grid"].items()}
    assert sorted(held) == [1e-4, 1e-3] and sel["chosen"] == min(held, key=held.get) == out.log["lr"]
    _, fresh = _pair()
    trial = recover(fresh, teacher, _blocks(5), _blocks(3, seed=4),  # the same steps at that lr, as a whole run
                    RecoverSettings(tokens=2 * 2 * 16, block_size=16, batch_size=2, lr=sel["chosen"],
                                    held_out_blocks=3))
    assert trial.log["evals"][-1]["held_out_loss"] == pytest.approx(held[sel["chosen"]], rel=1e-6)


def test_hidden_states_and_bfloat16_train_too():
    teacher, student = _pair()
    settings = RecoverSettings(tokens=4 * 2 * 16, block_size=16, batch_size=2, lr=1e-3, held_out_blocks=3,
                               hidden_weight=1.0, dtype="bfloat16")
    out = recover(student, teacher, _blocks(5), _blocks(3, seed=4), settings)
    assert all(math.isfinite(v) for v in out.log["losses"]) and out.log["evals"][-1]["held_out_loss"] < \
        out.log["evals"][0]["held_out_loss"]
    assert all(p.dtype == torch.float32 for p in student.parameters())


def test_lm_objective_trains_only_the_matched_parameters_on_the_texts_own_loss():
    teacher, student = _pair()
    train, held = _blocks(6), _blocks(3, seed=4)
    settings = RecoverSettings(tokens=4 * 2 * 16, block_size=16, batch_size=2, lr=1e-3, held_out_blocks=3,
                               objective="lm", train_only=r"mlp\.down_proj", eval_every=64)
    first = train[block_order(6, settings.steps, 2, 0)[:2]]
    with torch.no_grad():  # the reference: the model's own loss with labels
        want = float(student(input_ids=first, labels=first).loss)
    before = {n: p.detach().clone() for n, p in student.named_parameters()}
    grads = {n: p.requires_grad for n, p in student.named_parameters()}
    seen = []
    out = recover(student, teacher, train, held, settings, hooks=RecoverHooks(on_evaluation=seen.append))
    assert out.log["losses"][0] == pytest.approx(want, rel=1e-5)
    moved = {n for n, p in student.named_parameters() if not torch.equal(p, before[n])}
    assert moved and all("mlp.down_proj" in n for n in moved)
    assert seen == [e["step"] for e in out.log["evals"]] == [0, 2, 4]
    assert {n: p.requires_grad for n, p in student.named_parameters()} == grads  # restored


def test_an_evaluation_before_the_first_checkpoint_writes_the_log(tmp_path):
    teacher, student = _pair()
    settings = RecoverSettings(tokens=4 * 2 * 16, block_size=16, batch_size=2, lr=1e-3, held_out_blocks=3,
                               eval_every=64, checkpoint_every=3600)
    out = recover(student, teacher, _blocks(5), _blocks(3, seed=4), settings, directory=tmp_path / "new" / "run")
    on_disk = json.loads((tmp_path / "new" / "run" / "recover.json").read_text())
    assert on_disk["done"] and [e["step"] for e in on_disk["evals"]] == [e["step"] for e in out.log["evals"]] == [0, 2, 4]


@pytest.mark.parametrize(("kwargs", "message"), [
    ({"tokens": 31}, "tokens=31; allowed: an integer >= block_size x batch_size = 16 x 2 = 32"),
    ({"tokens": 0}, "tokens=0"), ({"lr": "fast"}, "lr='fast'"), ({"lr": -1.0}, "lr=-1.0"),
    ({"eval_every": 8}, "eval_every=8"), ({"dtype": "float16"}, "dtype='float16'"),
    ({"lr_grid": ()}, "lr_grid"), ({"lr_steps": 50}, "lr_steps=50"), ({"objective": "mse"}, "objective='mse'"),
    ({"objective": "lm", "hidden_weight": 1.0}, "hidden_weight=1.0"), ({"train_only": "(["}, "train_only='(\\['")])
def test_bad_settings_are_refused_naming_the_field(kwargs, message):
    with pytest.raises(ConfigError, match=message.replace("(", r"\(")):
        RecoverSettings(**{"tokens": 256, "block_size": 16, "batch_size": 2, **kwargs})


def test_a_teacher_with_another_vocabulary_and_other_settings_in_a_directory_are_refused(tmp_path):
    teacher, student = _pair()
    other = tiny_decoder(layers=2)
    other.resize_token_embeddings(300)
    with pytest.raises(ConfigError, match="vocabulary of 300 tokens, the pruned model's has 320"):
        recover(student, other, _blocks(5), _blocks(3), SETTINGS, directory=tmp_path / "r")
    assert not (tmp_path / "r").exists()
    recover(copy.deepcopy(student), teacher, _blocks(5), _blocks(3), SETTINGS, directory=tmp_path / "r")
    with pytest.raises(ConfigError, match="lr_steps=2 there, 1 now"):
        recover(student, teacher, _blocks(5), _blocks(3), RecoverSettings(**{**vars(SETTINGS), "lr_steps": 1}),
                directory=tmp_path / "r")


def test_progress_line_reads_tokens_rate_and_elapsed():
    log = {"step": 3, "tokens_per_step": 1024, "tokens": 10240, "seconds": 3725.2}
    assert progress_line(log, 2, 4.0) == "recover: 3,072/10,240 tokens (30%), 512 tokens/s, 1:02:05 elapsed"


def _saved(tmp_path):
    """A pruned model directory, its unpruned teacher's and a text file, as a user has them."""
    teacher, student = _pair()
    tok = bpe_tokenizer()
    teacher.save_pretrained(tmp_path / "teacher")
    tok.save_pretrained(tmp_path / "teacher")
    hp.save_pruned(student, tmp_path / "pruned", tokenizer=tok)
    text = tmp_path / "text.txt"
    text.write_text("\n".join(TEXTS * 12) + "\n")
    return tmp_path / "pruned", tmp_path / "teacher", text


def _args(pruned, teacher, text, out, *more):
    return ["recover", str(pruned), "--teacher", str(teacher), "--data", str(text), "--tokens", "96",
            "--block-size", "16", "--batch-size", "2", "--held-out-blocks", "2", "--lr", "1e-3", "--device", "cpu",
            "-o", str(out), *more]


def test_cli_recovers_resumes_a_finished_run_and_refuses_in_one_line(tmp_path):
    pruned, teacher, text = _saved(tmp_path)
    out = tmp_path / "out"
    runner = CliRunner()
    first = runner.invoke(app, _args(pruned, teacher, text, out))
    assert first.exit_code == 0, first.output
    assert "recover: 96/96 tokens (100%)" in first.stderr
    log = json.loads((out / "recover.json").read_text())
    assert log["done"] and log["step"] == 3 and log["lr"] == 1e-3
    model = hp.load_pruned(out / "model")
    x = torch.randint(0, 300, (1, 12), generator=torch.Generator().manual_seed(0))
    assert not torch.equal(model(input_ids=x).logits, hp.load_pruned(pruned)(input_ids=x).logits)
    listing = sorted(p.name for p in out.iterdir())
    again = runner.invoke(app, _args(pruned, teacher, text, out))  # finished: reported, nothing trained
    assert again.exit_code == 0 and "already" in again.stdout and sorted(p.name for p in out.iterdir()) == listing
    changed = runner.invoke(app, _args(pruned, teacher, text, out, "--seed", "1"))
    assert changed.exit_code == 2 and len(changed.stderr.strip().splitlines()) == 1
    assert "holds another run" in changed.stderr and "seed" in changed.stderr
    assert sorted(p.name for p in out.iterdir()) == listing


@pytest.mark.parametrize(("change", "message"), [
    (["--tokens", "20"], "--tokens 20; allowed: an integer >= --block-size x --batch-size = 16 x 2 = 32"),
    (["--lr", "soon"], "--lr 'soon'"),
    (["--teacher-vocab"], "vocabulary of 300 tokens")])
def test_cli_refusals_are_one_line_and_write_nothing(tmp_path, change, message):
    pruned, teacher, text = _saved(tmp_path)
    if change == ["--teacher-vocab"]:
        other = tiny_decoder(layers=2)
        other.resize_token_embeddings(300)
        other.save_pretrained(tmp_path / "other")
        teacher, change = tmp_path / "other", []
    out = tmp_path / "out"
    args = _args(pruned, teacher, text, out)
    for flag, value in zip(change[::2], change[1::2], strict=True):
        args[args.index(flag) + 1] = value
    result = CliRunner().invoke(app, args)
    assert result.exit_code == 2 and len(result.stderr.strip().splitlines()) == 1, result.output
    assert message in result.stderr
    assert not out.exists()


def test_compress_then_recover_in_one_command_and_its_refusals(tmp_path):
    teacher = tiny_decoder(layers=2)
    tok = bpe_tokenizer()
    teacher.save_pretrained(tmp_path / "teacher")
    tok.save_pretrained(tmp_path / "teacher")
    (tmp_path / "calib.txt").write_text("\n".join(TEXTS * 12) + "\n")
    (tmp_path / "eval.txt").write_text("\n".join(reversed(TEXTS * 4)) + "\n")
    args = ["compress", str(tmp_path / "teacher"), "--task", "lm", "--data", str(tmp_path / "eval.txt"),
            "--calib-data", str(tmp_path / "calib.txt"), "--share", "0.5", "--price", "count", "--compensate",
            "tune", "--no-bench", "--seq-len", "16", "--limit", "2", "--calib-limit", "4", "--batch-size", "2"]
    runner = CliRunner()
    for more, message in ((["--recover-tokens", "40"], "--recover-tokens 40; allowed: an integer >= --seq-len x 4 = 64"),):
        bad = runner.invoke(app, [*args, *more, "-o", str(tmp_path / "bad")])
        assert bad.exit_code == 2 and message in bad.stderr and not (tmp_path / "bad").exists(), bad.output
    out = tmp_path / "out"
    r = runner.invoke(app, [*args, "--recover-tokens", "128", "-o", str(out)])
    assert r.exit_code == 0, r.output
    log = json.loads((out / "recovered" / "recover.json").read_text())
    assert log["done"] and log["tokens"] == 128 and log["lr_selection"]["steps"] == 2
    again = runner.invoke(app, ["recover", str(out), "--teacher", str(tmp_path / "teacher"), "--data",
                                str(tmp_path / "calib.txt"), "--tokens", "128", "--block-size", "16", "--lr-steps",
                                "2", "-o", str(out / "recovered")])  # the command it prints: the same run
    assert again.exit_code == 0 and "already holds the finished recovery" in again.stdout, again.output
    assert hp.load_pruned(out / "recovered" / "model").config.vocab_size == 320
