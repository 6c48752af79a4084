#!/usr/bin/env python3
"""The three SDKs' clients offer the same operations (docs/sdks.md).

Reads the public method names of the client in each package, as written
in its sources (Python `Client`, Go `*Client`, TypeScript `Client`),
compares them with their idiom's spelling set aside (snake_case,
CamelCase, camelCase), and fails naming every operation one language has
and another lacks, unless docs/sdks.md lists it as an exception with its
reason (a row of the table under "Exceptions").
"""
from __future__ import annotations

import re
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def norm(name: str) -> str:
    return name.replace("_", "").lower()


def python_methods() -> set[str]:
    text = (ROOT / "sdks/python/src/composer/client.py").read_text()
    match = re.search(r"^class Client\b.*?(?=^class |\Z)", text, re.S | re.M)
    if not match:
        sys.exit("sdk-parity: no `class Client` in sdks/python/src/composer/client.py")
    names = re.findall(r"^    (?:async )?def ([a-z]\w*)\(", match.group(0), re.M)
    return {n for n in names if not n.startswith("_")}


def go_methods() -> set[str]:
    names: set[str] = set()
    for path in (ROOT / "sdks/go").glob("*.go"):
        if path.name.endswith("_test.go"):
            continue
        names.update(re.findall(r"^func \(\w+ \*Client\) ([A-Z]\w*)\(", path.read_text(), re.M))
    return names


def typescript_methods() -> set[str]:
    """`ComposerClient` (every transport's) and the Node `Client` over it."""
    names: set[str] = set()
    for file, cls in (("client.ts", "ComposerClient"), ("node-client.ts", "Client")):
        text = (ROOT / "sdks/typescript/src" / file).read_text()
        match = re.search(rf"^export class {cls}\b.*?(?=^export |^\}}|\Z)", text, re.S | re.M)
        if not match:
            sys.exit(f"sdk-parity: no `export class {cls}` in sdks/typescript/src/{file}")
        found = re.findall(r"^  (?:async )?(?:\*\s*)?([a-z]\w*)\s*(?:<[^>]*>)?\(", match.group(0), re.M)
        names.update(n for n in found if n != "constructor")
    return names


def exceptions() -> set[str]:
    """Operations docs/sdks.md lets one language lack: `name` in the first
    column of the Exceptions table."""
    text = (ROOT / "docs/sdks.md").read_text()
    section = text.split("## Exceptions", 1)
    if len(section) < 2:
        return set()
    return {norm(m) for m in re.findall(r"^\| `(\w+)`", section[1], re.M)}


def main() -> int:
    found = {"Python": python_methods(), "Go": go_methods(), "TypeScript": typescript_methods()}
    for language, names in found.items():
        if len(names) < 10:
            print(f"sdk-parity: only {len(names)} client methods found in {language}: the reader is broken")
            return 1
    spelled = {lang: {norm(n): n for n in names} for lang, names in found.items()}
    every = set().union(*(s.keys() for s in spelled.values()))
    allowed = exceptions()
    missing = []
    for op in sorted(every - allowed):
        lacking = [lang for lang, names in spelled.items() if op not in names]
        if lacking:
            having = ", ".join(f"{lang} `{names[op]}`" for lang, names in spelled.items() if op in names)
            missing.append(f"  {having}; missing in {', '.join(lacking)}")
    if missing:
        print("sdk-parity: a client operation one SDK has and another lacks")
        print("(add it, or list it under Exceptions in docs/sdks.md with the reason):")
        print("\n".join(missing))
        return 1
    print(f"sdk-parity: ok, {len(every - allowed)} client operations in all three SDKs, {len(allowed & every)} documented exceptions")
    return 0


if __name__ == "__main__":
    sys.exit(main())
