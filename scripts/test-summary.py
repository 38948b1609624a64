#!/usr/bin/env python3
"""Print one closing line, `N passed, N failed`, from meson's test logs.

Usage: test-summary.py TESTLOG.json [TESTLOG.json ...]

Each file is meson's meson-logs/testlog.json: one JSON object per line, one line per test run, with a
"result" of OK, FAIL, SKIP, TIMEOUT, EXPECTEDFAIL, UNEXPECTEDPASS, ERROR, INTERRUPT, ...
OK counts as passed; FAIL, TIMEOUT, ERROR, UNEXPECTEDPASS, INTERRUPT (and anything unknown) as failed;
SKIP and EXPECTEDFAIL as neither. A per-log breakdown goes first, the summary line last.

Exit status: 0 when nothing failed, 1 when something failed, 2 when no log could be read.
"""

import json
import re
import sys

PASSED = {"OK"}
NEUTRAL = {"SKIP", "EXPECTEDFAIL"}
# Everything else (FAIL, TIMEOUT, ERROR, UNEXPECTEDPASS, INTERRUPT, unknown) is a failure.

# Criterion's closing line, captured by meson in the test's output.
CRITERION = re.compile(
    r"Synthesis: Tested: (\d+) \| Passing: (\d+) \| Failing: (\d+) \| Crashing: (\d+)"
)


def read_log(path):
    """Return (passed, failed, neutral, failed_names, criterion_counts) for one testlog.json."""
    passed = failed = neutral = 0
    failed_names = []
    crit = [0, 0, 0, 0]
    with open(path, encoding="utf-8", errors="replace") as f:
        for lineno, line in enumerate(f, 1):
            line = line.strip()
            if not line:
                continue
            try:
                entry = json.loads(line)
            except json.JSONDecodeError as e:
                print(f"{path}:{lineno}: not JSON ({e}); counted as a failure", file=sys.stderr)
                failed += 1
                failed_names.append(f"<line {lineno}>")
                continue
            result = str(entry.get("result", "")).upper()
            if result in PASSED:
                passed += 1
            elif result in NEUTRAL:
                neutral += 1
            else:
                failed += 1
                failed_names.append(f"{entry.get('name', '?')} ({result or 'no result'})")
            for key in ("stdout", "stderr"):
                text = entry.get(key) or ""
                m = None
                for m in CRITERION.finditer(text):
                    pass
                if m:
                    for i in range(4):
                        crit[i] += int(m.group(i + 1))
    return passed, failed, neutral, failed_names, crit


def main(argv):
    if not argv:
        print(__doc__.strip(), file=sys.stderr)
        return 2
    total_passed = total_failed = 0
    read_any = False
    for path in argv:
        try:
            passed, failed, neutral, names, crit = read_log(path)
        except FileNotFoundError:
            print(f"{path}: no test log (that run did not happen or did not finish)", file=sys.stderr)
            continue
        except OSError as e:
            print(f"{path}: cannot read ({e})", file=sys.stderr)
            continue
        read_any = True
        total_passed += passed
        total_failed += failed
        detail = f"{path}: {passed} ok, {failed} failed, {neutral} skipped/expected-fail"
        if crit[0]:
            detail += (f" (Criterion cases: {crit[0]} tested, {crit[1]} passing,"
                       f" {crit[2]} failing, {crit[3]} crashing)")
        print(detail)
        for name in names:
            print(f"  failed: {name}")
    if not read_any:
        print("test-summary: no test log could be read", file=sys.stderr)
        return 2
    sys.stdout.flush()
    print(f"{total_passed} passed, {total_failed} failed")
    return 1 if total_failed else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
