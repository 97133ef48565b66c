#!/usr/bin/env bash
# Every relative link in README.md and docs/*.md resolves: the file exists and, where the link
# has a #anchor into a Markdown file, that file has a heading with that anchor (GitHub's rule:
# lower case, punctuation dropped, spaces to hyphens, -1, -2, ... for repeats). Links inside
# code (fenced blocks, `inline`) and to http(s)/mailto are not checked; reference definitions
# ([name]: target) are, and every [text][name] needs its definition.
# Usage: test_doc_links.sh [SOURCE_DIR]   (default: the repository this script is in)
set -euo pipefail
root=${1:-$(cd "$(dirname "$0")/../.." && pwd)}
command -v python3 >/dev/null || { echo "skipped: python3 not found"; exit 77; }
exec python3 - "$root" <<'PY'
import os, re, sys, unicodedata

root = sys.argv[1]

def strip_code(text):
    """The text with fenced code blocks and inline code blanked (line numbers kept)."""
    out, fence = [], None
    for line in text.split("\n"):
        m = re.match(r"^\s*(```+|~~~+)", line)
        if fence:
            if m and m.group(1)[0] == fence[0] and len(m.group(1)) >= len(fence):
                fence = None
            out.append("")
            continue
        if m:
            fence = m.group(1)
            out.append("")
            continue
        out.append(re.sub(r"(`+)(.+?)\1", lambda k: " " * len(k.group(0)), line))
    return out

def slug(heading):
    s = heading.strip().lower()
    s = re.sub(r"\[([^\]]*)\]\([^)]*\)", r"\1", s)          # [text](link) -> text
    s = "".join(c for c in s if c in " -_" or unicodedata.category(c)[0] in "LN")
    return s.replace(" ", "-")

anchor_cache = {}
def anchors(path):
    if path not in anchor_cache:
        seen, result = {}, set()
        with open(path, encoding="utf-8") as f:
            raw = f.read().split("\n")
        fence = None
        for line in raw:
            m = re.match(r"^\s*(```+|~~~+)", line)
            if fence:
                if m and m.group(1)[0] == fence[0] and len(m.group(1)) >= len(fence):
                    fence = None
                continue
            if m:
                fence = m.group(1)
                continue
            h = re.match(r"^#{1,6}\s+(.*?)\s*#*\s*$", line)
            if not h:
                continue
            base = slug(h.group(1).replace("`", ""))
            n = seen.get(base, 0)
            seen[base] = n + 1
            result.add(base if n == 0 else f"{base}-{n}")
        for m in re.finditer(r'<a\s+(?:name|id)="([^"]+)"', "\n".join(raw)):
            result.add(m.group(1))
        anchor_cache[path] = result
    return anchor_cache[path]

docs = ["README.md"] + sorted(
    os.path.join("docs", n) for n in os.listdir(os.path.join(root, "docs")) if n.endswith(".md"))
link_re = re.compile(r"!?\[(?:[^\]\[]|\[[^\]]*\])*\]\(\s*<?([^)\s>]+)>?(?:\s+\"[^\"]*\")?\s*\)")
bad, count = [], 0
for doc in docs:
    path = os.path.join(root, doc)
    with open(path, encoding="utf-8") as f:
        lines = strip_code(f.read())
    defined = {m.group(1).lower() for line in lines
               for m in [re.match(r"^\s{0,3}\[([^\]]+)\]:", line)] if m}
    for no, line in enumerate(lines, 1):
        for m in re.finditer(r"\]\[([^\]]+)\]", line):          # [text][name]
            if m.group(1).lower() not in defined:
                bad.append(f"{doc}:{no}: [{m.group(1)}]: reference link without a definition")
        targets = [m.group(1) for m in link_re.finditer(line)]
        ref = re.match(r"^\s{0,3}\[[^\]]+\]:\s*<?([^\s>]+)>?", line)   # [name]: target
        if ref:
            targets.append(ref.group(1))
        for target in targets:
            if re.match(r"^[a-z][a-z0-9+.-]*:", target, re.I):
                continue                                  # http:, https:, mailto:
            count += 1
            file_part, _, anchor = target.partition("#")
            dest = path if not file_part else os.path.normpath(
                os.path.join(os.path.dirname(path), file_part))
            where = f"{doc}:{no}: {target}"
            if not os.path.exists(dest):
                bad.append(f"{where}: no such file {os.path.relpath(dest, root)}")
            elif anchor and dest.endswith(".md") and anchor not in anchors(dest):
                bad.append(f"{where}: no heading with anchor #{anchor} in {os.path.relpath(dest, root)}")
for b in bad:
    print(b)
print(f"{count} relative links in {len(docs)} files, {len(bad)} broken")
sys.exit(1 if bad else 0)
PY
