#!/usr/bin/env python3
"""Checks the invariants ARCHITECTURE.md states, so they hold by test and not by hope.

- The crate layering: each crate depends only on the workspace crates listed below
  (normal dependencies; dev-dependencies may reach further for reference checks).
- No module cycle inside a crate (a module is a top-level `mod` of the crate: `crate::x`).
- `unsafe` only in the crates that need it (kernels, the mmap in formats, the Python FFI).
- No source file over the length limit outside tests.
- No function over the length limit outside tests and the kernels crate.
- Every crate root denies `missing_docs`.

Exits 1 naming every violation. Standard library only (runs before any venv exists).
"""
import json
import os
import re
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

# Workspace crates each crate may depend on (normal dependencies).
LAYERS = {
    "strata-kernels": set(),
    "strata-formats": {"strata-kernels"},
    "strata-model": {"strata-kernels", "strata-formats"},
    "strata-runtime": {"strata-model", "strata-formats"},
    "strata-accel": set(),
    "strata-policy": set(),
    "strata-sim": {"strata-policy"},
    "strata-exec": {"strata-accel", "strata-formats", "strata-kernels", "strata-model", "strata-policy", "strata-sim"},
    "strata-server": {"strata-runtime", "strata-model"},
}
UNSAFE_CRATES = {"kernels", "formats", "python"}
MAX_LINES = 800
# Files still over the limit, each with the issue that splits it. Shrink, never grow.
LONG_FILES: set[str] = set()

MAX_FN_LINES = 150
# Functions still over the limit, as "path::name": reason. Shrink, never grow.
LONG_FNS: dict[str, str] = {}

USE_CRATE = re.compile(r"\bcrate::([a-z_][a-z0-9_]*)")
USE_GROUP = re.compile(r"\buse\s+crate::\{([^;]*)\}", re.S)


def cargo_deps():
    out = subprocess.run(
        ["cargo", "metadata", "--no-deps", "--format-version", "1", "--offline"],
        cwd=ROOT, check=True, capture_output=True, text=True,
    ).stdout
    deps = {}
    for p in json.loads(out)["packages"]:
        deps[p["name"]] = {
            d["name"] for d in p["dependencies"]
            if d["name"].startswith("strata-") and d.get("kind") is None
        }
    return deps


def crate_sources(crate_dir):
    src = os.path.join(crate_dir, "src")
    for dirpath, _, files in os.walk(src):
        for f in files:
            if f.endswith(".rs"):
                yield os.path.join(dirpath, f)


def top_module(crate_dir, path):
    rel = os.path.relpath(path, os.path.join(crate_dir, "src"))
    first = rel.split(os.sep)[0]
    name = first[:-3] if first.endswith(".rs") else first
    return None if name in ("lib", "main") else name


def code_of(text):
    """The code a module depends through: no comments (doc links are not dependencies),
    no test module (tests may reach anywhere in their crate)."""
    i = text.find("#[cfg(test)]")
    text = text if i < 0 else text[:i]
    return "\n".join(re.sub(r"//.*", "", line) for line in text.splitlines())


RAW_STRING = re.compile(r'b?r(#*)"')
IDENT_CHAR = re.compile(r"\w")
CHAR_LITERAL = re.compile(r"'(\\.[^']*|[^\\'])'")


def blank_literals(text):
    """`text` with comments, strings and char literals blanked (newlines kept), so that
    braces count code only."""
    out, i, n = [], 0, len(text)
    while i < n:
        c = text[i]
        if text.startswith("//", i):
            j = text.find("\n", i)
            j = n if j < 0 else j
            out.append(" " * (j - i))
            i = j
        elif text.startswith("/*", i):
            depth, j = 1, i + 2
            while j < n and depth:
                if text.startswith("/*", j):
                    depth, j = depth + 1, j + 2
                elif text.startswith("*/", j):
                    depth, j = depth - 1, j + 2
                else:
                    j += 1
            out.append(re.sub(r"[^\n]", " ", text[i:j]))
            i = j
        elif (m := RAW_STRING.match(text, i)) and not (i and IDENT_CHAR.match(text[i - 1])):
            end = '"' + m.group(1)
            j = text.find(end, m.end())
            j = n if j < 0 else j + len(end)
            out.append(re.sub(r"[^\n]", " ", text[i:j]))
            i = j
        elif c == '"':
            j = i + 1
            while j < n and text[j] != '"':
                j += 2 if text[j] == "\\" else 1
            out.append(re.sub(r"[^\n]", " ", text[i:j + 1]))
            i = j + 1
        elif c == "'" and (m := CHAR_LITERAL.match(text, i)):
            out.append(" " * (m.end() - i))
            i = m.end()
        else:
            out.append(c)
            i += 1
    return "".join(out)


FN_DECL = re.compile(r"\bfn\s+([A-Za-z_][A-Za-z0-9_]*)")


def long_functions(text):
    """`(name, first line, lines)` of every function body over MAX_FN_LINES lines, outside
    the file's test module."""
    i = text.find("#[cfg(test)]")
    code = blank_literals(text if i < 0 else text[:i])
    found = []
    for m in FN_DECL.finditer(code):
        # The body opens at the first `{` after the signature; a `;` first means no body.
        j = m.end()
        depth_paren = 0
        while j < len(code):
            ch = code[j]
            if ch in "(<[":
                depth_paren += 1
            elif ch in ")>]":
                depth_paren -= 1
            elif ch == ";" and depth_paren <= 0:
                j = -1
                break
            elif ch == "{" and depth_paren <= 0:
                break
            j += 1
        if j < 0 or j >= len(code):
            continue
        depth, k = 0, j
        while k < len(code):
            if code[k] == "{":
                depth += 1
            elif code[k] == "}":
                depth -= 1
                if depth == 0:
                    break
            k += 1
        first = code.count("\n", 0, m.start()) + 1
        lines = code.count("\n", m.start(), k) + 1
        if lines > MAX_FN_LINES:
            found.append((m.group(1), first, lines))
    return found


def module_cycles(crate_dir):
    edges = {}
    for path in crate_sources(crate_dir):
        m = top_module(crate_dir, path)
        if m is None or path.endswith("tests.rs"):
            continue
        text = code_of(open(path, encoding="utf-8").read())
        targets = set(USE_CRATE.findall(text))
        for group in USE_GROUP.findall(text):
            targets.update(re.findall(r"(?:^|[,{\s])([a-z_][a-z0-9_]*)(?:::|\s*[,}]|$)", group))
        targets.discard(m)
        targets.discard("self")
        edges.setdefault(m, set()).update(
            t for t in targets
            if os.path.exists(os.path.join(crate_dir, "src", t + ".rs"))
            or os.path.isdir(os.path.join(crate_dir, "src", t))
        )
    # Tarjan's strongly connected components.
    index, low, stack, on, sccs, counter = {}, {}, [], set(), [], [0]

    def visit(v):
        index[v] = low[v] = counter[0]
        counter[0] += 1
        stack.append(v)
        on.add(v)
        for w in edges.get(v, ()):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                sccs.append(sorted(comp))

    for v in list(edges):
        if v not in index:
            visit(v)
    return sccs


def main():
    problems = []
    deps = cargo_deps()
    for crate, allowed in LAYERS.items():
        extra = deps.get(crate, set()) - allowed
        if extra:
            problems.append(f"{crate} depends on {sorted(extra)}; allowed: {sorted(allowed) or 'none'}")
    crates = os.path.join(ROOT, "crates")
    for name in sorted(os.listdir(crates)):
        d = os.path.join(crates, name)
        if not os.path.isdir(os.path.join(d, "src")):
            continue
        for comp in module_cycles(d):
            problems.append(f"crates/{name}: module cycle between {', '.join(comp)}")
        for root in ("lib.rs", "main.rs"):
            path = os.path.join(d, "src", root)
            if os.path.exists(path) and "#![deny(missing_docs)]" not in open(path).read():
                problems.append(f"crates/{name}/src/{root}: no #![deny(missing_docs)]")
        for path in crate_sources(d):
            rel = os.path.relpath(path, ROOT)
            text = open(path, encoding="utf-8").read()
            if name not in UNSAFE_CRATES and re.search(r"\bunsafe\s*(\{|fn|impl)", text):
                problems.append(f"{rel}: `unsafe` outside the kernels, mmap and FFI crates")
            if name != "kernels" and not rel.endswith("tests.rs"):
                for fname, line, n in long_functions(text):
                    key = f"{rel}::{fname}"
                    if key not in LONG_FNS:
                        problems.append(f"{rel}:{line}: fn {fname} is {n} lines (limit {MAX_FN_LINES})")
            lines = text.count("\n")
            if lines > MAX_LINES and rel not in LONG_FILES and not rel.endswith("tests.rs"):
                problems.append(f"{rel}: {lines} lines (limit {MAX_LINES})")
    for p in problems:
        print("architecture:", p)
    if problems:
        sys.exit(1)
    print("architecture: layering, module cycles, unsafe, file and function lengths, docs hold")


if __name__ == "__main__":
    main()
