#!/usr/bin/env bash
# Set up a fresh machine: a virtualenv with the project and its test extras, and Apache Kafka's jars (Maven).
# Re-running is cheap: pip runs again only when pyproject.toml changed, Maven only when the pom changed.
set -euo pipefail
cd "$(dirname "$0")/.."
python=${PYTHON:-python3}
if [ ! -x .venv/bin/python ]; then
  "$python" -m venv .venv
fi
stamp=.venv/.installed-$(sha256sum pyproject.toml | cut -c1-16)
if [ ! -e "$stamp" ]; then
  .venv/bin/python -m pip install -q --upgrade pip
  .venv/bin/python -m pip install -q -e '.[test,speed]'
  rm -f .venv/.installed-*
  touch "$stamp"
fi
.venv/bin/python -c "from coordinator.embedded import ensure_jars; ensure_jars()"
# A real Jaeger (v2 all-in-one) built from its Go module into the same cache, once per machine (minutes cold).
.venv/bin/python -c "from coordinator.embedded.jaeger import ensure_jaeger; ensure_jaeger()"
