#!/usr/bin/env python3
# Runs the request_heap workload (bench/workloads/request_heap.cpp) in both of its flavours,
# traymalloc's heaps and mimalloc's, and prints the medians of a few repetitions side by side:
# the server mode under each release (free, reset, destroy), then the bulk release times.
# Runs are interleaved (every flavour and release once per repetition) so that a machine whose
# speed drifts during the run tilts no column more than another.
#
#   bench/scripts/heap_compare.py --build build [--reps 5] [--threads 2] [--scale 1]
#                                 [--blocks 200000,1000000]
#
# A flavour whose binary is missing (request_heap_mimalloc needs libmimalloc-dev at build time;
# request_heap needs the override library) is left out with a note. Exits non-zero if a run
# fails or reports check=fail.
import argparse
import statistics
import subprocess
import sys
from pathlib import Path

FLAVOURS = ["request_heap", "request_heap_mimalloc"]
RELEASES = ["free", "reset", "destroy"]
BULK_FIELDS = ["free_ns", "reset_ns", "destroy_ns"]


def run(binary, arguments):
    """The RESULT line's key=value fields of one run."""
    child = subprocess.run([str(binary), *arguments], capture_output=True, text=True)
    line = next((l for l in child.stdout.splitlines() if l.startswith("RESULT ")), None)
    if child.returncode != 0 or line is None:
        sys.exit(f"{binary.name} {' '.join(arguments)} failed (exit {child.returncode}): "
                 f"{child.stderr.strip()[-300:]}")
    fields = dict(item.split("=", 1) for item in line.split()[1:] if "=" in item)
    if fields.get("check") != "ok":
        sys.exit(f"{binary.name} {' '.join(arguments)}: check={fields.get('check')}")
    return fields


def main():
    parser = argparse.ArgumentParser(description="request_heap on traymalloc and mimalloc")
    parser.add_argument("--build", type=Path, default=Path("build"),
                        help="build folder (binaries in <build>/bench/heap; default: %(default)s)")
    parser.add_argument("--reps", type=int, default=5)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--scale", default="1")
    parser.add_argument("--blocks", default="200000,1000000",
                        help="block counts of the bulk runs, separated by commas")
    parser.add_argument("--rounds", default="5",
                        help="rounds of one bulk run (the run reports their median)")
    args = parser.parse_args()

    folder = args.build / "bench" / "heap"
    binaries = {}
    for name in FLAVOURS:
        path = folder / name
        if path.is_file():
            binaries[name] = path
        else:
            print(f"note: {path} not built, left out")
    if not binaries:
        sys.exit(f"no request_heap binaries in {folder}")
    blocks = [b for b in args.blocks.split(",") if b]

    server = {(n, r): [] for n in binaries for r in RELEASES}
    bulk = {(n, b, f): [] for n in binaries for b in blocks for f in BULK_FIELDS}
    emulated = set()
    for rep in range(args.reps):
        for release in RELEASES:
            for name, binary in binaries.items():
                fields = run(binary, ["--release", release, "--threads", str(args.threads),
                                      "--scale", args.scale])
                server[(name, release)].append(float(fields["requests_per_s"]))
        for count in blocks:
            for name, binary in binaries.items():
                fields = run(binary, ["--mode", "bulk", "--blocks", count, "--rounds", args.rounds])
                for field in BULK_FIELDS:
                    bulk[(name, count, field)].append(float(fields[field]))
                if fields.get("reset") == "destroy+new":
                    emulated.add(name)
        print(f"repetition {rep + 1}/{args.reps} done", file=sys.stderr)

    names = list(binaries)
    width = max(len(n) for n in names) + 2
    print(f"\nserver mode, requests/s (median of {args.reps}; threads={args.threads}, "
          f"scale={args.scale})")
    print(f"{'release':<10}" + "".join(f"{n:>{width}}" for n in names))
    for release in RELEASES:
        print(f"{release:<10}" + "".join(
            f"{statistics.median(server[(n, release)]):>{width}.0f}" for n in names))

    print(f"\nbulk release, ns for all blocks (median of {args.reps} runs of {args.rounds} rounds)")
    print(f"{'blocks':<9}{'method':<9}" + "".join(f"{n:>{width}}" for n in names))
    for count in blocks:
        for field in BULK_FIELDS:
            method = field.removesuffix("_ns")
            print(f"{count:<9}{method:<9}" + "".join(
                f"{statistics.median(bulk[(n, count, field)]):>{width}.0f}" for n in names))
    for name in sorted(emulated):
        print(f"note: {name} has no reset; its reset is destroy + new heap")


if __name__ == "__main__":
    main()
