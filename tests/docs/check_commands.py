#!/usr/bin/env python3
"""The command line's reference is one list: `agenthost --help`, the admin guide's command table
(docs/admin-guide.md, "Command line"), the man page agenthost(1) and the bash completion name the same
commands (the completion's are what it offers when run in bash, word by word).

A command is its leading words up to the first option or placeholder: `sessions list [--json]` is
"sessions list", `call [--json] … METHOD` is "call". Usage: check_commands.py SOURCE_ROOT AGENTHOST
[MANPAGE [COMPLETION]]. Prints each difference, then "N passed, N failed" (one check per list: it names no command the
others lack).
"""
import importlib.util
import os
import re
import subprocess
import sys
import tempfile

WORD = re.compile(r"^[a-z][a-z-]*$")


def name_of(usage):
    words = []
    for w in usage.split():
        if not WORD.match(w):
            break
        words.append(w)
    return " ".join(words)


def from_help(root, agenthost):
    """The commands of `agenthost --help`, read by the man page's own reader (scripts/manpage.py)."""
    spec = importlib.util.spec_from_file_location("manpage", os.path.join(root, "scripts", "manpage.py"))
    manpage = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(manpage)
    return {name_of(usage) for usage, _ in manpage.help_sections(agenthost).get("commands", [])}


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


def from_man(path):
    """The `.B` usages of the man page's COMMANDS section."""
    names, inside = set(), False
    for line in open(path, encoding="utf-8").read().split("\n"):
        if line.startswith(".SH"):
            inside = line.strip() == ".SH COMMANDS"
        elif inside and line.startswith(".B "):
            names.add(name_of(line[3:].replace("\\-", "-").replace("\\e", "\\")))
    return names


def from_completion(path):
    """What the completion offers: the first words, then each one's second words (in an empty directory, so
    that a command completing file names offers none)."""
    probe = (
        'source "$1"\n'
        'offer() { COMP_WORDS=("$@"); COMP_CWORD=$((${#COMP_WORDS[@]} - 1)); COMPREPLY=(); _agenthost;'
        ' printf "%s\\n" "${COMPREPLY[@]}"; }\n'
        'for w in $(offer agenthost ""); do\n'
        '  subs=$(offer agenthost "$w" "")\n'
        '  if [ -z "$subs" ]; then echo "$w"; else for s in $subs; do echo "$w $s"; done; fi\n'
        "done\n"
    )
    with tempfile.TemporaryDirectory() as empty:
        out = subprocess.run(["bash", "-c", probe, "probe", os.path.abspath(path)], cwd=empty, check=True,
                             capture_output=True, text=True).stdout
    return {line for line in out.split("\n") if line}


def main():
    root, agenthost = sys.argv[1], sys.argv[2]
    lists = {"--help": from_help(root, agenthost), "the admin guide's table": from_guide(root)}
    if len(sys.argv) > 3:
        lists["the man page"] = from_man(sys.argv[3])
    if len(sys.argv) > 4:
        lists["the bash completion"] = from_completion(sys.argv[4])
    passed = failed = 0
    for what, names in lists.items():
        others = set().union(*(n for w, n in lists.items() if w != what))
        missing = sorted(names - others) + sorted(n for w, o in lists.items() if w != what for n in o - names)
        if missing or not names:
            failed += 1
            for n in sorted(set(missing)):
                print(f"`{n}`: not in {what}" if n not in names else f"`{n}` is in {what} but not in every other list")
            if not names:
                print(f"no command found in {what}")
        else:
            passed += 1
    print(", ".join(f"{len(n)} commands in {w}" for w, n in lists.items()))
    print(f"{passed} passed, {failed} failed")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
