#!/usr/bin/env bash
# Fails when the modules of a Rust crate import each other in a circle
# (decision 0042). Usage: scripts/check-module-cycles.sh [ROOT] [--graph]
#
# Every crate under ROOT (a Cargo.toml beside src/lib.rs or src/main.rs) is
# read on its own; tests/, benches/, examples/, build.rs and target/ are not.
# A module is a file (a folder's mod.rs is the folder's module; an inline
# `mod x { .. }` belongs to its file). An edge A -> B is a path in A that
# names B: `use crate::..`, `use super::..`, `use self::..`, a `crate::x::y`
# or `super::x` written in code, or a `use` of a child module. A path that
# ends at an item is followed through the `pub use` re-exports of the module
# it names, so an import through a folder's face counts against the file
# that defines the item.
#
# A parent declaring, re-exporting or naming its own descendants is not an
# edge: the parent contains them (`mod child;` is a declaration, and a
# lib.rs or mod.rs that holds a type whose methods its children implement is
# their common root, not their peer). Every other edge counts, child ->
# parent included. A cycle is printed as its shortest loop, each step with
# the names that tie it. --graph prints each crate's edges instead.
set -euo pipefail
root="${1:-$(cd "$(dirname "$0")/.." && pwd)}"
mode="${2:-check}"
exec python3 - "$root" "$mode" <<'PY'
import os
import re
import sys

ROOT, MODE = sys.argv[1], sys.argv[2]
SKIP_DIRS = {"target", "node_modules", ".git", "tests", "benches", "examples"}


def strip(text):
    """Blanks comments, strings and char literals, keeping newlines."""
    out, i, n = [], 0, len(text)
    while i < n:
        c = text[i]
        if text.startswith("//", i):
            j = text.find("\n", i)
            j = n if j < 0 else j
            i = j
            continue
        if text.startswith("/*", i):
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
            continue
        raw = re.match(r'(?:b|c)?r(#*)"', text[i:i + 260]) if c in "bcr" and (i == 0 or not (text[i - 1].isalnum() or text[i - 1] == "_")) else None
        if raw:
            end = '"' + raw.group(1)
            j = text.find(end, i + raw.end())
            j = n if j < 0 else j + len(end)
            out.append('""' + re.sub(r"[^\n]", " ", text[i:j])[2:])
            i = j
            continue
        if c == '"':
            j = i + 1
            while j < n and text[j] != '"':
                j += 2 if text[j] == "\\" else 1
            out.append('""' + re.sub(r"[^\n]", " ", text[i + 1:j - 1] if j - 1 > i else ""))
            i = j + 1
            continue
        if c == "'":
            lit = re.match(r"'(\\.[^']*|[^\\'])'", text[i:i + 12])
            if lit:
                out.append("' '")
                i += lit.end()
                continue
        out.append(c)
        i += 1
    return "".join(out)


class Module:
    def __init__(self, path, file, parent):
        self.path = path  # tuple of names from the crate root
        self.file = file
        self.parent = parent
        self.children = {}  # name -> Module
        self.uses = []  # (module the path is read in, [segments], line)
        self.reexports = {}  # name -> (module, [segments])


def split_tree(tree):
    """`a::{b, c::{d as e}}` -> [[a, b], [a, c, d]]."""
    paths = []

    def walk(prefix, text):
        depth, start, parts = 0, 0, []
        for k, ch in enumerate(text):
            if ch == "{":
                depth += 1
            elif ch == "}":
                depth -= 1
            elif ch == "," and depth == 0:
                parts.append(text[start:k])
                start = k + 1
        parts.append(text[start:])
        for part in (p.strip() for p in parts):
            if not part:
                continue
            brace = part.find("{")
            if brace >= 0:
                head = [s.strip() for s in part[:brace].split("::") if s.strip()]
                walk(prefix + head, part[brace + 1:part.rindex("}")])
            else:
                part = re.sub(r"\s+as\s+[A-Za-z_][A-Za-z0-9_]*$", "", part)
                paths.append(prefix + [s.strip() for s in part.split("::") if s.strip()])

    walk([], re.sub(r"\s+", " ", tree).strip().lstrip(":"))
    return paths


USE = re.compile(r"\b(pub(?:\([^)]*\))?\s+)?use\s+([^;]+);")
MOD_DECL = re.compile(r"\b(?:pub(?:\([^)]*\))?\s+)?mod\s+([A-Za-z_][A-Za-z0-9_]*)\s*([;{])")
CODE_PATH = re.compile(r"(?<![A-Za-z0-9_:])((?:crate|super|self)(?:::[A-Za-z_][A-Za-z0-9_]*)+)")


def load(file, path, parent, crate):
    module = Module(path, file, parent)
    crate.append(module)
    text = strip(open(file, encoding="utf-8").read())
    folder = os.path.dirname(file)
    stem = os.path.splitext(os.path.basename(file))[0]
    child_dir = folder if stem in ("mod", "lib", "main") else os.path.join(folder, stem)
    read(text, module, child_dir, crate)
    return module


def read(text, module, child_dir, crate):
    """Reads one file's text into `module`, with its inline modules."""
    # inline modules: find `mod x {` and its matching brace
    pos, body = 0, []
    for m in MOD_DECL.finditer(text):
        if m.start() < pos:
            continue
        name = m.group(1)
        if m.group(2) == ";":
            for candidate in (os.path.join(child_dir, name + ".rs"), os.path.join(child_dir, name, "mod.rs")):
                if os.path.exists(candidate):
                    module.children[name] = load(candidate, module.path + (name,), module, crate)
                    break
            continue
        depth, j = 1, m.end()
        while j < len(text) and depth:
            depth += {"{": 1, "}": -1}.get(text[j], 0)
            j += 1
        body.append(text[pos:m.start()])
        inline = Module(module.path + (name,), module.file, module)
        module.children[name] = inline
        read(text[m.end():j - 1], inline, os.path.join(child_dir, name), crate)
        crate.append(inline)
        pos = j
    body.append(text[pos:])
    own = "".join(body)
    for m in USE.finditer(own):
        line = own.count("\n", 0, m.start()) + 1
        for segs in split_tree(m.group(2)):
            segs = [s for s in segs if s != "r#"]
            module.uses.append((module, segs, line))
            if m.group(1) and segs and segs[-1] not in ("*", "self"):
                module.reexports[segs[-1]] = segs
    for m in CODE_PATH.finditer(USE.sub(" ", own)):
        module.uses.append((module, m.group(1).split("::"), 0))


def resolve(start, segs, root, depth=0):
    """The module a path names and the item it ends at (None: not ours)."""
    if not segs:
        return None
    here = start
    first = segs[0]
    if first == "crate":
        here, rest = root, segs[1:]
    elif first in ("self", "super"):
        rest = segs
        while rest and rest[0] in ("self", "super"):
            if rest[0] == "super":
                here = here.parent
                if here is None:
                    return None
            rest = rest[1:]
    elif first in start.children:
        rest = segs
    else:
        return None  # another crate, std, or a name in scope
    for k, seg in enumerate(rest):
        if seg in here.children:
            here = here.children[seg]
            continue
        item = seg
        if item in here.reexports and depth < 8:
            # a name handed on: the edge goes to where it is defined (or
            # nowhere, when it comes from another crate)
            return resolve(here, here.reexports[item], root, depth + 1)
        return here, item
    return here, None


def file_of(module):
    return module.file


def is_descendant(inner, outer):
    while inner is not None:
        if inner is outer:
            return True
        inner = inner.parent
    return False


def crate_graph(src):
    crates = []
    for root_name in ("lib.rs", "main.rs"):
        root_file = os.path.join(src, root_name)
        if os.path.exists(root_file):
            modules = []
            root = load(root_file, (), None, modules)
            crates.append((root, modules))
    edges = {}
    for root, modules in crates:
        for module in modules:
            for reader, segs, line in module.uses:
                found = resolve(reader, segs, root)
                if not found:
                    continue
                target, item = found
                # a module reaching into its own descendants contains them
                if is_descendant(target, module) or target.file == module.file:
                    continue
                key = (module.file, target.file)
                edges.setdefault(key, set()).add(item or target.path[-1] if target.path else item or "crate")
    return edges


def cycles(edges):
    """Strongly connected components of more than one file (Tarjan)."""
    graph = {}
    for a, b in edges:
        graph.setdefault(a, set()).add(b)
        graph.setdefault(b, set())
    index, low, stack, on, out = {}, {}, [], set(), []

    def visit(v):
        index[v] = low[v] = len(index)
        stack.append(v)
        on.add(v)
        for w in sorted(graph[v]):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            part = []
            while True:
                w = stack.pop()
                on.discard(w)
                part.append(w)
                if w == v:
                    break
            if len(part) > 1:
                out.append(sorted(part))

    sys.setrecursionlimit(10000)
    for v in sorted(graph):
        if v not in index:
            visit(v)
    return out


def shortest_loop(part, edges):
    """The shortest loop of files within one strongly connected part."""
    inside = set(part)
    best = None
    for start in sorted(part):
        seen, queue = {start: None}, [start]
        while queue:
            nxt = []
            for v in queue:
                for (a, b) in edges:
                    if a != v or b not in inside:
                        continue
                    if b == start:
                        path = [v]
                        while seen[path[-1]] is not None:
                            path.append(seen[path[-1]])
                        loop = list(reversed(path)) + [start]
                        if best is None or len(loop) < len(best):
                            best = loop
                        nxt = []
                        break
                    if b not in seen:
                        seen[b] = v
                        nxt.append(b)
            queue = nxt
    return best


def crates_under(root):
    for folder, dirs, files in os.walk(root):
        dirs[:] = sorted(d for d in dirs if d not in SKIP_DIRS and not d.startswith("."))
        src = os.path.join(folder, "src")
        if "Cargo.toml" in files and (os.path.exists(os.path.join(src, "lib.rs")) or os.path.exists(os.path.join(src, "main.rs"))):
            yield folder


failed, read_crates = 0, 0
for crate in crates_under(ROOT):
    read_crates += 1
    edges = crate_graph(os.path.join(crate, "src"))
    rel = lambda p: os.path.relpath(p, ROOT)
    if MODE == "--graph":
        for (a, b), names in sorted(edges.items()):
            print(f"{rel(a)} -> {rel(b)}: {', '.join(sorted(n for n in names if n))}")
        continue
    for part in cycles(edges):
        failed += 1
        loop = shortest_loop(part, edges)
        print(f"module cycle in {rel(crate)} ({len(part)} files tied), the shortest loop:", file=sys.stderr)
        for a, b in zip(loop, loop[1:]):
            print(f"  {rel(a)} -> {rel(b)}: {', '.join(sorted(n for n in edges[(a, b)] if n))}", file=sys.stderr)
if MODE != "--graph":
    if read_crates == 0:
        print(f"no Rust crate under {ROOT}", file=sys.stderr)
        sys.exit(2)
    if failed:
        print(f"{failed} module cycle(s): move the shared names down into a module both sides use", file=sys.stderr)
        sys.exit(1)
    print(f"no module cycle in {read_crates} crate(s)")
PY
