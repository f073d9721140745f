#!/usr/bin/env bash
# The main job: sets up the machine, then runs the embedded Apache Kafka broker until Ctrl-C.
# Extra arguments go to `coordinator kafka`.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
exec .venv/bin/coordinator kafka "$@"
