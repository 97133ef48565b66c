#!/usr/bin/env bash
# Writes the public-domain / freely licensed natural text that the context-extension stages
# train on, besides the KJV (bench/run_extension.sh, docs/results.md), into OUTDIR as plain
# text files, from Debian packages that scripts/setup.sh installs:
#   jargon.txt    the Jargon File 4.4.7 (jargon-text; public domain), its tables dropped
#   fortunes.txt  fortune-mod's cookie files (fortunes; ascii-art and the offensive set
#                 left out), one cookie per paragraph
# Prints OUTDIR's absolute path. Idempotent. Fails with a line naming the missing package.
set -euo pipefail
out=${1:?usage: make_text_corpus.sh OUTDIR}
mkdir -p "$out"
jargon=/usr/share/doc/jargon-text/jargon.txt.gz
fortunes=/usr/share/games/fortunes
[ -s "$jargon" ] || { echo "make_text_corpus.sh: $jargon missing (apt-get install jargon-text)" >&2; exit 1; }
[ -s "$fortunes/fortunes" ] || { echo "make_text_corpus.sh: $fortunes/fortunes missing (apt-get install fortunes)" >&2; exit 1; }
if [ ! -s "$out/jargon.txt" ]; then
  # Box-drawn tables become noise under a 2000-piece tokenizer: drop their lines.
  zcat "$jargon" | grep -v '[│├┼─┌┐└┘┬┴┤]' | cat -s > "$out/jargon.txt.tmp"
  mv "$out/jargon.txt.tmp" "$out/jargon.txt"
fi
if [ ! -s "$out/fortunes.txt" ]; then
  for f in "$fortunes"/*; do
    case "$(basename "$f")" in *.dat | *.u8 | art | ascii-art | off) continue ;; esac
    [ -f "$f" ] && sed 's/^%$//' "$f"
  done | cat -s > "$out/fortunes.txt.tmp"
  mv "$out/fortunes.txt.tmp" "$out/fortunes.txt"
fi
cd "$out" && pwd
