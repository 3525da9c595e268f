"""The private cuFile configuration of a qualification run.

cuFile reads its configuration from /etc/cufile.json unless the environment
variable CUFILE_ENV_PATH_JSON names another file. benches.gds copies the
host's file, changes only what native qualification needs (per-process
statistics at level 3, compatibility mode disabled, cuFile's log in the run
directory) and points CUFILE_ENV_PATH_JSON at the copy: the system
configuration is never touched.

cufile.json is JSON with comments (// to the end of a line, /* ... */) and,
where an entry was commented out, an occasional trailing comma; strip_comments
removes both outside string literals.
"""

from __future__ import annotations

import json
import os
from typing import Optional

ENV_PATH = "CUFILE_ENV_PATH_JSON"


class ConfigError(ValueError):
    pass


def strip_comments(text: str) -> str:
    """JSON text without // and /* */ comments and without trailing commas;
    string literals (which may contain // and /*) are kept byte for byte."""
    out = []
    i, n = 0, len(text)
    while i < n:
        c = text[i]
        if c == '"':
            j = i + 1
            while j < n and text[j] != '"':
                j += 2 if text[j] == "\\" else 1
            out.append(text[i : j + 1])
            i = j + 1
        elif text.startswith("//", i):
            j = text.find("\n", i)
            i = n if j < 0 else j
        elif text.startswith("/*", i):
            j = text.find("*/", i + 2)
            if j < 0:
                raise ConfigError("unterminated /* comment")
            out.append(" ")
            i = j + 2
        else:
            out.append(c)
            i += 1
    s = "".join(out)
    # Trailing commas: a comma followed (after whitespace) by } or ], outside strings.
    result = []
    i, n = 0, len(s)
    while i < n:
        c = s[i]
        if c == '"':
            j = i + 1
            while j < n and s[j] != '"':
                j += 2 if s[j] == "\\" else 1
            result.append(s[i : j + 1])
            i = j + 1
            continue
        if c == ",":
            j = i + 1
            while j < n and s[j] in " \t\r\n":
                j += 1
            if j < n and s[j] in "}]":
                i += 1
                continue
        result.append(c)
        i += 1
    return "".join(result)


def load(path: str) -> dict:
    try:
        with open(path, encoding="utf-8") as f:
            text = f.read()
    except OSError as e:
        raise ConfigError(f"cannot read {path}: {e.strerror}") from None
    try:
        data = json.loads(strip_comments(text))
    except json.JSONDecodeError as e:
        raise ConfigError(f"{path} is not valid cuFile JSON: {e}") from None
    if not isinstance(data, dict):
        raise ConfigError(f"{path}: the top level is not an object")
    return data


def find_source(
    explicit: Optional[str], cufile_library: Optional[str], environ: dict, root: str = "/"
) -> tuple[Optional[str], list[str]]:
    """The cufile.json to copy and every place looked at: --cufile-json, then the
    caller's CUFILE_ENV_PATH_JSON, /etc/cufile.json, and the copy that ships
    with the toolkit next to the library (<lib>/../gds/cufile.json)."""
    candidates = []
    if explicit:
        return (explicit if os.path.isfile(explicit) else None), [explicit]
    if environ.get(ENV_PATH):
        candidates.append(environ[ENV_PATH])
    candidates.append(os.path.join(root, "etc/cufile.json"))
    if cufile_library:
        lib_dir = os.path.dirname(os.path.realpath(cufile_library))
        candidates.append(os.path.normpath(os.path.join(lib_dir, "..", "gds", "cufile.json")))
    candidates.append(os.path.join(root, "usr/local/cuda/gds/cufile.json"))
    for c in candidates:
        if os.path.isfile(c):
            return c, candidates
    return None, candidates


def native_overlay(data: dict, log_dir: str) -> dict:
    """A copy of `data` with statistics at level 3, compatibility mode off and
    cuFile's log in `log_dir`; every other setting as it was."""
    out = json.loads(json.dumps(data))
    for section in ("profile", "properties", "logging"):
        if section in out and not isinstance(out[section], dict):
            raise ConfigError(f'"{section}" in cufile.json is not an object')
        out.setdefault(section, {})
    out["profile"]["cufile_stats"] = 3
    out["properties"]["allow_compat_mode"] = False
    # Older and newer spellings, changed only where the file has them.
    for key in ("use_compat_mode", "force_compat_mode"):
        if key in out["properties"]:
            out["properties"][key] = False
    out["logging"]["dir"] = log_dir
    return out


def write_private(source: str, dest: str, log_dir: str) -> dict:
    """Writes the overlay of `source` to `dest` (a new file, mode 0600) and
    returns what was written."""
    data = native_overlay(load(source), log_dir)
    fd = os.open(dest, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(fd, "w", encoding="utf-8") as f:
        json.dump(data, f, indent=2)
        f.write("\n")
    return data


def check_written(dest: str) -> Optional[str]:
    """Why the private file does not say what qualification needs (None: it does)."""
    data = load(dest)
    if data.get("profile", {}).get("cufile_stats") != 3:
        return f"{dest}: profile.cufile_stats is not 3"
    props = data.get("properties", {})
    if props.get("allow_compat_mode") is not False:
        return f"{dest}: properties.allow_compat_mode is not false"
    for key in ("use_compat_mode", "force_compat_mode"):
        if props.get(key, False) is not False:
            return f"{dest}: properties.{key} is not false"
    return None
