#!/usr/bin/env python3
"""Writes agenthost(1) from the text of `agenthost --help`, so the man page and --help list the same
commands and options (tests/docs/check_commands.py checks all three against the admin guide).

Usage: manpage.py AGENTHOST OUT VERSION
"""
import re
import subprocess
import sys


def roff(text):
    text = text.replace("\\", "\\e").replace("-", "\\-")
    return "\\&" + text if text.startswith((".", "'")) else text


COLUMN = 28  # where --help starts a description


def entries(lines):
    """[(usage, description)] of --help's two-column list: the description starts at COLUMN, or on the next
    lines (indented to it) after a usage too long for the first column."""
    out = []
    for line in lines:
        if not line.strip():
            continue
        if line.startswith("  ") and line[2] != " ":
            if len(line) > COLUMN and line[COLUMN - 1] == " ":
                out.append([line[:COLUMN].strip(), line[COLUMN:].strip()])
            else:
                out.append([line.strip(), ""])
        elif out:
            out[-1][1] = (out[-1][1] + " " + line.strip()).strip()
    return out


def help_sections(agenthost):
    """{"commands": [(usage, description)], "options": [...]} of `agenthost --help` (also read by
    tests/docs/check_commands.py, so both see the same list)."""
    text = subprocess.run([agenthost, "--help"], check=True, capture_output=True, text=True).stdout
    sections, name = {}, None
    for line in text.split("\n"):
        if line.endswith(":") and not line.startswith(" "):
            name = line[:-1]
            sections[name] = []
        elif name:
            sections[name].append(line)
    return {k: entries(v) for k, v in sections.items()}


def main():
    agenthost, out, version = sys.argv[1:4]
    sections = help_sections(agenthost)
    page = [
        f'.TH AGENTHOST 1 "" "agenthost {version}" "User Commands"',
        ".SH NAME",
        "agenthost \\- runs AI\\-agent sessions and serves them to browsers, editors and programs",
        ".SH SYNOPSIS",
        ".B agenthost",
        "[\\fIoptions\\fR] \\fIcommand\\fR [\\fIargs\\fR]",
        ".SH DESCRIPTION",
        "agenthost runs AI\\-agent sessions from one durable store and serves them at once to a web UI, to "
        "editors speaking the Agent Client Protocol, and to programs through its SDK (JSON\\-RPC over stdio). "
        "Its surfaces are plugins it loads, unloads and reloads while it runs.",
    ]
    for title in ("commands", "options"):
        page.append(f".SH {title.upper()}")
        for usage, desc in sections.get(title, []):
            page += [".TP", f".B {roff(usage)}", roff(desc)]
    page += [
        ".SH FILES",
        ".TP",
        ".I ~/.config/agenthost/agenthost.ini",
        "the configuration, read when it exists ($XDG_CONFIG_HOME)",
        ".TP",
        ".I ~/.local/state/agenthost/",
        "the state directory: agenthost.db (the sessions), the browser token, the audit log ($XDG_STATE_HOME)",
        ".TP",
        ".I $XDG_RUNTIME_DIR/agenthost/",
        "the runtime directory: admin.sock and serve.lock (STATE_DIR/run without XDG_RUNTIME_DIR)",
        ".SH EXIT STATUS",
        "0 on success; 1 when the command failed (no daemon answers, start\\-up failed, an error answer); "
        "2 for a usage or configuration error; 3 from \\fBstatus\\fR when the store is not healthy.",
        ".SH SEE ALSO",
        "The administration guide and the protocol references in the project's docs/ directory.",
        "",
    ]
    with open(out, "w", encoding="utf-8") as f:
        f.write("\n".join(page))
    return 0


if __name__ == "__main__":
    sys.exit(main())
