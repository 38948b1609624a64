#!/usr/bin/env python3
"""The project's docs stand alone: no reference in README.md or docs/ points outside the repository.

Checks every Markdown file of README.md and docs/:
  - no mention of design notes that are not part of the repository (DECISIONS.md, SECURITY.md, …) or of
    contract tags that only those notes define (API-…, REMOTE-…, ACP-…, SDK-TS-…);
  - every relative Markdown link points to a file or directory of the repository;
  - every `path` in backticks that starts with a top-level folder of the repository and names a file (an
    extension) or a folder (a final /) exists (paths with a placeholder — upper-case NAME, {a,b}, *, …,
    <x> — and build outputs are skipped).

Usage: check_refs.py SOURCE_ROOT. Prints one line per problem, then "N passed, N failed" (one check per
file).
"""
import os
import re
import sys

OUTSIDE = re.compile(r"\b(DECISIONS|SECURITY|PROTOCOLS|STACK-NOTES|ARCHITECTURE|STYLE)\.md\b|\.\./shared\b|"
                     r"\b(API|REMOTE|SDK-TS|ACP)-[A-Z][A-Z-]+\b")
LINK = re.compile(r"\[[^\]]*\]\(([^)\s]+)\)")
CODE = re.compile(r"`([^`\n]+)`")
TOP = ("host/", "plugins/", "plugin-api/", "docs/", "tests/", "bench/", "scripts/", "debian/", ".ci/")
PLACEHOLDER = re.compile(r"[A-Z]{2,}|[{}*<>…]|\.\.\.|\.so$|\.png$|build|BUILD")


def files(root):
    out = [os.path.join(root, "README.md")]
    for d, _, names in os.walk(os.path.join(root, "docs")):
        out += [os.path.join(d, n) for n in sorted(names) if n.endswith(".md")]
    return out


def check(root, path):
    problems = []
    text = open(path, encoding="utf-8").read()
    in_code = False
    for no, line in enumerate(text.split("\n"), 1):
        if line.lstrip().startswith("```"):
            in_code = not in_code
        m = OUTSIDE.search(line)
        if m:
            problems.append(f"{no}: refers to {m.group(0)}, which is not part of the repository")
        if in_code:
            continue
        for target in LINK.findall(line):
            if re.match(r"^[a-z]+:", target) or target.startswith("#") or not re.search(r"[./]", target):
                continue  # a URL, an anchor, or notation such as [name](uri)
            t = target.split("#", 1)[0]
            if t and not os.path.exists(os.path.normpath(os.path.join(os.path.dirname(path), t))):
                problems.append(f"{no}: the link {target} points to nothing")
        for span in CODE.findall(line):
            p = span.split()[0] if span.split() else ""
            if not p.startswith(TOP) or PLACEHOLDER.search(p):
                continue
            p = p.rstrip(".,:;)")
            last = p.rstrip("/").rsplit("/", 1)[-1]
            if not p.endswith("/") and "." not in last:
                continue  # a name such as the frame method host/remote-event, not a file
            if not os.path.exists(os.path.join(root, p)):
                problems.append(f"{no}: `{p}` does not exist in the repository")
    return problems


def main():
    root = sys.argv[1] if len(sys.argv) > 1 else "."
    passed = failed = 0
    for f in files(root):
        problems = check(root, f)
        rel = os.path.relpath(f, root)
        if problems:
            failed += 1
            for p in problems:
                print(f"{rel}:{p}")
        else:
            passed += 1
    print(f"{passed} passed, {failed} failed")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
