#!/usr/bin/env python3
"""Fails when the modules of a crate import each other in a cycle, or a file is too long.

Usage: scripts/import-cycles.py [SRC_DIR] [MAX_LINES]   (default lock-runtime/src, 600)

A module is one file. An edge A -> B is a `use` in A that names an item of B (through
`crate::`, `super::` or `self::`); a parent declaring `mod b;` is no edge, and neither is a
child naming its parent's items through `super::` (the parent's own code does not depend on
the child for that). A cycle among the rest is reported with its files, as is any file over
MAX_LINES lines.
"""

import os
import re
import sys

SRC = sys.argv[1] if len(sys.argv) > 1 else "lock-runtime/src"
MAX_LINES = int(sys.argv[2]) if len(sys.argv) > 2 else 600


def module_of(path):
    rel = os.path.relpath(path, SRC)[: -len(".rs")].split(os.sep)
    if rel[-1] in ("lib", "mod", "main"):
        rel = rel[:-1]
    return tuple(rel)


files = {}
for root, _, names in os.walk(SRC):
    for name in names:
        if name.endswith(".rs"):
            path = os.path.join(root, name)
            files[module_of(path)] = path
modules = set(files)


def use_paths(text):
    """Every path a `use` names, with braces expanded: `use a::{b, c::d};` -> a::b, a::c::d."""
    text = re.sub(r"//[^\n]*", "", text)
    for stmt in re.finditer(r"(?:^|\n)\s*(?:pub(?:\([^)]*\))?\s+)?use\s+([^;]+);", text):
        yield from expand(re.sub(r"\s+", "", stmt.group(1)))


def expand(tree):
    depth, start = 0, None
    for i, c in enumerate(tree):
        if c == "{":
            if depth == 0:
                start = i
            depth += 1
        elif c == "}":
            depth -= 1
            if depth == 0:
                prefix = tree[:start]
                for part in split_top(tree[start + 1 : i]):
                    yield from expand(prefix + part)
                return
    yield tree


def split_top(inner):
    depth, part = 0, ""
    for c in inner:
        if c == "," and depth == 0:
            if part:
                yield part
            part = ""
            continue
        depth += c == "{"
        depth -= c == "}"
        part += c
    if part:
        yield part


def target(module, path):
    segs = path.split(" as ")[0].split("::")
    if segs[0] == "crate":
        base, rest = (), segs[1:]
    elif segs[0] in ("super", "self"):
        base = module
        rest = segs
        while rest and rest[0] in ("super", "self"):
            if rest[0] == "super":
                base = base[:-1]
            rest = rest[1:]
    else:
        return None  # another crate
    mod = base
    for seg in rest:
        if mod + (seg,) in modules:
            mod = mod + (seg,)
        else:
            break
    return mod


edges = {m: set() for m in modules}
for module, path in files.items():
    with open(path, encoding="utf-8") as f:
        text = f.read()
    for used in use_paths(text):
        to = target(module, used)
        if to is None or to == module:
            continue
        if module[: len(to)] == to:
            continue  # a child naming its ancestor's items
        edges[module].add(to)

# Tarjan's strongly connected components.
index, low, stack, on, sccs, counter = {}, {}, [], set(), [], [0]


def visit(v):
    index[v] = low[v] = counter[0]
    counter[0] += 1
    stack.append(v)
    on.add(v)
    for w in edges[v]:
        if w not in index:
            visit(w)
            low[v] = min(low[v], low[w])
        elif w in on:
            low[v] = min(low[v], index[w])
    if low[v] == index[v]:
        scc = []
        while True:
            w = stack.pop()
            on.discard(w)
            scc.append(w)
            if w == v:
                break
        if len(scc) > 1:
            sccs.append(scc)


sys.setrecursionlimit(10000)
for m in sorted(modules):
    if m not in index:
        visit(m)

failed = False
for scc in sccs:
    failed = True
    print("import cycle: " + ", ".join(sorted(files[m] for m in scc)))
for module, path in sorted(files.items()):
    with open(path, encoding="utf-8") as f:
        lines = sum(1 for _ in f)
    if lines > MAX_LINES:
        failed = True
        print(f"{path}: {lines} lines (at most {MAX_LINES})")
if failed:
    sys.exit(1)
print(f"{SRC}: {len(modules)} modules, no import cycle, none over {MAX_LINES} lines")
