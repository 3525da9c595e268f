#!/usr/bin/env python3
"""Checks the lock annotations of src/manager and src/common under clang.

Runs every C++ source of those folders that a clang build compiles (its
compile_commands.json) with -fsyntax-only -Wthread-safety
-Werror=thread-safety: the analysis without code generation, so it is cheap
on a small machine. Usage: thread_safety_check.py BUILD_DIR (a clang build).
Exits non-zero on the first file that fails, after printing clang's errors.
"""
import json
import os
import shlex
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor

FOLDERS = ("src/manager/", "src/common/")


def syntax_only(entry):
    args = shlex.split(entry["command"]) if "command" in entry else list(entry["arguments"])
    if os.path.basename(args[0]) == "ccache":
        args = args[1:]
    out, skip = [], False
    for a in args:
        if skip:
            skip = False
            continue
        if a in ("-o", "-MF", "-MT", "-MQ"):
            skip = True
            continue
        if a in ("-c", "-MD", "-MMD"):
            continue
        out.append(a)
    out += ["-fsyntax-only", "-Wthread-safety", "-Werror=thread-safety"]
    r = subprocess.run(out, cwd=entry["directory"], capture_output=True, text=True)
    return entry["file"], r.returncode, r.stderr


def main():
    build = sys.argv[1]
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    with open(os.path.join(build, "compile_commands.json")) as f:
        entries = json.load(f)
    mine = [e for e in entries
            if os.path.relpath(os.path.abspath(e["file"]), root).startswith(FOLDERS)]
    if not any("clang" in (e.get("command") or " ".join(e["arguments"])) for e in mine):
        sys.exit(f"{build}: not a clang build of {', '.join(FOLDERS)}")
    with ThreadPoolExecutor(max_workers=os.cpu_count() or 2) as pool:
        results = list(pool.map(syntax_only, mine))
    failed = [(f, err) for f, rc, err in results if rc != 0]
    for f, err in failed:
        print(err, end="")
    print(f"thread-safety analysis: {len(mine) - len(failed)} of {len(mine)} files clean")
    sys.exit(1 if failed else 0)


if __name__ == "__main__":
    main()
