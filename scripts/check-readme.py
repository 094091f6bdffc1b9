#!/usr/bin/env python3
"""Runs the README's code blocks and fails if one breaks.

- ```python blocks run as they are, with the interpreter given by --python (a venv where
  `pip install ./bindings/python` was done).
- ```sh blocks: each command runs as written, from the repository root, with
  target/release on PATH and HOME set to a scratch directory (so `$HOME/.local` installs go
  there); `app.c` is the C example. A command that is a synopsis (`[...]`, `a|b`, or UPPERCASE
  placeholders) or needs a GPU cannot run as written: every `--flag` it shows must then be in
  its subcommand's `--help`. `bash scripts/test-all.sh` (the suite that runs this check) is
  not run again.

Usage: scripts/check-readme.py [--python PY] [README.md]. Prints one line per command and a
closing "N passed, N failed" line; exits non-zero when one failed.
"""

import os
import re
import shlex
import shutil
import subprocess
import sys
import tempfile

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
PLACEHOLDER = re.compile(r"\[|\]|\b[A-Z][A-Z0-9_]{2,}\b(?!=)|\w\|\w")
NOT_AGAIN = {"bash scripts/test-all.sh"}


def blocks(text: str):
    """(language, code) of each fenced block."""
    for m in re.finditer(r"^```(\w*)\n(.*?)^```", text, re.S | re.M):
        yield m.group(1), m.group(2)


def commands(code: str):
    """Logical shell lines: comments cut, indented lines joined to the line above."""
    out = []
    for line in code.splitlines():
        line = re.sub(r"\s#\s.*$", "", line).rstrip()
        if not line.strip():
            continue
        if line.startswith((" ", "\t")) and out:
            out[-1] += " " + line.strip()
        else:
            out.append(line.strip())
    return out


def is_synopsis(cmd: str) -> bool:
    bare = re.sub(r"\"[^\"]*\"|'[^']*'|\$\w+|\$\{\w+\}|\$\([^)]*\)", "", cmd)
    bare = re.sub(r"^(\w+=\S+\s+)+", "", bare)  # leading VAR=value
    return bool(PLACEHOLDER.search(bare)) or "cuda" in cmd


def help_of(cmd: str) -> tuple[list[str], str]:
    """The `--help` command of a synopsis line's program and subcommand."""
    words = [w for w in re.sub(r"^(\w+=\S+\s+)+", "", cmd).split() if w]
    prog = words[0]
    if prog == "fastllm" and len(words) > 1 and not words[1].startswith("-"):
        return ["fastllm", words[1], "--help"], prog + " " + words[1]
    return [prog, "--help"], prog


def check_flags(cmd: str, env) -> str | None:
    argv, what = help_of(cmd)
    r = subprocess.run(argv, env=env, capture_output=True, text=True, cwd=ROOT)
    if r.returncode != 0:
        return f"`{' '.join(argv)}` failed: {r.stderr.strip()[:300]}"
    missing = [f for f in sorted(set(re.findall(r"(?<![\w-])--[a-z][a-z0-9-]*", cmd)))
               if f not in r.stdout]
    if missing:
        return f"{what} --help does not know {', '.join(missing)}"
    return None


def run(cmd: str, env, cwd) -> str | None:
    r = subprocess.run(["bash", "-c", "set -eo pipefail\n" + cmd], env=env, cwd=cwd,
                       capture_output=True, text=True, timeout=1200)
    if r.returncode != 0:
        return f"exit {r.returncode}: {(r.stderr or r.stdout).strip()[-600:]}"
    return None


def main() -> int:
    args = sys.argv[1:]
    python = sys.executable
    if args[:1] == ["--python"]:
        python, args = os.path.abspath(args[1]), args[2:]
    readme = args[0] if args else os.path.join(ROOT, "README.md")
    text = open(readme, encoding="utf-8").read()
    scratch = tempfile.mkdtemp(prefix="fastllm-readme-")
    home = os.path.join(scratch, "home")
    os.makedirs(home)
    shutil.copy(os.path.join(ROOT, "bindings/c/examples/generate.c"), os.path.join(ROOT, "app.c"))
    env = dict(os.environ)
    # the models stay in the user's cache (fetched once), though HOME is the scratch one
    xdg = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    env.setdefault("FASTLLM_CACHE_DIR", os.path.join(xdg, "fastllm"))
    env["HOME"] = home
    # the venv first (its `pip`), then the built tools
    env["PATH"] = os.pathsep.join([os.path.dirname(os.path.abspath(python)),
                                   os.path.join(ROOT, "target/release"), env["PATH"]])
    env.setdefault("CARGO_HOME", os.path.join(os.environ.get("HOME", home), ".cargo"))
    env.setdefault("RUSTUP_HOME", os.path.join(os.environ.get("HOME", home), ".rustup"))
    # `cargo install` reuses the build the suite already made
    env["CARGO_TARGET_DIR"] = os.path.join(ROOT, "target")
    passed, failed = 0, 0
    try:
        for lang, code in blocks(text):
            if lang == "python":
                items = [("python", code)]
            elif lang in ("sh", "bash", "shell"):
                items = [("sh", c) for c in commands(code)]
            else:
                continue
            for kind, cmd in items:
                label = cmd.splitlines()[0][:90]
                if cmd in NOT_AGAIN:
                    print(f"skip  {label}  (this suite)")
                    continue
                if kind == "python":
                    r = subprocess.run([python, "-c", cmd], env=env, cwd=scratch,
                                       capture_output=True, text=True, timeout=1200)
                    err = None if r.returncode == 0 else f"exit {r.returncode}: {r.stderr.strip()[-600:]}"
                elif is_synopsis(cmd):
                    err = check_flags(cmd, env)
                    label = "flags " + label
                else:
                    # cargo install into the scratch HOME, not the user's
                    c = cmd.replace("cargo install ", f"cargo install --root {home}/.cargo-root ", 1)
                    err = run(c, env, ROOT)
                if err:
                    failed += 1
                    print(f"FAIL  {label}\n      {err}")
                else:
                    passed += 1
                    print(f"ok    {label}")
    finally:
        os.remove(os.path.join(ROOT, "app.c"))
        for junk in ("app",):
            p = os.path.join(ROOT, junk)
            if os.path.exists(p):
                os.remove(p)
        shutil.rmtree(scratch, ignore_errors=True)
    print(f"README: {passed} passed, {failed} failed")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
