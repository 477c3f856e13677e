#!/usr/bin/env bash
# build-runtime.sh — the emulation runtime (libcocoviz_emu.a: src/*.cpp of this folder),
# built once per content and reused by every tree (docs/codegen.md, "Emulation").
#
#   build-runtime.sh OUT CXX [FLAGS...]
#
# writes the library to OUT (an emitted tree's emu/libcocoviz_emu.a). The library is kept in
# a cache entry named by a hash of everything that makes it: this script, the sources and
# headers of this folder, the compiler (its path, `--version`, and an MPI wrapper's
# underlying command line) and FLAGS. A later build with the same inputs copies the entry
# instead of compiling (a second or less instead of a minute).
#
# Cache: $COCOVIZ_EMU_CACHE, else $XDG_CACHE_HOME/cocoviz/emulation, else
# ~/.cache/cocoviz/emulation; COCOVIZ_EMU_CACHE=off (or a cache that cannot be created)
# builds in OUT's folder without caching. Nothing is written outside the cache and OUT's
# folder.
# Concurrency: an entry is built in a private temporary folder and renamed into place
# (atomic), under an flock of the entry when flock(1) is there, so concurrent builds of one
# entry build it once and never see half an entry.
# Corruption: an entry holds the library's sha256; a library that does not match (a
# truncated copy, a disk error, an edit) is removed and built again.
# COCOVIZ_EMU_JOBS: compiler processes at once (default 2).
set -euo pipefail

if [ $# -lt 2 ]; then
  echo "usage: $0 OUT CXX [FLAGS...]" >&2
  exit 2
fi
out=$1
cxx=$2
shift 2
flags=("$@")
here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
jobs=${COCOVIZ_EMU_JOBS:-2}
lib=libcocoviz_emu.a

note() { echo "emulation runtime: $*" >&2; }

# ------------------------------------------------------------------- the key
key_text() {
  echo "script $(sha256sum "$here/build-runtime.sh" | cut -d' ' -f1)"
  (cd "$here" && find src include -type f \( -name '*.cpp' -o -name '*.h' \) | LC_ALL=C sort | while read -r f; do
    echo "file $f $(sha256sum "$f" | cut -d' ' -f1)"
  done)
  echo "cxx $(command -v "$cxx" || echo "$cxx")"
  "$cxx" --version 2>&1 | head -n 3 || true
  # an MPI compiler wrapper: the compiler and flags it stands for (MPICH -show, Open MPI --showme)
  { "$cxx" -show 2>/dev/null || "$cxx" --showme 2>/dev/null || true; } | head -n 3
  printf 'flag %s\n' "${flags[@]+"${flags[@]}"}"
}

compile_into() {  # DIR: compiles every source into DIR and archives DIR/lib
  local dir=$1
  (cd "$here/src" && ls ./*.cpp) | sed 's|^\./||' | xargs -P "$jobs" -I{} \
    "$cxx" "${flags[@]+"${flags[@]}"}" -I"$here/include" -c "$here/src/{}" -o "$dir/{}.o"
  ar rcs "$dir/$lib" "$dir"/*.o
  rm -f "$dir"/*.o
}

copy_out() {  # FILE: to OUT, atomically
  local tmp
  tmp="$out.tmp.$$"
  cp "$1" "$tmp"
  mv -f "$tmp" "$out"
}

mkdir -p "$(dirname "$out")"

cache=${COCOVIZ_EMU_CACHE:-${XDG_CACHE_HOME:-${HOME:-}/.cache}/cocoviz/emulation}
if [ "${COCOVIZ_EMU_CACHE:-}" = off ] || [ -z "${HOME:-}${XDG_CACHE_HOME:-}${COCOVIZ_EMU_CACHE:-}" ] ||
  ! mkdir -p "$cache" 2>/dev/null || [ ! -w "$cache" ]; then
  note "building without a cache (${COCOVIZ_EMU_CACHE:-no writable cache folder})"
  tmp=$(mktemp -d "$(dirname "$out")/.runtime.XXXXXX")
  trap 'rm -rf "$tmp"' EXIT
  compile_into "$tmp"
  copy_out "$tmp/$lib"
  exit 0
fi

key=$(key_text | sha256sum | cut -c1-24)
entry="$cache/$key"

valid() {  # the entry is complete and its library is what was stored
  [ -f "$entry/$lib" ] && [ -f "$entry/$lib.sha256" ] &&
    [ "$(sha256sum "$entry/$lib" | cut -d' ' -f1)" = "$(cat "$entry/$lib.sha256")" ]
}

use_or_build() {
  if valid; then
    copy_out "$entry/$lib"
    note "cached ($entry)"
    return
  fi
  if [ -e "$entry" ]; then
    note "cache entry $entry is corrupt or incomplete: building it again"
    rm -rf "$entry.bad.$$" && mv "$entry" "$entry.bad.$$" 2>/dev/null && rm -rf "$entry.bad.$$" || true
  fi
  local tmp
  tmp=$(mktemp -d "$cache/.build-$key.XXXXXX")
  # shellcheck disable=SC2064
  trap "rm -rf '$tmp'" EXIT
  note "building $entry (once for these sources, compiler and flags)"
  compile_into "$tmp"
  key_text >"$tmp/key.txt"
  sha256sum "$tmp/$lib" | cut -d' ' -f1 >"$tmp/$lib.sha256"
  # rename into place: atomic; if another build got there first, keep its entry
  if ! mv -T "$tmp" "$entry" 2>/dev/null; then
    rm -rf "$tmp"
  fi
  trap - EXIT
  if valid; then
    copy_out "$entry/$lib"
  else
    note "cache entry $entry did not verify after the build"
    exit 1
  fi
}

if command -v flock >/dev/null 2>&1; then
  exec 9>"$entry.lock"
  flock 9
  use_or_build
else
  use_or_build
fi
