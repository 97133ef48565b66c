#!/usr/bin/env python3
"""The natural text of the context-extension experiment (bench/run_extension.sh,
docs/results.md): public-domain and free English text from Debian packages that
scripts/setup.sh installs, cleaned to plain text, cut into blocks, and split into training
and held-out blocks by a fixed rule.

    python3 scripts/make_text_corpus.py OUTDIR [--block-bytes N] [--max-bytes N]

Sources, in this order (each a package; a missing one is an error naming it):
    gcide     the GNU Collaborative International Dictionary of English 0.48 (dict-gcide,
              GPL-2+): /usr/share/dictd/gcide.dict.dz, its database header dropped, its
              "[1913 Webster]"-style source tags dropped, lines dedented
    manpages  the Linux man-pages 6.03 (manpages, manpages-dev; their own free licences):
              every page the two packages install, in path order, roff markup stripped
    kjv       the King James Bible (bible-kjv; public domain): one verse per line
    jargon    the Jargon File 4.4.7 (jargon-text; public domain), box-drawn tables dropped
    fortunes  fortune-mod's cookie files (fortunes; art and the offensive set left out)

Each source's text is cut into blocks of about --block-bytes (default 256 KiB) at a blank
line (or, past 1.25 blocks without one, at a line end). Block i of a source is held out
when i % 10 == 3, else it is training text: the split is by source and position only, so
it is the same on every machine with the same packages. A line that names the evaluation's
needle city or wording (FORBIDDEN below, case-insensitive) is dropped from every block, so
neither training nor held-out text holds it.

Output:
    OUTDIR/train/SOURCE-NNNN.txt     the training blocks (each a document)
    OUTDIR/heldout/RR-SOURCE-NNNN.txt
                                     the held-out blocks (never trained on), the perplexity
                                     documents; RR numbers them round robin over the
                                     sources (00-gcide, 01-manpages, 02-kjv, ..., then the
                                     sources' second blocks), so that name order mixes them
    OUTDIR/haystack.txt              the held-out blocks interleaved a paragraph at a time
                                     over the sources (gcide, manpages, kjv, ...): the
                                     needle evaluation's haystack, varied text from its start
    OUTDIR/corpus.json               per source: bytes, blocks, held-out blocks, lines dropped
--max-bytes N keeps only the first N bytes of each source's text (the CPU scale's small
corpus). Deterministic; rerunning over an existing OUTDIR rewrites it.
"""
import argparse
import gzip
import json
import os
import re
import shutil
import subprocess
import sys

FORBIDDEN = ["singapore", "special magic", "story book", "content of the book"]
HELDOUT_EVERY, HELDOUT_AT = 10, 3


def die(msg):
    sys.exit(f"make_text_corpus.py: {msg}")


def forbidden(line):
    low = " ".join(line.lower().split())
    return any(f in low for f in FORBIDDEN)


def package_files(pkg):
    try:
        out = subprocess.run(["dpkg", "-L", pkg], check=True, capture_output=True, text=True).stdout
    except (OSError, subprocess.CalledProcessError):
        die(f"package {pkg} is not installed (apt-get install {pkg}; scripts/setup.sh installs it)")
    return sorted(p for p in out.splitlines() if os.path.isfile(p))


def gcide():
    path = "/usr/share/dictd/gcide.dict.dz"
    if not os.path.isfile(path):
        die(f"{path} missing (apt-get install dict-gcide)")
    with gzip.open(path, "rt", encoding="utf-8", errors="replace") as f:
        text = f.read()
    # The dictd database header: the 00-database-* entries and the licence preamble end
    # where the first headword entry ("A \A\ ...") starts.
    start = text.find("\nA \\A\\")
    text = text[start + 1 :] if start >= 0 else text
    # Source tags ("[1913 Webster]", "[WordNet 1.5]", "[PJC]", ...), alone or inline.
    tag = re.compile(r"\[(?:[^\]]*(?:Webster|WordNet|PJC|Century|Chambers|Dict\.)[^\]]*)\]")
    for line in text.splitlines():
        yield tag.sub("", line).strip()


ESCAPES = [
    (re.compile(r"\\f(\[[^\]]*\]|\(..|.)"), ""),  # font changes
    (re.compile(r"\\s[+-]?\d"), ""),  # size changes
    (re.compile(r"\\\*(\[[^\]]*\]|\(..|.)"), ""),  # strings
    (re.compile(r"\\\((em|en)"), "-"),
    (re.compile(r"\\\((aq|cq|oq)"), "'"),
    (re.compile(r"\\\((dq|lq|rq)"), '"'),
    (re.compile(r"\\\(bu"), "*"),
    (re.compile(r"\\\((mu)"), "x"),
    (re.compile(r"\\\(..|\\\[[^\]]*\]"), ""),  # other special characters
    (re.compile(r"\\[-]"), "-"),
    (re.compile(r"\\e"), "\\\\"),
    (re.compile(r"\\[ ~0]"), " "),
    (re.compile(r"\\[&|^,/c%:)]"), ""),
]
ALTERNATING = {".BR", ".BI", ".IB", ".RB", ".RI", ".IR", ".SB"}
BREAKS = {".PP", ".LP", ".P", ".sp", ".br", ".TP", ".TQ", ".RS", ".RE", ".HP"}


def roff_args(rest):
    args, cur, quoted, i = [], "", False, 0
    while i < len(rest):
        c = rest[i]
        if c == '"':
            quoted = not quoted
        elif c in " \t" and not quoted:
            if cur:
                args.append(cur)
            cur = ""
        else:
            cur += c
        i += 1
    if cur:
        args.append(cur)
    return args


def unescape(s):
    for pat, rep in ESCAPES:
        s = pat.sub(rep, s)
    return s.replace("\\\\", "\\")


def man_page(path):
    """A page's text: roff requests dropped or turned into text, filled lines joined into
    paragraphs (as man renders them), no-fill blocks (.nf ... .fi) kept line by line."""
    with gzip.open(path, "rt", encoding="utf-8", errors="replace") as f:
        lines = f.read().splitlines()
    if any(l.startswith(".so ") for l in lines[:3]) and len(lines) < 5:
        return []  # a link to another page
    out, para, fill = [], [], True

    def flush():
        if para:
            out.append(" ".join(para))
            para.clear()

    for text in man_lines(lines):
        if text is None:  # a break
            flush()
            out.append("")
        elif text is True or text is False:  # .fi / .nf
            flush()
            fill = text
        elif fill and text.strip():
            para.append(text.strip())
        else:
            flush()
            out.append(text)
    flush()
    return out


def man_lines(lines):
    """The page's text lines; None for a paragraph break, True/False for fill on/off."""
    in_table = False
    for line in lines:
        if line.startswith((".\\\"", "'\\\"", '.\\"')) or line.strip() in (".", "'"):
            continue
        if line.startswith(".TS"):
            in_table = True
            continue
        if line.startswith(".TE"):
            in_table = False
            continue
        if in_table:
            continue
        if line.startswith((".", "'")):
            parts = line.split(None, 1)
            macro, rest = parts[0], parts[1] if len(parts) > 1 else ""
            if macro in (".SH", ".SS"):
                yield None
                yield unescape(" ".join(roff_args(rest)))
                yield None
            elif macro in (".B", ".I", ".SM"):
                yield unescape(" ".join(roff_args(rest)))
            elif macro in ALTERNATING:
                yield unescape("".join(roff_args(rest)))
            elif macro == ".IP":
                a = roff_args(rest)
                yield None
                if a:
                    yield unescape(a[0])
            elif macro == ".nf" or macro == ".EX":
                yield False
            elif macro == ".fi" or macro == ".EE":
                yield True
            elif macro in BREAKS:
                yield None
            continue  # every other request or macro: dropped
        yield unescape(line)


def manpages():
    files = [p for pkg in ("manpages", "manpages-dev") for p in package_files(pkg) if p.endswith(".gz")
             and "/man/man" in p]
    if not files:
        die("no man pages found (apt-get install manpages manpages-dev)")
    for p in sorted(files):
        page = man_page(p)
        if page:
            yield from page
            yield ""


def kjv():
    try:
        out = subprocess.run(["bible", "-f", "gen1:1-rev22:21"], check=True, capture_output=True, text=True).stdout
    except (OSError, subprocess.CalledProcessError):
        die("bible failed (apt-get install bible-kjv)")
    for line in out.splitlines():
        m = re.match(r"^\S+?\d+:\d+ (.*)$", line)
        if m:
            yield m.group(1)


def jargon():
    path = "/usr/share/doc/jargon-text/jargon.txt.gz"
    if not os.path.isfile(path):
        die(f"{path} missing (apt-get install jargon-text)")
    with gzip.open(path, "rt", encoding="utf-8", errors="replace") as f:
        for line in f.read().splitlines():
            if not re.search("[│├┼─┌┐└┘┬┴┤]", line):
                yield line


def fortunes():
    d = "/usr/share/games/fortunes"
    if not os.path.isfile(os.path.join(d, "fortunes")):
        die(f"{d}/fortunes missing (apt-get install fortunes)")
    for name in sorted(os.listdir(d)):
        p = os.path.join(d, name)
        if name.endswith((".dat", ".u8")) or name in ("art", "ascii-art", "off") or os.path.islink(p):
            continue
        if not os.path.isfile(p):
            continue
        with open(p, encoding="utf-8", errors="replace") as f:
            for line in f.read().splitlines():
                yield "" if line == "%" else line


SOURCES = [("gcide", gcide), ("manpages", manpages), ("kjv", kjv), ("jargon", jargon), ("fortunes", fortunes)]


def blocks(lines, block_bytes, max_bytes):
    """Cleaned lines (blank runs squeezed, forbidden lines dropped) cut into blocks."""
    cur, size, total, dropped, blank = [], 0, 0, 0, True
    out = []
    for line in lines:
        line = line.rstrip()
        if forbidden(line):
            dropped += 1
            continue
        if not line:
            if blank:
                continue
            blank = True
        else:
            blank = False
        n = len(line.encode("utf-8")) + 1
        if max_bytes and total + n > max_bytes:
            break
        cur.append(line)
        size += n
        total += n
        if size >= block_bytes and (not line or size >= 1.25 * block_bytes):
            out.append("\n".join(cur).strip("\n") + "\n")
            cur, size, blank = [], 0, True
    if cur and "".join(cur).strip():
        out.append("\n".join(cur).strip("\n") + "\n")
    return out, dropped


def chunks(text, size=2048):
    """Text cut at line ends into pieces of at least `size` bytes."""
    out, cur, n = [], [], 0
    for line in text.splitlines():
        cur.append(line)
        n += len(line) + 1
        if n >= size:
            out.append("\n".join(cur).strip("\n"))
            cur, n = [], 0
    if cur and "".join(cur).strip():
        out.append("\n".join(cur).strip("\n"))
    return [c for c in out if c.strip()]


def interleave(texts):
    """The held-out blocks of every source, about 2 KB of each in turn (round robin)."""
    parts = [chunks(t) for t in texts]
    out, i = [], 0
    while any(i < len(p) for p in parts):
        for p in parts:
            if i < len(p):
                out.append(p[i])
        i += 1
    return "\n\n".join(out) + "\n"


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("outdir")
    ap.add_argument("--block-bytes", type=int, default=256 << 10)
    ap.add_argument("--max-bytes", type=int, default=0, help="keep only the first N bytes of each source")
    a = ap.parse_args()
    for sub in ("train", "heldout"):
        shutil.rmtree(os.path.join(a.outdir, sub), ignore_errors=True)
        os.makedirs(os.path.join(a.outdir, sub))
    summary, held, held_files = {"block_bytes": a.block_bytes, "max_bytes": a.max_bytes, "forbidden": FORBIDDEN,
                     "heldout_rule": f"block i of a source when i % {HELDOUT_EVERY} == {HELDOUT_AT}",
                     "sources": {}}, [], []
    for name, gen in SOURCES:
        bl, dropped = blocks(gen(), a.block_bytes, a.max_bytes)
        # Small sources (the CPU scale's prefixes) still hold out their last block.
        rule = (lambda i: i % HELDOUT_EVERY == HELDOUT_AT) if len(bl) > HELDOUT_AT else (lambda i: i == len(bl) - 1)
        src_held = []
        for i, text in enumerate(bl):
            if rule(i) and len(bl) > 1:
                src_held.append((f"{name}-{i:04d}.txt", text))
                continue
            with open(os.path.join(a.outdir, "train", f"{name}-{i:04d}.txt"), "w", encoding="utf-8") as f:
                f.write(text)
        held.append("".join(t for _, t in src_held))
        held_files.append(src_held)
        summary["sources"][name] = {"bytes": sum(len(t.encode("utf-8")) for t in bl), "blocks": len(bl),
                                    "heldout_blocks": len(src_held), "lines_dropped": dropped,
                                    "heldout_bytes": sum(len(t.encode("utf-8")) for _, t in src_held)}
    # The held-out blocks, numbered round robin over the sources.
    rank = 0
    for k in range(max(len(h) for h in held_files)):
        for h in held_files:
            if k < len(h):
                with open(os.path.join(a.outdir, "heldout", f"{rank:02d}-{h[k][0]}"), "w", encoding="utf-8") as f:
                    f.write(h[k][1])
                rank += 1
    with open(os.path.join(a.outdir, "haystack.txt"), "w", encoding="utf-8") as f:
        f.write(interleave(held))
    with open(os.path.join(a.outdir, "corpus.json"), "w", encoding="utf-8") as f:
        json.dump(summary, f, indent=2)
        f.write("\n")
    for name, s in summary["sources"].items():
        print(f"{name}: {s['bytes']} bytes in {s['blocks']} blocks, {s['heldout_blocks']} held out "
              f"({s['heldout_bytes']} bytes), {s['lines_dropped']} lines dropped", file=sys.stderr)
    print(os.path.abspath(a.outdir))


if __name__ == "__main__":
    main()
