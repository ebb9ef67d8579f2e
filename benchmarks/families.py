"""Every model type transformers 5 can build from a config, with headprune's verdict on it.

    python benchmarks/families.py                        # every type: a few minutes on 2 cores
    python benchmarks/families.py --quick                # a fixed, representative subset in seconds (CI)
    python benchmarks/families.py --only gpt_neox,vit    # these types, merged into the results file
    python benchmarks/families.py --write-readme docs/families.md   # the manual's table from the results file

For each model type in transformers' auto mappings: the most useful class (causal LM, else seq2seq
LM, else sequence classification, else base model; seq2seq LM first for an encoder-decoder, whose
causal-LM class is its decoder alone), built with random weights from a tiny config
(``benchmarks/tiny_configs.py``: the type's default config shrunk by generic rules), run once, then
``hp.find_sites`` and ``headprune.core.safety.verify.check_model``. Verdicts: ``exact`` (the checks it
passed), ``refused`` (why: the UnsupportedModelError headprune raises), ``not built`` (the tiny config
could not be built or run), ``no attention sites``, ``skipped`` (not a text or vision model headprune
targets, a sub-model config, too big or too slow) and ``broken`` (headprune raised something else: a
bug). Writes benchmarks/results/families.json and a Markdown table (stdout or ``--markdown``).
"""

from __future__ import annotations

import argparse
import contextlib
import inspect
import json
import re
import signal
import sys
import time
import warnings
from collections import Counter
from pathlib import Path

import torch
import transformers

sys.path.insert(0, str(Path(__file__).resolve().parent))
import tiny_configs  # noqa: E402  (beside this script)
from doc_tables import markdown_table  # noqa: E402

import headprune as hp  # noqa: E402
from headprune.core.safety import trial, verify  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "benchmarks" / "results" / "families.json"
VERDICTS = ("exact", "refused", "not built", "no attention sites", "skipped", "broken")
# CI's subset: an encoder, decoders (fused Conv1D, grouped-query, local attention), an encoder-decoder with
# relative positions, a family refused by name (ALiBi) and one the checks refuse (time-first layout)
QUICK = ("bert", "gpt2", "llama", "t5", "gpt_neo", "bloom", "fsmt")
START, END = "<!-- families:start -->", "<!-- families:end -->"
TEXT_OR_VISION = ("input_ids", "pixel_values")
QUERY_NAMES = ("q_proj", "query", "q", "qkv", "qkv_proj", "Wqkv", "c_attn", "query_key_value", "q_a_proj")
# text families whose forward needs another modality's inputs the checks do not make
OTHER_INPUTS = {"bros": "bounding boxes", "udop": "bounding boxes", "lxmert": "visual features",
                "vilt": "pixel values"}


class TimeLimit(BaseException):  # not an Exception: the checks' own ``except Exception`` must not catch it
    pass


@contextlib.contextmanager
def time_limit(seconds: float, what: str):
    def expire(signum, frame):
        raise TimeLimit(f"{what} took > {seconds:g} s")

    previous = signal.signal(signal.SIGALRM, expire)
    signal.setitimer(signal.ITIMER_REAL, seconds)
    try:
        yield
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)


def one_line(text: str, limit: int = 240) -> str:
    text = re.sub(r"\s+", " ", str(text)).strip()
    return text if len(text) <= limit else text[: limit - 3] + "..."


def error_line(e: BaseException) -> str:
    return one_line(f"{type(e).__name__}: {e}")


def refusal(message: str) -> str:
    """The reason in an UnsupportedModelError's message, without the model's name or the advice."""
    message = re.sub(r"^model of class \S+ (\(\S+\) )?(is not supported: )?", "", str(message))
    message = message.split("; supported families:")[0]
    return one_line(message)


def problems_line(problems: list[str]) -> str:
    """check_model's problems, without the random plans' head lists."""
    return one_line("; ".join(re.sub(r"plan \{[^{}]*\}: ", "", p) for p in problems))


def build(model_type: str, build_limit: float = 20.0):
    """(class name, config, model) of a tiny ``model_type``; raises on failure, TimeLimit when slow."""
    cls = tiny_configs.model_class(model_type)
    with time_limit(build_limit, "building"):
        config = tiny_configs.tiny_config(model_type)
        if tiny_configs.is_causal_lm(model_type) and getattr(config, "is_decoder", None) is False \
                and not getattr(config, "is_encoder_decoder", False):
            config.is_decoder = True  # an encoder family's causal-LM class is only causal as a decoder
        torch.manual_seed(0)
        model = cls._from_config(config) if hasattr(cls, "_from_config") else cls(config)
    return cls.__name__, config, model.float().eval()


def survey(model_type: str, build_limit: float = 20.0, check_limit: float = 120.0,
           max_params: float = 5e6) -> dict:
    """One row: model_type, class, verdict, checks, reason, seconds."""
    row = {"model_type": model_type, "class": tiny_configs.pick_class(model_type), "verdict": "", "checks": [],
           "reason": "", "seconds": 0.0}
    start = time.perf_counter()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        try:
            row.update(_survey(model_type, row["class"], build_limit, check_limit, max_params))
        except TimeLimit as e:
            row.update(verdict="skipped", reason=str(e))
        except ImportError as e:  # a family that needs a library the core does not install
            row.update(verdict="skipped", reason=f"needs a library not installed here: {error_line(e)}")
        except Exception as e:  # anything else before headprune runs: the tiny model could not be made
            row.update(verdict="not built", reason=error_line(e))
    row["seconds"] = round(time.perf_counter() - start, 2)
    return row


def _survey(model_type: str, class_name: str | None, build_limit: float, check_limit: float,
            max_params: float) -> dict:
    if class_name is None:
        return dict(verdict="skipped", reason="a sub-model config: no causal-LM, seq2seq, classification or "
                                              "base model class of its own")
    cls = getattr(transformers, class_name, None)
    if cls is None:
        return dict(verdict="not built", reason=f"transformers has no class {class_name} here")
    main_input = getattr(cls, "main_input_name", "input_ids")
    if main_input not in TEXT_OR_VISION:
        return dict(verdict="skipped", reason=f"main input {main_input!r}: not a text or vision model headprune "
                                              "targets")
    params = inspect.signature(cls.forward).parameters
    needs = [p.name for p in params.values() if p.default is p.empty and p.name not in ("self", main_input)
             and p.kind in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY)]
    if needs:
        besides = f" besides {main_input}" if main_input in params else ""
        return dict(verdict="skipped", reason=f"its forward needs {', '.join(needs)}{besides}: not a text or vision "
                                              "model headprune targets")
    if model_type in OTHER_INPUTS:
        return dict(verdict="skipped", reason=f"its forward needs {OTHER_INPUTS[model_type]} besides {main_input}: "
                                              "not a text or vision model headprune targets")
    try:
        default = tiny_configs.default_config(model_type)
    except Exception as e:
        return dict(verdict="not built", reason=f"default config: {error_line(e)}")
    parts = tiny_configs.multimodal(default)
    if parts:
        return dict(verdict="skipped", reason=f"composite ({', '.join(parts)}): not a text or vision model "
                                              "headprune targets")
    if main_input == "pixel_values" and getattr(default, "num_frames", None):
        return dict(verdict="skipped", reason="video input (frames of pixel_values): not a text or vision model "
                                              "headprune targets")
    try:
        tiny_configs.tiny_config(model_type)
    except Exception as e:
        return dict(verdict="not built", reason=f"config: {error_line(e)}")
    try:
        _, config, model = build(model_type, build_limit)
    except (TimeLimit, ImportError):
        raise
    except Exception as e:
        return dict(verdict="not built", reason=f"model: {error_line(e)}")
    params = sum(p.numel() for p in model.parameters())
    if params > max_params:
        if not _has_sites(model):
            return dict(verdict="no attention sites", reason=no_sites(model))
        return dict(verdict="skipped", reason=f"the tiny config still has {params / 1e6:.1f}M parameters")
    try:
        x = trial.example_batch(model)  # the inputs the checks use; if headprune cannot make them, it refuses below
    except Exception:
        x = None
    try:
        if x is not None:
            with time_limit(build_limit, "a forward pass"), torch.no_grad():
                model(**x)
    except TimeLimit:
        raise
    except Exception as e:
        return dict(verdict="not built", reason=f"forward: {error_line(e)}")
    try:
        hp.find_sites(model)
    except hp.UnsupportedModelError as e:
        if "has no attention sites" in str(e):
            return dict(verdict="no attention sites", reason=no_sites(model))
        return dict(verdict="refused", reason=refusal(e))
    except Exception as e:
        return dict(verdict="broken", reason=f"find_sites: {error_line(e)}")
    try:
        with time_limit(check_limit, "checking"):
            v = verify.check_model(model)
    except TimeLimit:
        raise
    except Exception as e:
        return dict(verdict="broken", reason=f"check_model: {error_line(e)}")
    if v.ok:
        return dict(verdict="exact", checks=list(v.exact))
    return dict(verdict="refused", checks=list(v.exact), reason=problems_line(v.problems))


def _has_sites(model) -> bool:
    try:
        return bool(hp.find_sites(model))
    except Exception:
        return "has no attention sites" not in str(sys.exc_info()[1])


def no_sites(model) -> str:
    """Why find_sites found nothing: attention modules it does not know, or none at all."""
    names = sorted({type(m).__name__ for m in model.modules()
                    if re.search(r"(?i:attention|attn)|MLA$", type(m).__name__)
                    or any(n in QUERY_NAMES for n, _ in m.named_children())})
    if names:
        return (f"attention modules ({', '.join(names[:3])}{', ...' if len(names) > 3 else ''}) without the "
                "q/k/v/o projections and head size headprune finds sites by")
    return "no attention modules (a convolutional, recurrent, state-space or Fourier model)"


# ---------------------------------------------------------------- results and tables

def load(path: Path) -> dict:
    return json.loads(path.read_text()) if path.exists() else {"families": []}


def save(path: Path, rows: list[dict], merge: bool) -> dict:
    """Write ``rows`` (merged by model type into the file's rows when ``merge``)."""
    old = {r["model_type"]: r for r in load(path)["families"]} if merge else {}
    old.update({r["model_type"]: r for r in rows})
    data = {"transformers": transformers.__version__, "torch": torch.__version__.split("+")[0],
            "command": "python benchmarks/families.py", "families": [old[k] for k in sorted(old)]}
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(data, indent=1) + "\n")
    return data


def _cell(text: str) -> str:
    return str(text).replace("|", "\\|")


def table(rows: list[dict]) -> str:
    cells = []
    for r in sorted(rows, key=lambda r: r["model_type"]):
        detail = ", ".join(r["checks"]) if r["verdict"] == "exact" else r["reason"]
        cells.append([f"`{r['model_type']}`", r["class"] or "-", r["verdict"], _cell(detail)])
    return "\n".join(markdown_table(["family", "class", "verdict", "checks or reason"], cells))


def counts(rows: list[dict]) -> str:
    n = Counter(r["verdict"] for r in rows)
    return "\n".join(markdown_table(["verdict", "model types"], [*([v, n[v]] for v in VERDICTS if n[v]),
                                                                ["all", len(rows)]]))


def readme_section(data: dict) -> str:
    """The text between the README's markers, from a results file's data."""
    rows = data["families"]
    return "\n".join([
        f"Generated by `python benchmarks/families.py --write-readme docs/families.md` from "
        f"`benchmarks/results/families.json` (transformers {data['transformers']}, torch {data['torch']}).", "",
        counts(rows), "", "<details><summary>Every model type</summary>", "", table(rows), "", "</details>"])


def write_readme(readme: Path, data: dict) -> None:
    text = readme.read_text()
    if START not in text or END not in text:
        raise SystemExit(f"{readme}: no {START} ... {END} markers")
    head, rest = text.split(START, 1)
    _, tail = rest.split(END, 1)
    readme.write_text(f"{head}{START}\n{readme_section(data)}\n{END}{tail}")


def readme_block(readme: Path) -> str:
    """What the README holds between the markers now."""
    return readme.read_text().split(START, 1)[1].split(END, 1)[0].strip("\n")


def main(argv: list[str] | None = None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--only", default=None, help="comma-separated model types (merged into --output)")
    ap.add_argument("--quick", action="store_true", help=f"only {', '.join(QUICK)} (merged into --output)")
    ap.add_argument("--output", type=Path, default=RESULTS)
    ap.add_argument("--markdown", type=Path, default=None, help="write the table here (default: stdout)")
    ap.add_argument("--write-readme", type=Path, default=None,
                    help="replace the README's families section with the table from --output (no survey "
                         "unless --only or --quick is given)")
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--build-limit", type=float, default=20.0, help="seconds to build and run a tiny model")
    ap.add_argument("--check-limit", type=float, default=120.0, help="seconds for headprune's checks")
    ap.add_argument("--max-params", type=float, default=5e6)
    args = ap.parse_args(argv)
    if args.write_readme and not (args.only or args.quick):
        data = load(args.output)
        write_readme(args.write_readme, data)
        return data
    types = list(QUICK) if args.quick else args.only.split(",") if args.only else tiny_configs.model_types()
    unknown = [t for t in types if t not in tiny_configs.model_types()]
    if unknown:
        raise SystemExit(f"unknown model types: {', '.join(unknown)}")
    merge = bool(args.only or args.quick)
    threads, verbosity = torch.get_num_threads(), transformers.logging.get_verbosity()
    bars = transformers.utils.logging.is_progress_bar_enabled()
    torch.set_num_threads(args.threads)  # the survey runs inside tests too: global settings are put back
    transformers.logging.set_verbosity_error()
    transformers.utils.logging.disable_progress_bar()
    rows = []
    try:
        for i, t in enumerate(types):
            rows.append(survey(t, args.build_limit, args.check_limit, args.max_params))
            r = rows[-1]
            print(f"[{i + 1}/{len(types)}] {t}: {r['verdict']} {r['reason']} ({r['seconds']} s)",
                  file=sys.stderr, flush=True)
            data = save(args.output, rows, merge)  # after each type: an interrupted survey keeps its rows
    finally:
        torch.set_num_threads(threads)
        transformers.logging.set_verbosity(verbosity)
        if bars:
            transformers.utils.logging.enable_progress_bar()
    md = f"{counts(rows)}\n\n{table(rows)}\n"
    if args.markdown:
        args.markdown.write_text(md)
    else:
        print(md)
    if args.write_readme:
        write_readme(args.write_readme, data)
    return data


if __name__ == "__main__":
    main()
