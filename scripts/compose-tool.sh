#!/usr/bin/env bash
# Docker Compose v2, built once per machine from its Go module into the project's cache and linked as
# .venv/bin/docker-compose: tests/unit/test_compose.py runs its `config` on compose.yaml (no engine needed).
# Called by scripts/setup.sh; minutes on a cold machine, nothing afterwards.
set -euo pipefail
cd "$(dirname "$0")/.."
version=v2.40.3
tools="${XDG_CACHE_HOME:-$HOME/.cache}/kafka-group-coordinator/tools"
binary="$tools/docker-compose-$version"
if [ ! -x "$binary" ]; then
  go=$(command -v go || echo /usr/local/go/bin/go)
  mkdir -p "$tools"
  echo "building Docker Compose $version from its Go module (once per machine)..." >&2
  # compose's go.mod has replace directives, so `go install module@version` refuses it: build in the module dir
  dir=$("$go" mod download -json "github.com/docker/compose/v2@$version" \
        | .venv/bin/python -c 'import json, sys; print(json.load(sys.stdin)["Dir"])')
  (cd "$dir" && "$go" build -trimpath -o "$binary.partial" ./cmd)
  mv "$binary.partial" "$binary"
fi
ln -sf "$binary" .venv/bin/docker-compose
