#!/usr/bin/env bash
# The main job: sets up the machine, then runs `coordinator demo` until Ctrl-C: the embedded Apache Kafka (data kept
# in ~/.local/state/kafka-group-coordinator, so a restart keeps the groups), Jaeger when the build has it, the
# coordinator, and a few simulated consumer groups with a failure now and then. It prints the bootstrap address
# for your own consumers, then one line per event under a live status line (the full log goes to demo.log in the
# state directory); Ctrl-C prints a summary and where to look next (`coordinator trace`). `--consumers 0` runs the
# bare service, `--duration S` stops after S seconds; every `coordinator serve` flag works too (e.g.
# --bootstrap-server HOST:PORT for your cluster). `--secure` runs it all secured: the broker with SASL_SSL, SCRAM
# users and Kafka's StandardAuthorizer, the coordinator listening with SASL_SSL, the consumers authenticated and
# allowed by ACLs (docs/security.md, "The secured demo").
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh demo  # only what the demo needs: the tests' extras wait for scripts/test.sh
exec .venv/bin/coordinator demo "$@"
