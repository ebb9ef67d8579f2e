"""Headline numbers of every run in studies/results/ as Markdown tables, and the check that every
number README.md, REPRODUCTION.md and the manual (docs/*.md) quote is what the committed results files say.

    python studies/summarize.py [--results studies/results] > studies/results/SUMMARY.md
    python studies/summarize.py --check    # exit 1 naming each problem (CI runs this)
    python studies/summarize.py --fix      # rewrite the quoted numbers from the results files

``--check`` gives three separate verdicts: (1) quoted numbers and tables that differ from the results
files; (2) stale runs: study runs (and benchmark files) whose significance was computed by older
statistics code, each with the command that regenerates it; (3) figures not drawn from the table
beside them: every figure a run directory's ``figures.json`` lists must name a file of the run whose
sha256 is unchanged, and a figure's starred heads / sites must be the table's ``significant`` rows.

Quoted numbers are marked ``<!--q:NAME-->value<!--/q-->`` and generated tables
``<!--block:NAME-->...<!--/block-->``; studies/quotes.py says which file and field each NAME reads.
Reads each run directory's results.json / CSV files as the study commands wrote them; significance is
read from the runs, never recomputed.
"""

from __future__ import annotations

import argparse
import csv
import json
import re
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import quotes  # noqa: E402  (studies/ is not a package)

ROOT = Path(__file__).resolve().parents[1]


def documents(root: Path = ROOT) -> tuple[str, ...]:
    """The Markdown files whose quotes are checked: README.md, REPRODUCTION.md and every page of the manual."""
    return ("README.md", "REPRODUCTION.md", *sorted(f"docs/{p.name}" for p in (root / "docs").glob("*.md")))


DOCS = documents()
QUOTE = re.compile(r"<!--q:([^>]*?)-->(.*?)<!--/q-->", re.S)
BLOCK = re.compile(r"<!--block:([^>]*?)-->\n(.*?)\n?<!--/block-->", re.S)


def _load(run: Path) -> dict | None:
    path = run / "results.json"
    return json.loads(path.read_text()) if path.is_file() else None


def _pct(metric: str, x: float) -> str:
    return f"{100 * x:.2f}" if metric in ("accuracy", "f1", "matthews") else f"{x:.2f}"


def ablation(name: str, res: dict) -> list[str]:
    rows, metric = res["rows"], res["metric"]
    settings = res["signature"]["settings"]
    stale = quotes.stale_reason(res)
    label = (f"significant ({settings.get('correction', 'holm')}-adjusted two-sided p < {settings['alpha']})"
             if stale is None else f"significant: stale run ({stale})")
    out = [f"### {name}: one head masked (Table 1 / Fig. 1)", "",
           f"full model {metric}: {_pct(metric, res['base'])}; n = {res['signature']['n']}", "",
           f"| kind | heads | {label} | masking helps | min delta | max delta |",
           "|---|---|---|---|---|---|"]
    sig = [bool(r.get("significant")) if stale is None else None for r in rows]
    for kind in ("encoder", "decoder", "cross"):
        sub = [(r, s) for r, s in zip(rows, sig, strict=True) if r["kind"] == kind]
        if sub:
            deltas = [r["delta"] for r, _ in sub]
            count = "stale" if stale is not None else sum(s for _, s in sub)
            out.append(f"| {kind} | {len(sub)} | {count} | "
                       f"{sum(r['damage'] < 0 for r, _ in sub)} | {_pct(metric, min(deltas))} | {_pct(metric, max(deltas))} |")
    return out + [""]


def all_but_one(name: str, res: dict) -> list[str]:
    metric = res["metric"]
    try:
        table = quotes.block_all_but_one(name)
    except quotes.Stale as e:
        table = f"(stale: {e}; regenerate: {regenerate_command(name)})"
    return [f"### {name}: keep one head per site", "", f"full model {metric}: {_pct(metric, res['base'])}", "",
            table, ""]


def cross_domain(name: str, res: dict) -> list[str]:
    return [f"### {name}: cross-domain (Fig. 2)", "",
            f"Pearson r = {res['pearson_r']:.3f} (p = {res['p_value']:.2g}); full model: "
            + ", ".join(f"{k} {_pct(res['metric'], v)}" for k, v in res["base"].items()), ""]


def curves(name: str, res: dict, run: Path) -> list[str]:
    metric, rows = res["metric"], res["rows"]
    orders = list(dict.fromkeys(r["order"] for r in rows))
    fractions = sorted({r["fraction"] for r in rows})
    out = [f"### {name}: pruning curve ({metric}; relative to unpruned = 100)", "",
           "| pruned | " + " | ".join(orders) + " |", "|---" * (len(orders) + 1) + "|"]
    for f in fractions:
        cells = []
        for o in orders:
            r = next((r for r in rows if r["order"] == o and r["fraction"] == f), None)
            cells.append("" if r is None else f"{_pct(metric, r['score'])} ({100 * r['relative']:.0f})")
        out.append(f"| {f:.0%} | " + " | ".join(cells) + " |")
    return out + [""]


def dynamics(name: str, res: dict, run: Path) -> list[str]:
    with open(run / "dynamics.csv", newline="") as f:
        rows = list(csv.DictReader(f))
    epochs = sorted({int(r["epoch"]) for r in rows})
    fractions = sorted({float(r["fraction"]) for r in rows})
    out = [f"### {name}: relative score per epoch (Fig. 5; 100 = that epoch's unpruned model)", "",
           "| pruned | " + " | ".join(f"epoch {e}" for e in epochs) + " |", "|---" * (len(epochs) + 1) + "|"]
    for f in fractions:
        cells = [next((f"{100 * float(r['relative']):.0f}" for r in rows
                       if int(r["epoch"]) == e and float(r["fraction"]) == f), "") for e in epochs]
        out.append(f"| {f:.0%} | " + " | ".join(cells) + " |")
    base = [next(float(r["score"]) for r in rows if int(r["epoch"]) == e and float(r["fraction"]) == 0) for e in epochs]
    return out + ["", f"unpruned {res['metric']} per epoch: " + ", ".join(f"{b:.2f}" for b in base), ""]


def _regenerate(doc: str, match: re.Match, make, kind: str, problems: list[str], stale: list[str]) -> str:
    name, held = match.group(1), match.group(2)
    try:
        want = make(name)
    except quotes.Stale as e:
        line = match.string.count("\n", 0, match.start()) + 1
        stale.append(f"{doc}:{line}: {kind} {name!r} reads {e}")
        return match.group(0)
    except (KeyError, StopIteration, ValueError, TypeError, FileNotFoundError) as e:
        problems.append(f"{doc}: {kind} {name!r} cannot be computed: {type(e).__name__}: {e}")
        return match.group(0)
    if want != held:
        line = match.string.count("\n", 0, match.start()) + 1
        shown = held if kind == "q" else f"{held[:60]}..."
        problems.append(f"{doc}:{line}: {kind} {name!r} says {shown!r}, the results say {want[:60]!r}")
    if kind == "q":
        return f"<!--q:{name}-->{want}<!--/q-->"
    return f"<!--block:{name}-->\n{want}\n<!--/block-->"


def _families(doc: str, text: str, problems: list[str]) -> str:
    """The README's model-family table (between benchmarks/families.py's markers) against families.json."""
    start, end = "<!-- families:start -->", "<!-- families:end -->"
    if start not in text:
        return text
    sys.path.insert(0, str(ROOT / "benchmarks"))
    import families  # noqa: PLC0415  (imports torch: only when a doc holds the table)

    head, rest = text.split(start, 1)
    held, tail = rest.split(end, 1)
    want = families.readme_section(json.loads((ROOT / "benchmarks" / "results" / "families.json").read_text()))
    if held.strip("\n") != want:
        problems.append(f"{doc}: the model-family table differs from benchmarks/results/families.json")
    return f"{head}{start}\n{want}\n{end}{tail}"


def check(fix: bool = False, root: Path = ROOT, stale: list[str] | None = None) -> list[str]:
    """Every marker in README.md, REPRODUCTION.md and docs/*.md against quotes.py; returns the mismatches (fix: rewrites).

    Markers that read the significance of a stale results file are not mismatches: they go to ``stale``
    (a list the caller passes; they are left as they are)."""
    problems: list[str] = []
    stale = [] if stale is None else stale
    for doc in documents(root):
        path = root / doc
        text = path.read_text()
        new = QUOTE.sub(lambda m, d=doc: _regenerate(d, m, quotes.quote, "q", problems, stale), text)
        new = BLOCK.sub(lambda m, d=doc: _regenerate(d, m, quotes.block, "block", problems, stale), new)
        new = _families(doc, new, problems)
        if fix and new != text:
            path.write_text(new)
    return problems


# ---------------------------------------------------------------- stale runs and figure provenance


def regenerate_command(run: str) -> str:
    """The command that regenerates studies/results/RUN: its group of studies/run_experiments.sh, into a
    fresh directory (a stale run's signature differs from today's, so a resume is refused)."""
    script = (ROOT / "studies" / "run_experiments.sh").read_text()
    group = None
    for block in re.finditer(r"if has (\w+); then(.*?)\nfi", script, re.S):
        names = re.findall(r"-o \$R/([\w$]+)", block.group(2))
        if any(n == run or ("$" in n and run.startswith(n.split("$")[0])) for n in names):
            group = block.group(1)
            break
    if group is None:
        return f"(no line of studies/run_experiments.sh writes {run}; regenerate it by the command in its run.json)"
    return f"rm -r studies/results/{run} && bash studies/run_experiments.sh {group}"


def stale_runs(results: Path) -> list[tuple[str, str, str]]:
    """(run, why, command) of every study run whose significance is not today's."""
    out = []
    for run in sorted(p for p in results.iterdir() if p.is_dir()):
        res = _load(run)
        if res is None or res.get("experiment") not in ("ablation", "all-but-one", "cross-domain", "curves", "dynamics"):
            continue
        why = quotes.stale_reason(res)
        if why is not None:
            out.append((run.name, why, regenerate_command(run.name)))
    return out


def _sha(path: Path) -> str:
    import hashlib

    return hashlib.sha256(path.read_bytes()).hexdigest()


def _marked(table: Path) -> list[str]:
    """site:head (or site) of the rows a CSV calls significant, sorted -- what a figure must star."""
    with open(table, newline="") as f:
        rows = list(csv.DictReader(f))
    return sorted(f"{r['site']}:{r['head']}" if r.get("head") not in (None, "") else r["site"]
                  for r in rows if r.get("significant") == "True")


def figure_problems(results: Path, skip: set[str] = frozenset()) -> list[str]:
    """Figures of each (non-skipped) run that its figures.json does not tie to an unchanged table of the run."""
    problems = []
    for run in sorted(p for p in results.iterdir() if p.is_dir() and p.name not in skip):
        figures = sorted(run.glob("*.png"))
        if not figures or _load(run) is None:
            continue
        index = run / "figures.json"
        known = json.loads(index.read_text()) if index.is_file() else {}
        for png in figures:
            entry = known.get(png.name)
            if entry is None:
                problems.append(f"{run.name}/{png.name}: not in figures.json (which table was it drawn from?)")
                continue
            source = run / entry["source"]
            if not source.is_file() or _sha(source) != entry["sha256"]:
                problems.append(f"{run.name}/{png.name}: drawn from {entry['source']} with sha256 "
                                f"{entry['sha256'][:12]}, which the run no longer holds")
            elif "starred" in entry and entry["starred"] != _marked(source):
                problems.append(f"{run.name}/{png.name}: stars {entry['starred']} but {entry['source']} calls "
                                f"{_marked(source)} significant")
    return problems


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--results", type=Path, default=ROOT / "studies" / "results")
    ap.add_argument("--check", action="store_true", help="fail (exit 1) if a quoted number differs from the results")
    ap.add_argument("--fix", action="store_true", help="rewrite the quoted numbers from the results files")
    args = ap.parse_args()
    if args.check or args.fix:
        stale_quotes: list[str] = []
        problems = check(fix=args.fix, stale=stale_quotes)
        for p in problems:
            print(p, file=sys.stderr)
        n = sum(len(QUOTE.findall((ROOT / d).read_text())) + len(BLOCK.findall((ROOT / d).read_text())) for d in DOCS)
        if args.fix:
            print(f"rewrote the quoted numbers ({n} markers); {len(problems)} differed; "
                  f"{len(stale_quotes)} read stale results and were left as they are")
            sys.exit(0 if all("cannot be computed" not in p for p in problems) else 1)
        stale = stale_runs(args.results)
        figures = figure_problems(args.results, skip={name for name, _, _ in stale})
        print(f"{n} quoted numbers and tables checked: " + ("all match" if not problems else f"{len(problems)} differ")
              + (f" ({len(stale_quotes)} read stale results, not compared)" if stale_quotes else ""))
        if stale or stale_quotes:
            print(f"STALE: {len(stale)} study runs were tested by older statistics code; regenerate each:")
            for name, why, command in stale:
                print(f"  {name}: {why}\n    {command}")
            for line in stale_quotes:
                print(f"  quote: {line}")
        print("figures: " + ("each drawn from its run's current table" if not figures else f"{len(figures)} problems"))
        for line in figures:
            print(f"  {line}")
        sys.exit(1 if problems or stale or stale_quotes or figures else 0)
    lines = ["# Summary of studies/results (generated by studies/summarize.py)", ""]
    for run in sorted(p for p in args.results.iterdir() if p.is_dir()):
        res = _load(run)
        if res is None:
            continue
        kind = res.get("experiment")
        if kind == "ablation":
            lines += ablation(run.name, res)
        elif kind == "all-but-one":
            lines += all_but_one(run.name, res)
        elif kind == "cross-domain":
            lines += cross_domain(run.name, res)
        elif kind == "curves":
            lines += curves(run.name, res, run)
        elif kind == "dynamics":
            lines += dynamics(run.name, res, run)
    print("\n".join(lines))


if __name__ == "__main__":
    main()
