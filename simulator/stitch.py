"""python -m simulator.stitch FILE...: the final JSON lines of chunked seed runs, added up.

A long run goes in chunks (`python -m simulator --start S --seeds N ... > chunk-S.json`), each ending with its
JSON line; a chunk that stopped early (`--time-limit`, a killed process) says how many seeds it ran, so a gap
shows. This reads the last JSON line of each file and prints one JSON line: the seeds covered (as ranges), the
gaps between them, CPU per seed over all chunks, every violation, and each chunk's history-hashes digest (two runs
of the same chunk compare with it). Exit status 1 if any seed failed or a chunk is missing a seed.
"""
from __future__ import annotations

import argparse
import json
import sys
from typing import Any


def last_json_line(path: str) -> dict[str, Any]:
    with open(path, encoding="utf-8") as lines:
        found = [line for line in lines if line.startswith("{")]
    if not found:
        raise SystemExit(f"{path}: no JSON line (the chunk did not finish: run it again)")
    result: dict[str, Any] = json.loads(found[-1])
    return result


def stitch(chunks: list[dict[str, Any]]) -> dict[str, Any]:
    chunks = sorted(chunks, key=lambda chunk: int(chunk["start"]))
    ranges: list[list[int]] = []  # [first, last] seeds covered, merged
    for chunk in chunks:
        first, last = int(chunk["start"]), int(chunk["start"]) + int(chunk["seeds"]) - 1
        if last < first:
            continue
        if ranges and first <= ranges[-1][1] + 1:
            ranges[-1][1] = max(ranges[-1][1], last)
        else:
            ranges.append([first, last])
    gaps = [[ranges[i][1] + 1, ranges[i + 1][0] - 1] for i in range(len(ranges) - 1)]
    seeds = sum(int(chunk["seeds"]) for chunk in chunks)  # run (a seed in two chunks counts twice)
    cpu_s = sum(float(chunk["cpu_s"]) for chunk in chunks)
    protocols = sorted({str(chunk.get("protocol", "classic")) for chunk in chunks})
    return {
        "seeds": sum(last - first + 1 for first, last in ranges), "seeds_run": seeds, "covered": ranges, "gaps": gaps, "chunks": len(chunks), "protocols": protocols,
        "cpu_s": round(cpu_s, 1), "cpu_ms_per_seed": round(1000 * cpu_s / max(seeds, 1), 1),
        "wall_s": round(sum(float(chunk["wall_s"]) for chunk in chunks), 1),
        "violations": [violation for chunk in chunks for violation in chunk["violations"]],
        "chunk_hashes": {str(chunk["start"]): chunk.get("history_hashes_digest") for chunk in chunks},
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m simulator.stitch", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("files", nargs="+", help="files holding a chunk's output (its last JSON line is read)")
    args = parser.parse_args(argv)
    result = stitch([last_json_line(path) for path in args.files])
    print(json.dumps(result))
    return 1 if result["violations"] or result["gaps"] else 0


if __name__ == "__main__":
    sys.exit(main())
