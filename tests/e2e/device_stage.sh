#!/usr/bin/env bash
# Device side of the staging: runs on the GPU machine, in the repository root of the sent tree.
#   device_stage.sh recv N   copy the carried chunk folder .vllmstage/stage/cN into /tmp/e2e/chunks
#   device_stage.sh install  reassemble the chunks, check the sha256, untar, pip install every
#                            wheel into $SITE (default /tmp/site; then PYTHONPATH=$SITE), the
#                            controller's openai into $SMOKE_SITE, llama.cpp's converter into
#                            /tmp/e2e/llama_cpp
# Adapted from the workplace's shared device-vllm recipe. Needs nothing but bash, coreutils, tar
# and the image's python3 (pip). Prints one STAGE line with timings.
set -euo pipefail
STAGE=${STAGE:-.vllmstage/stage}
WORK=${WORK:-/tmp/e2e}
SITE=${SITE:-/tmp/site}
SMOKE_SITE=${SMOKE_SITE:-/tmp/smoke-site}
PY=${PY:-python3}
chunks=$WORK/chunks

case "${1:-}" in
  recv)
    [ -n "${2:-}" ] || { echo "error: usage: device_stage.sh recv N" >&2; exit 2; }
    [ -d "$STAGE/c$2" ] || { echo "error: $STAGE/c$2 not carried (name it in carry)" >&2; exit 1; }
    mkdir -p "$chunks"
    cp "$STAGE/c$2"/* "$chunks"/
    ls -la "$chunks" ;;
  install)
    t0=$(date +%s%N)
    if [ -f "$WORK/STAGED" ] && [ ! -f "$chunks/part.0" ]; then   # a repeated call on a warm machine
      echo "STAGE already installed in $SITE ($(cat "$WORK/STAGED"))"; exit 0
    fi
    [ -f "$chunks/payload.sha256" ] || { echo "error: payload.sha256 missing: was the last chunk received?" >&2; exit 1; }
    cd "$chunks"
    n=$(cat chunks.count)
    for i in $(seq 0 $((n - 1))); do
      [ -f "part.$i" ] || { echo "error: part.$i missing: receive every chunk (recv 1..$n) first" >&2; exit 1; }
    done
    for i in $(seq 0 $((n - 1))); do cat "part.$i"; done > payload.tar
    sha256sum -c payload.sha256 || { sha256sum payload.tar; exit 1; }
    rm -f part.*
    rm -rf "$WORK/wheels" "$WORK/llama_cpp"
    tar -xf payload.tar -C "$WORK" && rm -f payload.tar
    mkdir -p "$WORK/llama_cpp" && tar -xzf "$WORK/wheels/llama_cpp.tgz" -C "$WORK/llama_cpp"
    t1=$(date +%s%N)
    "$PY" -m pip install -q --disable-pip-version-check --no-index --no-deps --no-compile --no-cache-dir --upgrade \
      --target "$SITE" "$WORK"/wheels/*.whl
    if compgen -G "$WORK/wheels/smoke/*.whl" >/dev/null; then
      "$PY" -m pip install -q --disable-pip-version-check --no-index --no-deps --no-compile --no-cache-dir --upgrade \
        --target "$SMOKE_SITE" "$WORK"/wheels/smoke/*.whl
    fi
    t2=$(date +%s%N)
    date -u +%FT%TZ > "$WORK/STAGED"
    echo "STAGE reassemble+untar $(( (t1 - t0) / 1000000 )) ms, pip install $(( (t2 - t1) / 1000000 )) ms," \
      "wheels $(ls "$WORK"/wheels/*.whl | wc -l), $SITE $(du -sh "$SITE" | cut -f1)" ;;
  *)
    echo "error: usage: device_stage.sh recv N | install" >&2; exit 2 ;;
esac
