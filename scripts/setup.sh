#!/usr/bin/env bash
# Set up a fresh machine: a virtualenv with the project and its test extras, and Apache Kafka's jars (Maven).
# Re-running is cheap: pip runs again only when pyproject.toml changed, Maven only when the pom changed.
# Also: PySpark (the `spark` extra) with Spark's Kafka connector jars, and Debian's chromium (renders the
# analytics report in its tests), installed only when missing.
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
  .venv/bin/python -m pip install -q -e '.[spark]'  # pyspark: a 450 MB sdist, built once (pip caches the wheel)
  rm -f .venv/.installed-*
  touch "$stamp"
fi
.venv/bin/python -c "from coordinator.embedded import ensure_jars; ensure_jars()"
.venv/bin/python -c "from coordinator.embedded import ensure_spark_kafka_jars; ensure_spark_kafka_jars()"
if ! command -v chromium >/dev/null 2>&1; then
  # The analytics report is rendered in headless Chromium by its tests (the service itself never needs it, so a
  # user who cannot install it still gets a working setup, and those tests say what is missing).
  if [ "$(id -u)" -eq 0 ]; then as_root=(); elif command -v sudo >/dev/null 2>&1; then as_root=(sudo -n); else
    as_root=(false); fi
  if ! { "${as_root[@]}" apt-get update -q &&
         "${as_root[@]}" env DEBIAN_FRONTEND=noninteractive apt-get install -y -q chromium; }; then
    echo "setup: could not install Debian's chromium (needs root or password-less sudo): apt-get install chromium" >&2
  fi
fi
# A real Jaeger (v2 all-in-one) built from its Go module into the same cache, once per machine (minutes cold).
.venv/bin/python -c "from coordinator.embedded.jaeger import ensure_jaeger; ensure_jaeger()"
