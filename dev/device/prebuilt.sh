#!/usr/bin/env bash
# The extension built on this (CPU) machine and carried to the device, so a device call spends no time compiling
# (the device build takes ~150-160 s of each cold call; the device time is what is scarce, not this machine's).
#
#   dev/device/prebuilt.sh pack [ARCHS]      here, from the repository root: build the working tree's sources for
#                                            ARCHS (default "8.9;9.0a", what h200_full.sh builds) in a scratch copy
#                                            ($PREBUILT_SCRATCH, default /tmp/blockfp8-prebuilt, kept: only changed
#                                            units recompile; a cold build is ~12 min on 2 cores), then write
#                                            .prebuilt/_C.abi3.so.xz (~3 MB) and .prebuilt/hash (of the copy built).
#                                            Carry ".prebuilt" with the call.
#   dev/device/prebuilt.sh pack-base REV [ARCHS]  the same for revision REV's sources (git archive: the scratch copy's
#                                            unchanged units keep their objects), written to .prebuilt_base/: the base
#                                            build of h200_check.sh's ab_builds stage.
#   dev/device/prebuilt.sh hash ARCHS        print the sources' hash: the build stamp lib.sh and h200_check.sh compare.
#   dev/device/prebuilt.sh install ARCHS     on the device (lib.sh's build_extension and h200_check.sh call it): when
#                                            .prebuilt/hash names exactly these sources and ARCHS, unpack the library,
#                                            install the package around it (editable, BLOCKFP8_PREBUILT_EXT: nothing
#                                            compiled, the vLLM plugin entry point registered) and write the build
#                                            stamp, so the caller's build step is skipped; otherwise do nothing.
#
# The hash covers setup.py, every file under vllm_blockfp8/csrc and the arch list. The file list is sorted in the C
# collation: the device's locale sorts NOTES.md among the lowercase names, which changed the hash of identical
# sources. On a mismatch, install names the files that differ from .prebuilt/manifest. Needs setuptools on
# PYTHONPATH on the device (the carried .whl, installed by the caller).
set -uo pipefail
cd "$(dirname "$0")/../.."
PY=${PYTHON:-python3}
sources() { echo setup.py; find vllm_blockfp8/csrc -type f | LC_ALL=C sort; }
source_hash() { echo "$(cat $(sources) | sha256sum | cut -c1-16)-$1"; }

case ${1:-} in
  pack)
    archs=${2:-8.9;9.0a} scratch=${PREBUILT_SCRATCH:-/tmp/blockfp8-prebuilt}
    mkdir -p "$scratch" .prebuilt
    files=$(sources)
    # The tree's files (tracked and untracked, not ignored) with their times: units whose sources are unchanged
    # since the last pack keep their objects.
    git ls-files -co --exclude-standard -z | tar --null -T - -cf - | tar -xf - -C "$scratch" || exit 1
    # A source whose copy keeps an mtime older than the objects an earlier pack built from other contents (edited
    # while that pack ran) would not be recompiled: touch every source that differs from what the last pack built.
    [ -f "$scratch/.built_manifest" ] && (cd "$scratch" && sha256sum -c --quiet .built_manifest 2> /dev/null \
      | sed -n 's/: FAILED$//p' | xargs -r touch)
    (cd "$scratch" && TORCH_CUDA_ARCH_LIST="$archs" BLOCKFP8_ARCH_JOBS=${BLOCKFP8_ARCH_JOBS:-2} MAX_JOBS=${MAX_JOBS:-2} \
      "$PY" setup.py -q build_ext --inplace > build.log 2>&1) || { tail -n 30 "$scratch/build.log"; exit 1; }
    xz -T0 -6 -c "$scratch/vllm_blockfp8/_C.abi3.so" > .prebuilt/_C.abi3.so.xz || exit 1
    # The hash and manifest of what was built (the copy), which the tree may have moved past during the build.
    (cd "$scratch" && sha256sum $files > .built_manifest && cp .built_manifest "$OLDPWD/.prebuilt/manifest") || exit 1
    echo "$(cd "$scratch" && cat $files | sha256sum | cut -c1-16)-$archs" > .prebuilt/hash
    echo "packed .prebuilt/_C.abi3.so.xz ($(du -h .prebuilt/_C.abi3.so.xz | cut -f1)) for $(cat .prebuilt/hash)"
    [ "$(cat .prebuilt/hash)" = "$(source_hash "$archs")" ] \
      || echo "prebuilt: the tree changed while this pack ran: it holds the sources of its start; pack again"
    ;;
  pack-base)
    rev=${2:?REV} archs=${3:-8.9;9.0a} base=${TMPDIR:-/tmp}/blockfp8-base-tree
    # An archive keeps the commit's times (older than the scratch's objects); pack touches what differs from its last
    # build. pack copies what git lists, hence the throwaway repository.
    rm -rf "$base" && mkdir -p "$base" && { git archive "$rev" | tar -xf - -C "$base"; } || exit 1
    (cd "$base" && git init -q && git add -A) || exit 1
    (cd "$base" && PYTHON="$PY" bash dev/device/prebuilt.sh pack "$archs") || exit 1
    rm -rf .prebuilt_base && cp -r "$base/.prebuilt" .prebuilt_base && rm -rf "$base" || exit 1
    echo "packed .prebuilt_base from $rev ($(cat .prebuilt_base/hash))"
    ;;
  install)
    archs=${2:?ARCHS}
    [ -f .prebuilt/_C.abi3.so.xz ] || exit 0
    want=$(source_hash "$archs") lib=${TMPDIR:-/tmp}/blockfp8_C.abi3.so
    if [ "$(cat .prebuilt/hash 2>/dev/null)" != "$want" ]; then
      echo "prebuilt: .prebuilt was built from other sources or archs ($(cat .prebuilt/hash 2>/dev/null) vs $want): compiling"
      [ -f .prebuilt/manifest ] && diff <(sha256sum $(sources)) .prebuilt/manifest | grep '^[<>]' | head -n 10
      exit 0
    fi
    "$PY" -c "import lzma, shutil, sys; shutil.copyfileobj(lzma.open(sys.argv[1]), open(sys.argv[2], 'wb'))" \
      .prebuilt/_C.abi3.so.xz "$lib" || exit 0
    cp "$lib" vllm_blockfp8/_C.abi3.so
    if BLOCKFP8_PREBUILT_EXT="$lib" "$PY" -m pip install -q --no-build-isolation --no-deps -e . > "$lib.log" 2>&1; then
      echo "$want" > vllm_blockfp8/.build_stamp
      echo "prebuilt: installed the carried build ($want)"
    else
      rm -f vllm_blockfp8/_C.abi3.so
      echo "prebuilt: install failed (compiling instead):"; tail -n 5 "$lib.log"
    fi
    ;;
  hash) source_hash "${2:?ARCHS}" ;;
  *) echo "usage: dev/device/prebuilt.sh pack [ARCHS] | pack-base REV [ARCHS] | hash ARCHS | install ARCHS" >&2; exit 2 ;;
esac
