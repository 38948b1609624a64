#!/usr/bin/env python3
"""The command line's reference is one list: `agenthost --help` and the admin guide's command table
(docs/admin-guide.md, "Command line") name the same commands.

A command is its leading words up to the first option or placeholder: `sessions list [--json]` is
"sessions list", `call [--json] … METHOD` is "call". Usage: check_commands.py SOURCE_ROOT AGENTHOST.
Prints each difference, then "N passed, N failed" (one check per direction).
"""
import re
import subprocess
import sys

WORD = re.compile(r"^[a-z][a-z-]*$")


def name_of(usage):
    words = []
    for w in usage.split():
        if not WORD.match(w):
            break
        words.append(w)
    return " ".join(words)


def from_help(agenthost):
    text = subprocess.run([agenthost, "--help"], check=True, capture_output=True, text=True).stdout
    names, inside = set(), False
    for line in text.split("\n"):
        if line.strip() == "commands:":
            inside = True
            continue
        if inside and not line.strip():
            break
        if inside and re.match(r"^  \S", line):  # a command's line; its continuations are indented deeper
            names.add(name_of(line.strip().split("  ")[0]))
    return names


def from_guide(root):
    text = open(f"{root}/docs/admin-guide.md", encoding="utf-8").read()
    section = text.split("\n## Command line", 1)[1].split("\n## ", 1)[0]
    table = section.split("| command | what it does |", 1)[1].split("\n\n", 1)[0]
    names = set()
    for row in table.split("\n"):
        m = re.match(r"^\| `([^`]+)` \|", row)
        if m:
            names.add(name_of(m.group(1)))
    return names


def main():
    root, agenthost = sys.argv[1], sys.argv[2]
    helped, guided = from_help(agenthost), from_guide(root)
    passed = failed = 0
    for what, a, b in (("--help", helped, guided), ("the admin guide's table", guided, helped)):
        missing = sorted(a - b)
        if missing or not a:
            failed += 1
            for n in missing:
                print(f"`{n}` is in {what} but not in the other")
            if not a:
                print(f"no command found in {what}")
        else:
            passed += 1
    print(f"{len(helped)} commands in --help, {len(guided)} in the admin guide")
    print(f"{passed} passed, {failed} failed")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
