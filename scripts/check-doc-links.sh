#!/usr/bin/env bash
# The project's docs stand alone: every relative link in a tracked Markdown
# file reaches a file of this repository, and no tracked file points at
# design notes outside it (../shared, LANGUAGE.md, DESIGN.md, STYLE.md).
set -euo pipefail
cd "$(dirname "$0")/.."
exec python3 - <<'PY'
import os, re, subprocess, sys

tracked = subprocess.run(["git", "ls-files"], capture_output=True, text=True, check=True).stdout.split()
problems = []
outside = re.compile(r"\.\./shared|\b(LANGUAGE|DESIGN|STYLE)\.md\b")
link = re.compile(r"\]\(([^)\s]+)\)")
for path in tracked:
    if not os.path.isfile(path) or path.startswith(("sdks/typescript/src/gen", "sdks/go/gen", "sdks/python/composer/gen")):
        continue
    try:
        text = open(path, encoding="utf-8").read()
    except (UnicodeDecodeError, OSError):
        continue
    for number, line in enumerate(text.splitlines(), 1):
        if outside.search(line) and path != "scripts/check-doc-links.sh":
            problems.append(f"{path}:{number}: points outside the repository: {line.strip()}")
        if not path.endswith(".md"):
            continue
        for target in link.findall(line):
            if re.match(r"^[a-z]+:", target) or target.startswith("#"):
                continue
            file = target.split("#", 1)[0]
            if file and not os.path.exists(os.path.normpath(os.path.join(os.path.dirname(path), file))):
                problems.append(f"{path}:{number}: dead link {target}")
for problem in problems:
    print(problem)
if problems:
    sys.exit(1)
print(f"doc links: ok ({len(tracked)} files)")
PY
