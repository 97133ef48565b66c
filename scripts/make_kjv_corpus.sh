#!/usr/bin/env bash
# Builds a KJV "mini SlimPajama" in OUTDIR (idempotent: existing outputs are kept):
#   kjv_books.jsonl.zst     66 documents, one per book      (meta.redpajama_set_name = RedPajamaBook)
#   kjv_chapters.jsonl.zst  1,189 documents, one per chapter (RedPajamaWikipedia)
#   kjv_verses.jsonl.zst    31,102 documents, one per verse  (RedPajamaC4)
#   kjv_books.jsonl         the books file uncompressed (benchmarks, spm_encode input)
#   kjv.txt                 the verse texts, one per line
# Real SlimPajama schema: {"text": ..., "meta": {"redpajama_set_name": ...}}.
# Needs: bible (bible-kjv), jq, zstd, awk.
set -euo pipefail
out=${1:?usage: make_kjv_corpus.sh OUTDIR}
mkdir -p "$out"
for tool in bible jq zstd awk; do
  command -v "$tool" >/dev/null || { echo "make_kjv_corpus.sh: $tool not found (apt-get install bible-kjv jq zstd)" >&2; exit 1; }
done
verses="$out/.kjv_verses.tsv"
if [ ! -s "$out/kjv.txt" ] || [ ! -s "$verses" ]; then
  # "Ge1:1 In the beginning ..." -> book<TAB>chapter<TAB>text
  bible -f gen1:1-rev22:21 | awk '
    /^[^ ]+[0-9]+:[0-9]+ / {
      ref = $1; sub(/^[^ ]+ /, ""); book = ref; sub(/[0-9]+:[0-9]+$/, "", book);
      ch = ref; sub(/^[^0-9]*/, "", ch); sub(/:.*/, "", ch);
      printf "%s\t%s\t%s\n", book, ch, $0 }' > "$verses.tmp"
  mv "$verses.tmp" "$verses"
  cut -f3 "$verses" > "$out/kjv.txt.tmp" && mv "$out/kjv.txt.tmp" "$out/kjv.txt"
fi
# group KEY_FIELDS SOURCE OUT: one document per group of consecutive verses.
group() {
  local keys=$1 source=$2 dst=$3
  [ -s "$dst" ] && return 0
  awk -F'\t' -v keys="$keys" '
    { k = (keys == 1) ? $1 : $1 " " $2 }
    k != prev && NR > 1 { print text; text = "" }
    { text = (text == "") ? $3 : text " " $3; prev = k }
    END { if (text != "") print text }' "$verses" |
    jq -R -c --arg s "$source" '{text: ., meta: {redpajama_set_name: $s}}' > "$dst.plain.tmp"
  zstd -q -f -19 -o "$dst.tmp" "$dst.plain.tmp"
  if [ "$source" = RedPajamaBook ]; then mv "$dst.plain.tmp" "$out/kjv_books.jsonl"; else rm -f "$dst.plain.tmp"; fi
  mv "$dst.tmp" "$dst"
}
group 1 RedPajamaBook "$out/kjv_books.jsonl.zst"
group 2 RedPajamaWikipedia "$out/kjv_chapters.jsonl.zst"
if [ ! -s "$out/kjv_verses.jsonl.zst" ]; then
  jq -R -c '{text: ., meta: {redpajama_set_name: "RedPajamaC4"}}' "$out/kjv.txt" | zstd -q -f -19 -o "$out/kjv_verses.jsonl.zst.tmp"
  mv "$out/kjv_verses.jsonl.zst.tmp" "$out/kjv_verses.jsonl.zst"
fi
if [ ! -s "$out/kjv_books.jsonl" ]; then zstd -q -d -f -o "$out/kjv_books.jsonl" "$out/kjv_books.jsonl.zst"; fi
echo "$out: $(zstd -q -d -c "$out/kjv_books.jsonl.zst" | wc -l) books, $(zstd -q -d -c "$out/kjv_chapters.jsonl.zst" | wc -l) chapters, $(wc -l < "$out/kjv.txt") verses"
