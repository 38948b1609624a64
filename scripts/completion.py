#!/usr/bin/env python3
"""Write the bash completion of agenthost from the text of `agenthost --help` (read by the man page's own
reader, scripts/manpage.py), so that the completion, the man page and --help name the same commands and
options.

Usage: completion.py AGENTHOST OUTPUT
"""
import importlib.util
import os
import re
import sys

WORD = re.compile(r"^[a-z][a-z-]*$")
CHOICES = re.compile(r"^[a-z]+( \| [a-z]+)+$")


def manpage_module():
    here = os.path.dirname(os.path.abspath(__file__))
    spec = importlib.util.spec_from_file_location("manpage", os.path.join(here, "manpage.py"))
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def split_usage(usage):
    """'sessions list [--json]' -> (['sessions', 'list'], ['--json'], takes_files)."""
    words, rest = [], usage.split()
    while rest and WORD.match(rest[0]):
        words.append(rest.pop(0))
    tail = " ".join(rest)
    flags = sorted(set(re.findall(r"--[a-z][a-z-]*", tail)))
    files = bool(re.search(r"\b(FILE|PATH)\b", tail))
    return words, flags, files


def quote(words):
    return " ".join(words)


def generate(sections):
    commands = {}  # first word -> {sub or '': (flags, files)}
    for usage, _ in sections.get("commands", []):
        words, flags, files = split_usage(usage)
        if not words:
            continue
        sub = " ".join(words[1:])
        commands.setdefault(words[0], {})[sub] = (flags, files)
    with_arg, file_opts, dir_opts, choice_opts, all_opts = [], [], [], {}, []
    for usage, text in sections.get("options", []):
        names = [w.rstrip(",") for w in usage.split() if w.startswith("-")]
        all_opts += names
        arg = [w for w in usage.split() if not w.startswith("-")]
        if not arg:
            continue
        with_arg += names
        if CHOICES.match(text.strip()):
            for n in names:
                choice_opts[n] = text.replace("|", " ").split()
        elif arg[0] == "DIR":
            dir_opts += names
        elif arg[0] == "FILE":
            file_opts += names
    out = [
        "# bash completion for agenthost(1): generated from `agenthost --help` by scripts/completion.py",
        "_agenthost() {",
        '  local cur="${COMP_WORDS[COMP_CWORD]}" prev="${COMP_WORDS[COMP_CWORD-1]}"',
        '  case "$prev" in',
    ]
    for n, values in sorted(choice_opts.items()):
        out.append(f'    {n}) COMPREPLY=($(compgen -W "{quote(values)}" -- "$cur")); return ;;')
    if file_opts:
        out.append(f'    {"|".join(file_opts)}) COMPREPLY=($(compgen -f -- "$cur")); return ;;')
    if dir_opts:
        out.append(f'    {"|".join(dir_opts)}) COMPREPLY=($(compgen -d -- "$cur")); return ;;')
    other = [n for n in with_arg if n not in file_opts and n not in dir_opts and n not in choice_opts]
    if other:
        out.append(f'    {"|".join(other)}) COMPREPLY=(); return ;;')
    out += [
        "  esac",
        '  local i=1 cmd="" sub="" w',
        '  while [ "$i" -lt "$COMP_CWORD" ]; do',
        '    w="${COMP_WORDS[i]}"',
        '    case "$w" in',
        f'      {"|".join(with_arg)}) i=$((i + 2)); continue ;;',
        "      -*) ;;",
        '      *) if [ -z "$cmd" ]; then cmd="$w"; elif [ -z "$sub" ]; then sub="$w"; fi ;;',
        "    esac",
        "    i=$((i + 1))",
        "  done",
        '  if [ -z "$cmd" ]; then',
        '    case "$cur" in',
        f'      -*) COMPREPLY=($(compgen -W "{quote(all_opts)}" -- "$cur")) ;;',
        f'      *) COMPREPLY=($(compgen -W "{quote(sorted(commands))}" -- "$cur")) ;;',
        "    esac",
        "    return",
        "  fi",
        '  local flags="" files=0',
        '  case "$cmd" in',
    ]
    for cmd in sorted(commands):
        subs = commands[cmd]
        named = sorted(s for s in subs if s)
        out.append(f"    {cmd})")
        if named:
            out.append('      if [ -z "$sub" ]; then')
            out.append(f'        COMPREPLY=($(compgen -W "{quote(named)}" -- "$cur"))')
            out.append("        return")
            out.append("      fi")
            out.append('      case "$sub" in')
            for s in named:
                flags, files = subs[s]
                out.append(f'        {s}) flags="{quote(flags)}"; files={int(files)} ;;')
            out.append("      esac")
        else:
            flags, files = subs[""]
            out.append(f'      flags="{quote(flags)}"; files={int(files)}')
        out.append("      ;;")
    out += [
        "  esac",
        '  case "$cur" in',
        '    -*) COMPREPLY=($(compgen -W "$flags" -- "$cur")) ;;',
        '    *) if [ "$files" = 1 ]; then COMPREPLY=($(compgen -f -- "$cur")); else COMPREPLY=(); fi ;;',
        "  esac",
        "}",
        "complete -F _agenthost agenthost",
        "",
    ]
    return "\n".join(out)


def main():
    if len(sys.argv) != 3:
        sys.exit("usage: completion.py AGENTHOST OUTPUT")
    text = generate(manpage_module().help_sections(sys.argv[1]))
    with open(sys.argv[2], "w", encoding="utf-8") as f:
        f.write(text)


if __name__ == "__main__":
    main()
