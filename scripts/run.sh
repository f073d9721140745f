#!/usr/bin/env bash
# The main job: sets up the machine, then runs the group coordinator until Ctrl-C. With no cluster given
# (--bootstrap-server or KAFKA_BOOTSTRAP) it starts an embedded Apache Kafka broker for its state topic.
# Extra arguments go to `coordinator serve` (see `coordinator serve --help`).
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
exec .venv/bin/coordinator serve "$@"
