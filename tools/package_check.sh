#!/usr/bin/env bash
# The package people install (make package-check, part of make test): build the wheel and the sdist, check
# them with twine, install the wheel into a fresh virtual environment and run the `headprune` it installed.
#
# Offline and fast: the wheel is built with the build tools already installed (--no-isolation) and installed
# with --no-deps; its dependencies (torch, transformers, ...) are made importable from the development
# environment by a plain path in a .pth file (appended after the fresh environment's own site-packages, and
# not processed for .pth files of its own, so the development environment's editable headprune stays out).
# The check fails unless `headprune` runs from the fresh environment's copy of the wheel.
set -euo pipefail
PYTHON=${1:-.venv/bin/python}
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
rm -rf build/lib build/bdist.* src/*.egg-info  # setuptools reuses these: a module deleted since would ship
"$PYTHON" -m build --no-isolation --outdir "$work/dist" . >"$work/build.log" 2>&1 || { cat "$work/build.log"; exit 1; }
"$PYTHON" -m twine check --strict "$work"/dist/*.whl "$work"/dist/*.tar.gz
"$PYTHON" -m venv --without-pip "$work/venv"
fresh="$work/venv/bin/python"
"$PYTHON" -m pip --python "$fresh" install -q --no-deps --disable-pip-version-check "$work"/dist/*.whl
deps=$("$PYTHON" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')
site=$("$fresh" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')
echo "$deps" >"$site/zz_dependencies_from_dev_env.pth"
version=$("$work/venv/bin/headprune" --version)
where=$("$fresh" -c 'import headprune, pathlib; p = pathlib.Path(headprune.__file__).parent; print(p); assert (p / "py.typed").is_file(), "py.typed missing"')
want=$(sed -n 's/^version = "\(.*\)"$/\1/p' pyproject.toml)
case "$where" in "$site"/*) ;; *) echo "headprune imported from $where, not from the wheel in $site" >&2; exit 1;; esac
[ "$version" = "headprune $want" ] || { echo "headprune --version said '$version', expected 'headprune $want'" >&2; exit 1; }
echo "package: $(cd "$work/dist" && ls | tr '\n' ' ')passed twine check; the wheel installed in a fresh venv runs: $version (py.typed shipped)"
