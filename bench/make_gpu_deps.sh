#!/usr/bin/env bash
# Run here (Debian, with network to Debian's archive) once: fills .deps/ with what the lent
# GPU host's image lacks (see bench/gpu_host_env.sh): Boost.Program_options sources matching
# the host's Boost 1.83 headers, and pcre2.h. Pass `carry: [".deps"]` to the device calls.
set -euo pipefail
cd "$(dirname "$0")/.."
mkdir -p .deps/pcre2/include
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
(cd "$tmp" && apt-get download libpcre2-dev >/dev/null 2>&1 && dpkg -x libpcre2-dev_*.deb x)
cp "$tmp/x/usr/include/pcre2.h" .deps/pcre2/include/
if [ ! -d .deps/boost_po_src ]; then
  echo "deb-src http://deb.debian.org/debian trixie main" > "$tmp/src.list"
  mkdir -p "$tmp/lists/partial"
  apt_opts=(-o Dir::Etc::SourceList="$tmp/src.list" -o Dir::Etc::SourceParts=/dev/null -o Dir::State::Lists="$tmp/lists")
  apt-get "${apt_opts[@]}" update -qq
  (cd "$tmp" && apt-get "${apt_opts[@]}" source --download-only boost1.83 >/dev/null 2>&1)
  tar -C "$tmp" -xJf "$tmp"/boost1.83_*.orig.tar.xz --wildcards '*/libs/program_options/src/*'
  cp -r "$tmp"/boost*/libs/program_options/src .deps/boost_po_src
fi
du -sh .deps
