#!/usr/bin/env bash
# Side-by-side comparison of spdl-rs against peer loaders (Meta's SPDL 0.8.0, Pillow, torch DataLoader, NVIDIA DALI
# on the CPU) on three image jobs: resize, eval (center crop), train (random resized crop).
#
# Run through `cargo xtask compare` (or `bash benches/compare/run.sh [compare.py options]`).
# 1. creates `.venv-peers` at the repository root once (SPDL, Pillow, numpy, psutil, matplotlib, torch, torchvision,
#    torchcodec; ~6 GB, a few minutes) and reuses it while the pinned requirement list is unchanged;
#    then tries `pip install nvidia-dali-cuda120` into it once (DALI CPU runners; skipped with the reason if it fails);
# 2. builds the `spdl` CLI in release twice: without `turbojpeg` (pure-Rust zune-jpeg, copied to
#    target/compare/spdl-zune, run as spdl-rs-zune) and with it (target/release/spdl, run as spdl-rs; needs cmake
#    and nasm);
# 3. makes the demo corpus once (`spdl gen-data`, ~2,000 JPEGs) under target/compare-data;
# 4. runs benches/compare/compare.py, which prints the tables and writes docs/benchmarks.md's "## Comparison"
#    section (resize job) and docs/img/compare.png, and "## Comparison by job" and docs/img/compare-jobs.png;
# 5. then the audio/video comparison: builds spdl-io's `av_throughput` example in release and runs
#    benches/compare/av_compare.py, which makes its media once under target/compare-av (ffmpeg CLI) and writes
#    docs/benchmarks.md's "## Audio/video comparison" section.
#    (benches/compare/video_clips.py, clip decoding against SPDL 0.8.0 and torchcodec, is run by hand with this venv.)
#
# 6. then benches/compare/api_surface.py: SPDL 0.8.0's public names that spdl_rs lacks, per module (spdl_rs from
#    `.venv`, built there if it does not import); a gap missing from README.md's list fails the run.
#
# API_ONLY=1 runs only step 6. AV_ONLY=1 runs only step 5 (after the venv); its arguments then go to av_compare.py (e.g. --formats flac,mp3
# --threads 1 --no-docs). SPDL_COMPARE_NO_AV=1 skips step 5; SPDL_AV_ARGS adds options to av_compare.py when it
# runs after the image comparison (`--no-docs` given to compare.py is passed on too).
#
# Environment: PYTHON (interpreter for the venv, default python3), SPDL_PEERS_VENV (venv path),
# SPDL_COMPARE_DATA (corpus directory), SPDL_COMPARE_SETUP_ONLY=1 (stop after the venv is ready),
# SPDL_COMPARE_NO_BUILD=1 (reuse an existing target/release/spdl instead of building it).
# Needs FFmpeg shared libraries (Debian: libavcodec59, libavformat59, ...) for SPDL's spdl.io.
set -euo pipefail

ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
VENV=${SPDL_PEERS_VENV:-$ROOT/.venv-peers}
DATA=${SPDL_COMPARE_DATA:-$ROOT/target/compare-data}
PYTHON=${PYTHON:-python3}

# One pinned list; the venv is rebuilt when it changes.
REQUIREMENTS=(
    "spdl==0.8.0"
    "torch==2.15.0"
    "torchvision==0.29.2"
    "torchcodec==0.17.0"
    "pillow"
    "numpy"
    "psutil"
    "matplotlib"
)

log() { printf 'compare: %s\n' "$*" >&2; }

setup_venv() {
    local marker="$VENV/.spdl-compare-requirements"
    local wanted
    wanted=$(printf '%s\n' "${REQUIREMENTS[@]}")
    if [[ -x "$VENV/bin/python" && -f "$marker" && "$(cat "$marker")" == "$wanted" ]]; then
        log "reusing $VENV"
        return
    fi
    if [[ ! -x "$VENV/bin/python" ]]; then
        log "creating $VENV with $($PYTHON --version 2>&1)"
        "$PYTHON" -m venv "$VENV"
    fi
    log "installing ${REQUIREMENTS[*]} into $VENV (torch is ~5.7 GB: a few minutes)"
    "$VENV/bin/python" -m pip install --quiet --upgrade pip
    "$VENV/bin/python" -m pip install --quiet "${REQUIREMENTS[@]}"
    # Fail here, with the cause, rather than in the middle of a benchmark.
    "$VENV/bin/python" -c 'import spdl.io, spdl.pipeline, torch, torchvision, PIL, numpy, psutil, matplotlib' \
        || { log "the peers venv does not import (FFmpeg runtime libraries missing for spdl.io?)"; exit 1; }
    printf '%s\n' "$wanted" >"$marker"
}

# DALI (CPU only here) is optional: one try per venv; compare.py skips its runners, with the reason, if it does not
# import.
setup_dali() {
    local marker="$VENV/.spdl-compare-dali-tried"
    [[ -f "$marker" ]] && return
    log "installing nvidia-dali-cuda120 into $VENV (optional: DALI CPU runners)"
    "$VENV/bin/python" -m pip install --quiet nvidia-dali-cuda120 || log "nvidia-dali-cuda120 did not install; DALI runners will be skipped"
    touch "$marker"
}

# Audio/video: spdl-io's av_throughput example against Meta SPDL's load_audio/load_video.
run_av() {
    local bin="$ROOT/target/release/examples/av_throughput"
    if [[ "${SPDL_COMPARE_NO_BUILD:-0}" == 1 && -x "$bin" ]]; then
        log "reusing $bin (SPDL_COMPARE_NO_BUILD=1)"
    else
        log "building spdl-io's av_throughput example (release, feature ffmpeg)"
        (cd "$ROOT" && cargo build --release -p spdl-io --example av_throughput --features ffmpeg)
    fi
    "$VENV/bin/python" "$ROOT/benches/compare/av_compare.py" --rust-bin "$bin" "$@"
}


# The API surface: SPDL 0.8.0's public names that spdl_rs lacks, each of which must be on README.md's list.
run_api_surface() {
    local rs_python="$ROOT/.venv/bin/python"
    if [[ ! -x "$rs_python" ]]; then
        log "no $rs_python: run \`cargo xtask test\` once to make it, then the API-surface check runs here"
        return 1
    fi
    if ! "$rs_python" -c 'import spdl_rs' 2>/dev/null; then
        log "building spdl_rs into $ROOT/.venv for the API-surface check"
        (cd "$ROOT" && CARGO_TARGET_DIR=target/py VIRTUAL_ENV="$ROOT/.venv" "$ROOT/.venv/bin/maturin" develop --release \
            --manifest-path crates/spdl-py/Cargo.toml) || return 1
    fi
    "$VENV/bin/python" "$ROOT/benches/compare/api_surface.py" --spdl-python "$VENV/bin/python" --spdl-rs-python "$rs_python"
}

setup_venv
setup_dali
if [[ "${API_ONLY:-0}" == 1 ]]; then
    run_api_surface
    exit
fi
if [[ "${SPDL_COMPARE_SETUP_ONLY:-0}" == 1 ]]; then
    exit 0
fi
if [[ "${AV_ONLY:-0}" == 1 ]]; then
    export SPDL_AV_COMPARE_COMMAND="AV_ONLY=1 bash benches/compare/run.sh${*:+ $*}"
    run_av "$@"
    exit
fi

SPDL="$ROOT/target/release/spdl"
ZUNE="$ROOT/target/compare/spdl-zune"
if [[ "${SPDL_COMPARE_NO_BUILD:-0}" == 1 && -x "$SPDL" ]]; then
    log "reusing $SPDL (SPDL_COMPARE_NO_BUILD=1)"
else
    log "building the spdl CLI (release) without turbojpeg -> $ZUNE"
    (cd "$ROOT" && cargo build --release -p spdl-cli)
    mkdir -p "$(dirname "$ZUNE")"
    cp "$SPDL" "$ZUNE"
    log "building the spdl CLI (release, --features turbojpeg)"
    (cd "$ROOT" && cargo build --release -p spdl-cli --features turbojpeg)
fi
for sub in gen-data bench; do
    if ! "$SPDL" "$sub" --help >/dev/null 2>&1; then
        log "\`spdl $sub\` is not available in $SPDL; cannot run the comparison"
        exit 1
    fi
done

# The corpus is made once; delete the directory to make it again.
if [[ ! -f "$DATA/.spdl-compare-complete" ]]; then
    log "making the demo corpus in $DATA"
    rm -rf "$DATA"
    "$SPDL" gen-data "$DATA"
    touch "$DATA/.spdl-compare-complete"
fi

# Extra arguments go to compare.py (e.g. --rounds 5, --runners spdl-rs,spdl-0.8, --no-docs).
if [[ $# -eq 0 ]]; then
    export SPDL_COMPARE_COMMAND="cargo xtask compare"
else
    export SPDL_COMPARE_COMMAND="bash benches/compare/run.sh $*"
fi
status=0
"$VENV/bin/python" "$ROOT/benches/compare/compare.py" --data "$DATA" --corpus "\`spdl gen-data\`" \
    --spdl-bin "$SPDL" --zune-bin "$ZUNE" "$@" || status=$?

if [[ "${SPDL_COMPARE_NO_AV:-0}" != 1 ]]; then
    av_args=()
    read -r -a av_args <<<"${SPDL_AV_ARGS:-}"
    for arg in "$@"; do
        [[ "$arg" == --no-docs ]] && av_args+=(--no-docs)
    done
    export SPDL_AV_COMPARE_COMMAND="$SPDL_COMPARE_COMMAND${SPDL_AV_ARGS:+ (SPDL_AV_ARGS=$SPDL_AV_ARGS)}"
    run_av "${av_args[@]}" || status=$?
fi

run_api_surface || status=$?
exit "$status"
