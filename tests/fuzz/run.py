#!/usr/bin/env python3
"""Runs one libFuzzer harness for a set time (tests/fuzz; `make fuzz`, and `make test` for 30 s).

Usage: run.py HARNESS CORPUS_DIR WORK_DIR [DICT...]  (several dictionaries are joined into one)

The harness starts from its committed seed corpus (CORPUS_DIR, read only) and keeps what it finds in
WORK_DIR (under the build directory: the repository's corpora grow only through `make fuzz-merge`, which
adds the inputs that bring new coverage, minimized). AH_FUZZ_SECONDS sets the time (default 60). A crash,
a leak, a sanitizer report or a broken invariant is a failure: the input is kept in WORK_DIR/crashes/ and
its path printed. Prints the executions, the coverage and the corpus size, then "N passed, N failed".
"""
import os
import re
import subprocess
import sys


def main():
    if len(sys.argv) < 4:
        print(__doc__)
        return 2
    harness, corpus, work = sys.argv[1:4]
    dicts = sys.argv[4:]
    seconds = int(os.environ.get("AH_FUZZ_SECONDS", "60"))
    name = os.path.basename(harness)
    found = os.path.join(work, "corpus")
    crashes = os.path.join(work, "crashes")
    os.makedirs(found, exist_ok=True)
    os.makedirs(crashes, exist_ok=True)
    cmd = [harness, f"-max_total_time={seconds}", "-print_final_stats=1", "-timeout=10", "-rss_limit_mb=2048",
           "-max_len=65536", f"-artifact_prefix={crashes}/", found, corpus]
    if dicts:  # libFuzzer takes one -dict: the harness's dictionaries, joined
        dictionary = os.path.join(work, "dictionary")
        with open(dictionary, "w", encoding="utf-8") as out:
            for d in dicts:
                out.write(open(d, encoding="utf-8").read().rstrip("\n") + "\n")
        cmd.insert(1, f"-dict={dictionary}")
    env = dict(os.environ, ASAN_OPTIONS="detect_leaks=1:abort_on_error=0",
               UBSAN_OPTIONS="print_stacktrace=1:halt_on_error=1")
    p = subprocess.run(cmd, capture_output=True, text=True, errors="replace", env=env,
                       timeout=seconds + 600)
    out = p.stderr + p.stdout
    runs = re.search(r"stat::number_of_executed_units: (\d+)", out)
    done = re.findall(r"#(\d+)\s+DONE\s+cov: (\d+) ft: (\d+) corp: (\d+)/(\S+)", out)
    seeds = len(os.listdir(corpus)) if os.path.isdir(corpus) else 0
    if p.returncode == 0 and runs and done:
        _, cov, ft, corp, size = done[-1]
        print(f"{name}: {runs.group(1)} executions in {seconds} s, coverage {cov} edges / {ft} features, "
              f"corpus {corp} inputs ({size}) from {seeds} seeds")
        print("1 passed, 0 failed")
        return 0
    print(f"{name}: FAILED (exit status {p.returncode})")
    for line in out.strip().split("\n")[-60:]:
        print(f"  | {line}")
    for f in sorted(os.listdir(crashes)):
        print(f"  input kept: {os.path.join(crashes, f)}")
    print("0 passed, 1 failed")
    return 1


if __name__ == "__main__":
    sys.exit(main())
