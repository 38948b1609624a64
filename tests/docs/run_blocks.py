#!/usr/bin/env python3
"""Runs the docs as a newcomer follows them: every fenced block marked runnable, in a fresh home.

The convention (README.md, "Runnable examples", explains it to writers):

  ```sh test            a shell block that runs; it fails the document when a command fails
  ```LANG test FILE     the block's text is written to FILE (relative to the current directory of the
                        document's shell) before the next block runs, e.g. ```c test app.c
  ```sh test finally    runs once after every document (e.g. the uninstall)

Each document's blocks run in order in one bash process (`set -eo pipefail`), so `cd`, `export` and
background jobs carry from one block to the next, starting in a copy of the repository (its tracked and
untracked-but-not-ignored files: what a fresh clone has). All documents share one fresh HOME, and run in
this order: docs/install.md, README.md, then the others by path — the install comes first, as for a
reader. The environment is a plain login's: PATH=/usr/local/bin:/usr/bin:/bin, HOME, USER, LANG=C.UTF-8,
no XDG_* and no AGENTHOST_* variables. When a document ends, whatever it left running (its process group)
is killed.

Usage: run_blocks.py SOURCE_ROOT [DOC...] (AH_DOCS_VERBOSE=1 shows every output). Prints each document's result and, for a failure, the block
(file:line) and the output's tail; then "N passed, N failed" (one check per document with runnable blocks).
"""
import os
import re
import shlex
import shutil
import signal
import subprocess
import sys
import tempfile
import threading

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import check_refs  # noqa: E402 (beside this file)

FENCE = re.compile(r"^```(\w+) test(?: (\S+))?\s*$")
FIRST = ("docs/install.md", "README.md")
DOC_TIMEOUT_S = 1200


def documents(root):
    """README.md and docs/ (check_refs.files, the same list the references check reads), install first."""
    rel = sorted(os.path.relpath(p, root) for p in check_refs.files(root))
    return [p for p in FIRST if p in rel] + [p for p in rel if p not in FIRST]


def blocks(path):
    """[(line, lang, target, text)] of the runnable blocks of `path`; target is None (run), 'finally' or a file."""
    out = []
    lines = open(path, encoding="utf-8").read().split("\n")
    i = 0
    while i < len(lines):
        line = lines[i]
        if not line.startswith("```"):
            i += 1
            continue
        m = FENCE.match(line)
        start = i + 1
        j = start
        while j < len(lines) and not lines[j].startswith("```"):
            j += 1
        if m:
            lang, target = m.group(1), m.group(2)
            if lang not in ("sh", "bash") and target in (None, "finally"):
                raise SystemExit(f"{path}:{start}: a ```{lang} test block needs a FILE to be written to")
            out.append((start, lang, target, "\n".join(lines[start:j]) + "\n"))
        i = j + 1
    return out


def copy_repository(root, dest):
    """The files a fresh clone has: tracked ones, plus untracked ones git does not ignore."""
    try:
        listed = subprocess.run(["git", "-C", root, "ls-files", "-z", "--cached", "--others", "--exclude-standard"],
                                check=True, capture_output=True).stdout.decode().split("\0")
    except (OSError, subprocess.CalledProcessError):
        listed = None
    if listed is None:
        shutil.copytree(root, dest, symlinks=True,
                        ignore=shutil.ignore_patterns(".git", "build*", "node_modules", "__pycache__"))
        return
    for rel in filter(None, listed):
        src = os.path.join(root, rel)
        if not os.path.lexists(src):
            continue  # deleted in the work tree, not yet in the index
        dst = os.path.join(dest, rel)
        os.makedirs(os.path.dirname(dst), exist_ok=True)
        if os.path.islink(src):
            os.symlink(os.readlink(src), dst)
        else:
            shutil.copy2(src, dst)


def heredoc(target, text):
    mark = "AH_DOC_BLOCK_END"
    while mark in text:
        mark += "_"
    return f"cat > {shlex.quote(target)} <<'{mark}'\n{text}{mark}\n"


def script_of(doc, items):
    """One bash script running `items` ([(line, lang, target, text)]) in order."""
    parts = ["set -eo pipefail\n"]
    for line, lang, target, text in items:
        where = f"{doc}:{line}"
        parts.append(f"echo {shlex.quote('>>> block ' + where)} >&2\n")
        if target and target != "finally":
            parts.append(heredoc(target, text))
        else:
            parts.append(text)
            parts.append("\n")
    parts.append("echo '>>> done' >&2\n")
    return "".join(parts)


def run_script(script, cwd, env, log_path):
    """Runs `script`; its output (a pipe, as in a terminal: `agenthost sdk` refuses a regular file) goes to
    `log_path`. Returns the exit status, or None after the timeout."""
    p = subprocess.Popen(["bash", "-c", script], cwd=cwd, env=env, stdin=subprocess.DEVNULL,
                         stdout=subprocess.PIPE, stderr=subprocess.STDOUT, start_new_session=True)
    chunks = []
    reader = threading.Thread(target=lambda: chunks.extend(iter(lambda: p.stdout.read(65536), b"")))
    reader.start()
    try:
        code = p.wait(timeout=DOC_TIMEOUT_S)
    except subprocess.TimeoutExpired:
        code = None
    try:
        os.killpg(p.pid, signal.SIGKILL)  # what the document left running
    except ProcessLookupError:
        pass
    if code is None:
        p.wait()
    reader.join(timeout=30)
    p.stdout.close()
    with open(log_path, "wb") as log:
        log.write(b"".join(chunks))
    return code


def report(name, code, log_path):
    text = open(log_path, encoding="utf-8", errors="replace").read()
    if code == 0 and text.rstrip().endswith(">>> done"):
        print(f"ok   {name}")
        if os.environ.get("AH_DOCS_VERBOSE"):
            for line in text.rstrip().split("\n"):
                print(f"     | {line}")
        return True
    started = re.findall(r">>> block (\S+)", text)
    where = started[-1] if started else "(before the first block)"
    why = "timed out" if code is None else f"exit status {code}"
    print(f"FAIL {name}: the block at {where} failed ({why}); the output's end:")
    for line in text.rstrip().split("\n")[-40:]:
        print(f"     | {line}")
    return False


def main():
    if len(sys.argv) < 2:
        print(__doc__)
        return 2
    root = os.path.abspath(sys.argv[1])
    wanted = sys.argv[2:]
    base = tempfile.mkdtemp(prefix="ah-docs-")
    try:
        home = os.path.join(base, "home")
        os.makedirs(home)
        repo = os.path.join(base, "agenthost")
        os.makedirs(repo)
        copy_repository(root, repo)
        env = {"PATH": "/usr/local/bin:/usr/bin:/bin", "HOME": home, "USER": os.environ.get("USER", "user"),
               "LOGNAME": os.environ.get("LOGNAME", os.environ.get("USER", "user")), "LANG": "C.UTF-8",
               "TERM": "dumb", "SHELL": "/bin/bash", "TMPDIR": os.path.join(base, "tmp")}
        os.makedirs(env["TMPDIR"])
        passed = failed = 0
        finals = []
        for doc in documents(root):
            items = blocks(os.path.join(root, doc))
            if wanted and doc not in wanted:
                continue
            finals += [(doc, b) for b in items if b[2] == "finally"]
            items = [b for b in items if b[2] != "finally"]
            if not items:
                continue
            log = os.path.join(base, doc.replace("/", "_") + ".log")
            code = run_script(script_of(doc, items), repo, env, log)
            if report(doc, code, log):
                passed += 1
            else:
                failed += 1
        if finals:
            script = "".join(script_of(doc, [b]).replace("echo '>>> done' >&2\n", "") for doc, b in finals)
            log = os.path.join(base, "finally.log")
            code = run_script(script + "echo '>>> done' >&2\n", repo, env, log)
            if report("(the finally blocks)", code, log):
                passed += 1
            else:
                failed += 1
        print(f"{passed} passed, {failed} failed")
        return 1 if failed or not passed else 0
    finally:
        shutil.rmtree(base, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
