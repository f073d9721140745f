#!/usr/bin/env bash
# Set up a fresh machine: a virtualenv with the project and its test extras, Apache Kafka's jars (Maven) and Jaeger.
# Re-running is cheap: pip runs again only when pyproject.toml changed, Maven only when the pom changed.
# Also, for the tests: PySpark (the `spark` extra) with Spark's Kafka connector jars, Debian's chromium (renders the
# analytics report) and Docker Compose (checks compose.yaml), installed only when missing.
# `setup.sh demo` (what scripts/run.sh runs) sets up only what `coordinator demo` needs: the project with uvloop
# and cryptography (--secure's test CA), Kafka's jars and Jaeger; the test-only parts wait for the first `setup.sh`
# (scripts/test.sh).
set -euo pipefail
cd "$(dirname "$0")/.."
mode=${1:-all}
python=${PYTHON:-python3}
if [ ! -x .venv/bin/python ]; then
  "$python" -m venv .venv
fi
hash=$(sha256sum pyproject.toml | cut -c1-16)
full=.venv/.installed-$hash          # everything (the tests')
demo=.venv/.installed-demo-$hash     # the demo's part only

pip_install() {  # stamp, pip install arguments...
  local stamp=$1
  shift
  .venv/bin/python -m pip install -q --upgrade pip
  for packages in "$@"; do
    .venv/bin/python -m pip install -q -e "$packages"
  done
  rm -f .venv/.installed-*
  touch "$stamp"
}

debian_install() {  # what it is for, Debian packages...
  local purpose=$1
  shift
  if [ "$(id -u)" -eq 0 ]; then as_root=(); elif command -v sudo >/dev/null 2>&1; then as_root=(sudo -n); else
    as_root=(false); fi
  if ! { "${as_root[@]}" apt-get update -q &&
         "${as_root[@]}" env DEBIAN_FRONTEND=noninteractive apt-get install -y -q "$@"; }; then
    echo "setup: could not install Debian's $* ($purpose; needs root or password-less sudo): apt-get install $*" >&2
  fi
}

if [ "$mode" = demo ]; then
  if [ ! -e "$full" ] && [ ! -e "$demo" ]; then
    pip_install "$demo" '.[speed,secure]'  # secure: the test CA of `run.sh --secure`
  fi
else
  if [ ! -e "$full" ]; then
    if ! command -v cc >/dev/null 2>&1; then
      # pyjks (JKS stores, in the test extra) depends on twofish, which PyPI has only as source
      debian_install "a C compiler: the test extra builds twofish from source" gcc libc6-dev
    fi
    # pyspark: a 450 MB sdist, built once (pip caches the wheel). One pip run for every extra: one resolve and one
    # build of the project instead of one per extra; bench is py-spy, for the benchmarks' --profile.
    pip_install "$full" '.[test,speed,spark,bench]'
  fi
fi
# The compiled build `coordinator serve` and `demo` run by default (scripts/build_compiled.py: mypyc, the test extra's
# mypy, a C compiler and Python's headers; ~2-7 minutes on 2 cores; 0.7-0.8 of the pure server's CPU per request):
# made when missing, and made again when a committed tree's sources no longer match it (after a pull). With
# uncommitted edits the build is left as it is: the edited modules and their importers run their sources (one log
# line at start says which) until `python scripts/build_compiled.py` rebuilds. A failed build is not a failed setup:
# the service then runs every module from its source.
if [ "$mode" != demo ] && ! .venv/bin/python -m coordinator.compiled >/dev/null 2>&1; then
  if [ ! -e build/compiled/manifest.json ] || [ -z "$(git status --porcelain --untracked-files=no 2>/dev/null)" ]; then
    if ! .venv/bin/python -c 'import os, sys, sysconfig
sys.exit(not os.path.exists(os.path.join(sysconfig.get_paths()["include"], "Python.h")))'; then
      debian_install "Python's headers: the compiled build" python3-dev
    fi
    mkdir -p build
    echo "setup: compiling the hot modules with mypyc into build/compiled (2-7 minutes, once per commit)" >&2
    if .venv/bin/python scripts/build_compiled.py > build/compiled-build.log 2>&1; then
      .venv/bin/python -m coordinator.compiled | cut -c1-80 >&2
    else
      echo "setup: the compiled build failed (build/compiled-build.log): the service runs every module from its" \
           "source" >&2
    fi
  else
    echo "setup: build/compiled predates your edits: the edited modules and their importers run their sources" \
         "(python scripts/build_compiled.py rebuilds)" >&2
  fi
fi
.venv/bin/python -c "from coordinator.embedded import ensure_jars; ensure_jars()"
# A real Jaeger (v2 all-in-one) built from its Go module into the same cache, once per machine (minutes cold).
.venv/bin/python -c "from coordinator.embedded.jaeger import ensure_jaeger; ensure_jaeger()"
if [ "$mode" != demo ]; then
  .venv/bin/python -c "from coordinator.embedded import ensure_spark_kafka_jars; ensure_spark_kafka_jars()"
  if ! command -v chromium >/dev/null 2>&1; then
    # the analytics report is rendered in headless Chromium by its tests (the service itself never needs it, so a
    # user who cannot install it still gets a working setup, and those tests say what is missing)
    debian_install "the analytics report's tests render in it" chromium
  fi
  bash scripts/compose-tool.sh
fi
