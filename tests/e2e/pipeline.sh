#!/usr/bin/env bash
# The end-to-end run on a GPU machine (issue 8), after tests/e2e/device_stage.sh has installed the
# staged vLLM 0.23.0 into $SITE. Runs in the repository root. One step or all of them:
#
#   ckpt     build a tiny random-weight GLM-5 HF checkpoint: tests/support/tiny_glm5.py --serve
#            (no MTP layer; lm_head rows of the special tokens zero, so sampled text never stops
#            at once and the smoke client's non-empty checks cannot fail by chance), or the
#            patch proof's model (with its MTP layer) with CKPT_BUILDER=proof
#   convert  llama.cpp's convert_hf_to_gguf.py: quantised ($OUTTYPE) and split into shards
#            (--split-max-tensors, llama.cpp's -NNNNN-of-MMMMM.gguf naming)
#   merge    scripts/gguf_merge.py SHARD MERGED; the tensor count checked with gguf-py
#   repro    on PRISTINE vLLM (the series is reverted first): the speculators ValueError, the
#            GGUF dtype refusal, the no-valid-backend error in fp16 -> $OUT/failures.json
#   patch    scripts/vllm_patches.py apply + verify on $SITE; pip install ./backend into $SITE
#   serve    vllm serve MERGED --hf-config-path CKPT --tokenizer CKPT --dtype float16
#            --attention-backend CUSTOM --api-key KEY, CUDA graphs on, in the background
#   health   wait (bounded) for /health
#   routes   tests/e2e/route_check.py: every route of the real app (its /openapi.json) answers 401
#            without the key and with a wrong one, /health and /ping 200 -> $OUT/routes.json
#   smoke    scripts/smoke_test.py against the server -> $OUT/smoke.json
#   backends scripts/probe_backends.py (capability detected, and 12.0), after the server has
#            started: a second CUDA process during vLLM's memory profiling can fail its start
#   stop     stop the server
# Steps outside `all`, named explicitly:
#   indexshare  tests/e2e/index_share_check.py (GENERATION=5.2, TOPK_DUMP=N at serve): the shared
#               layers' top-k rows equal the last full layer's; greedy tokens + prompt logprobs
#               for the reference comparison -> $OUT/index_share.json, capture.json, topk.pt
#   tools       tests/e2e/tool_check.py (SERVE_EXTRA with the GLM parsers, CHAT_TEMPLATE):
#               tool-call and thinking requests, streamed and not -> $OUT/tools.json
#   reference   tests/e2e/reference_check.py, after indexshare (needs its capture.json and
#               topk.pt, not the server): the served greedy tokens and prompt logprobs vs an
#               independent float64 forward of the merged GGUF (tests/support/glm5_reference.py),
#               judged against the larger of vLLM's own backend spread (REFERENCE_SPREAD) and
#               the reference's own sensitivity in the served arithmetic (float16 + the Q8_1
#               activations of vLLM's GGUF kernels) -> $OUT/reference.json
# Every invocation ends with a report: $OUT/summary.json (step times and statuses, failure
# messages, smoke figures), $OUT/server.log, $OUT/logs.tgz (every log), at most 8 files.
#
# usage: tests/e2e/pipeline.sh [--dry-run] all | STEP...
# Environment (defaults): OUT (./e2e-out), WORK (/tmp/e2e), SITE (/tmp/site), SMOKE_SITE
#   (/tmp/smoke-site), PY (python3), LLAMA_CPP ($WORK/llama_cpp), PORT (8000), DEADLINE (570 s for
#   one invocation: steps that would start later are skipped), SERVE_TIMEOUT (420 s),
#   CKPT_BUILDER (e2e|proof), INDEXER (auto|triton|deepgemm: the plugin's sparse_mla_indexer,
#   sent as --additional-config), OUTTYPE (q8_0), SPLIT_TENSORS (20), SERVE_EXTRA (extra
#   serve flags), SMOKE_ARGS, SMOKE_BASE_URL (http://127.0.0.1:$PORT/v1), PLUGIN_INSTALL
#   (a command replacing the pip install of ./backend), GENERATION (5|5.1|5.2: tiny_glm5.py
#   --generation), LAYERS (trunk layers; 7 for 5.2, so layers 3-5 are shared), TOPK_DUMP (N: the
#   server saves each layer's top-k rows of an N-token forward, VLLM_SPARSE_MLA_DUMP_TOPK),
#   CHAT_TEMPLATE (glm47 or a .jinja path: tests/support/glm5_chat.py adds GLM's tool/think tokens
#   and the template to the HF dir before serving), REFERENCE_SPREAD (a capture.json of the same
#   prompts from another vLLM backend, the spread measured in the run; default: the plugin
#   proof's committed fp16-vs-bf16 figure).
# Exit: 0 all selected steps passed, 1 a step failed or was skipped, 2 usage.
set -uo pipefail

STEPS=(ckpt convert merge repro patch serve health routes smoke backends stop)
EXTRA_STEPS=(indexshare tools reference)   # not in `all`
CRITICAL=" ckpt convert merge patch serve health "   # a failure here skips the later steps

usage() { sed -n '2,/^# Exit/p' "$0" | sed 's/^# \{0,1\}//'; }
DRY_RUN=0
selected=()
for a in "$@"; do
  case "$a" in
    --dry-run) DRY_RUN=1 ;;
    -h|--help) usage; exit 0 ;;
    all) selected+=("${STEPS[@]}") ;;
    *) if [[ " ${STEPS[*]} ${EXTRA_STEPS[*]} " == *" $a "* ]]; then selected+=("$a")
       else echo "error: unknown step '$a' (steps: ${STEPS[*]} ${EXTRA_STEPS[*]} all)" >&2; exit 2; fi ;;
  esac
done
[ ${#selected[@]} -gt 0 ] || { echo "error: name a step or 'all' (steps: ${STEPS[*]})" >&2; exit 2; }

REPO=$(cd "$(dirname "$0")/../.." && pwd)
cd "$REPO" || exit 1
OUT=${OUT:-$REPO/e2e-out}
WORK=${WORK:-/tmp/e2e}
SITE=${SITE:-/tmp/site}
SMOKE_SITE=${SMOKE_SITE:-/tmp/smoke-site}
PY=${PY:-python3}
LLAMA_CPP=${LLAMA_CPP:-$WORK/llama_cpp}
PORT=${PORT:-8000}
DEADLINE=${DEADLINE:-570}
SERVE_TIMEOUT=${SERVE_TIMEOUT:-420}
CKPT_BUILDER=${CKPT_BUILDER:-e2e}
OUTTYPE=${OUTTYPE:-q8_0}
SPLIT_TENSORS=${SPLIT_TENSORS:-20}
SERVE_EXTRA=${SERVE_EXTRA:-}
INDEXER=${INDEXER:-auto}
SMOKE_ARGS=${SMOKE_ARGS:---requests 16 --concurrency 8 --max-tokens 64}
SMOKE_BASE_URL=${SMOKE_BASE_URL:-http://127.0.0.1:$PORT/v1}
MODEL_NAME=${MODEL_NAME:-glm5-tiny}
GENERATION=${GENERATION:-5}
LAYERS=${LAYERS:-}
[ -n "$LAYERS" ] || [ "$GENERATION" != 5.2 ] || LAYERS=7
TOPK_DUMP=${TOPK_DUMP:-}
CHAT_TEMPLATE=${CHAT_TEMPLATE:-}
[ "$CHAT_TEMPLATE" != glm47 ] || CHAT_TEMPLATE=$REPO/tests/support/templates/glm47.jinja
CKPT=$WORK/ckpt
GGUF_DIR=$WORK/gguf
STEM=tiny-glm5-${OUTTYPE^^}
MERGED=$WORK/$STEM.gguf
LOGS=$WORK/logs
PIDFILE=$WORK/server.pid

export PYTHONPATH=$SITE${PYTHONPATH:+:$PYTHONPATH}
export VLLM_USE_FLASHINFER_SAMPLER=0 PYTHONUNBUFFERED=1 HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1
export VLLM_NO_USAGE_STATS=1 DO_NOT_TRACK=1 TOKENIZERS_PARALLELISM=false
command -v patch >/dev/null || export PATH=$WORK/wheels/bin:$PATH   # staged GNU patch

T0=$(date +%s)
elapsed() { echo $(( $(date +%s) - T0 )); }
say() { printf '[e2e %(%H:%M:%S)T +%ss] %s\n' -1 "$(elapsed)" "$*"; }
# x CMD...: print the command; run it unless --dry-run
x() {
  { printf '+'; printf ' %q' "$@"; printf '\n'; } | redact
  [ "$DRY_RUN" = 1 ] && return 0
  "$@"
}
# xl LOG CMD...: the same, output appended to $LOGS/LOG and shown
xl() {
  local log=$1; shift
  { printf '+'; printf ' %q' "$@"; printf ' >> %s\n' "$LOGS/$log"; } | redact
  [ "$DRY_RUN" = 1 ] && return 0
  "$@" 2>&1 | tee -a "$LOGS/$log"
  return "${PIPESTATUS[0]}"
}
server_alive() { [ -f "$PIDFILE" ] && kill -0 "$(cat "$PIDFILE")" 2>/dev/null; }
api_key() {
  if [ ! -s "$WORK/api_key" ] && [ "$DRY_RUN" = 0 ]; then
    echo "e2e-$(od -An -N12 -tx1 /dev/urandom | tr -d ' \n')" > "$WORK/api_key"
  fi
  cat "$WORK/api_key" 2>/dev/null || echo KEY
}

step_ckpt() {
  x rm -rf "$CKPT"
  local flavor=--serve
  if [ "$CKPT_BUILDER" = proof ]; then flavor=--mtp-layers=1; fi
  local gen=()
  [ "$GENERATION" = 5 ] || gen+=(--generation "$GENERATION")
  [ -z "$LAYERS" ] || gen+=(--layers "$LAYERS")
  # tests/ holds the builder package (support); $PYTHONPATH the staged torch/tokenizers.
  xl ckpt.log env PYTHONPATH="tests:$PYTHONPATH" "$PY" -m support.tiny_glm5 \
    --out "$CKPT" --seed 0 "$flavor" "${gen[@]}" || return 1
  [ "$DRY_RUN" = 1 ] || { ls -la "$CKPT"; sha256sum "$CKPT/model.safetensors"; } | tee -a "$LOGS/ckpt.log"
}

step_convert() {
  x rm -rf "$GGUF_DIR" && x mkdir -p "$GGUF_DIR"
  xl convert.log env PYTHONPATH="tests:$PYTHONPATH" "$PY" -m support.llama_cpp convert \
    --llama-cpp "$LLAMA_CPP" -- "$CKPT" \
    --outtype "$OUTTYPE" --outfile "$GGUF_DIR/$STEM.gguf" --split-max-tensors "$SPLIT_TENSORS" \
    || return 1
  [ "$DRY_RUN" = 1 ] && return 0
  local n; n=$(ls "$GGUF_DIR"/"$STEM"-000*-of-*.gguf 2>/dev/null | wc -l)
  ls -la "$GGUF_DIR" | tee -a "$LOGS/convert.log"
  [ "$n" -ge 2 ] || { say "error: expected >= 2 shards in $GGUF_DIR, found $n"; return 1; }
}

step_merge() {
  local shard1="$GGUF_DIR/$STEM-00001-of-*.gguf"
  [ "$DRY_RUN" = 1 ] || shard1=$(ls "$GGUF_DIR"/"$STEM"-00001-of-*.gguf 2>/dev/null | head -1)
  x rm -f "$MERGED"
  xl merge.log "$PY" scripts/gguf_merge.py --no-progress "$shard1" "$MERGED" || return 1
  xl merge.log "$PY" -c 'import sys, gguf
r = gguf.GGUFReader(sys.argv[1])
shards = [gguf.GGUFReader(p) for p in sys.argv[2:]]
want = sum(len(s.tensors) for s in shards)
print("merged:", len(r.tensors), "tensors; shards:", want, "; split.count:",
      r.fields["split.count"].contents() if "split.count" in r.fields else None)
sys.exit(0 if len(r.tensors) == want else 1)' "$MERGED" "$GGUF_DIR"/"$STEM"-000*-of-*.gguf || return 1
  [ "$DRY_RUN" = 1 ] || { ls -la "$MERGED"; sha256sum "$MERGED"; } | tee -a "$LOGS/merge.log"
}

step_repro() {
  if [ -f scripts/vllm_patches.py ]; then   # pristine first: revert is a no-op on pristine files
    xl repro.log "$PY" scripts/vllm_patches.py revert --site-packages "$SITE" || return 1
    xl repro.log "$PY" scripts/vllm_patches.py status --site-packages "$SITE"
  fi
  xl repro.log env VLLM_ENABLE_V1_MULTIPROCESSING=0 PYTHONPATH="tests:$PYTHONPATH" \
    "$PY" -m e2e.repro_failures \
    --gguf "$MERGED" --hf-dir "$CKPT" --json "$OUT/failures.json" --log-dir "$LOGS"
}

step_patch() {
  xl patch.log "$PY" scripts/vllm_patches.py apply --site-packages "$SITE" || return 1
  xl patch.log "$PY" scripts/vllm_patches.py verify --site-packages "$SITE" || return 1
  if [ -n "${PLUGIN_INSTALL:-}" ]; then
    xl patch.log bash -c "$PLUGIN_INSTALL" || return 1
  else
    xl patch.log "$PY" -m pip install -q --no-index --no-deps --no-build-isolation --no-compile \
      --upgrade --target "$SITE" ./backend || return 1
  fi
  # vLLM ships entry points of its own in this group: look for the plugin's (backend/pyproject.toml)
  xl patch.log "$PY" -c 'import sys, tomllib
from importlib.metadata import entry_points
with open(sys.argv[1], "rb") as fh:
    want = tomllib.load(fh)["project"]["entry-points"]["vllm.general_plugins"]
have = {e.name: e.value for e in entry_points(group="vllm.general_plugins")}
print("vllm.general_plugins:", have)
missing = {k: v for k, v in want.items() if have.get(k) != v}
print("plugin entry points installed" if not missing else f"error: not installed: {missing}")
sys.exit(1 if missing else 0)' backend/pyproject.toml
}

step_serve() {
  if server_alive; then say "server already running (pid $(cat "$PIDFILE"))"; return 0; fi
  local key; key=$(api_key)
  local mml=4096   # at most the checkpoint's max_position_embeddings
  [ "$DRY_RUN" = 1 ] || mml=$("$PY" -c 'import json, sys
print(min(4096, json.load(open(sys.argv[1])).get("max_position_embeddings", 4096)))' "$CKPT/config.json")
  local cmd=("$PY" -m vllm.entrypoints.cli.main serve "$MERGED" --hf-config-path "$CKPT"
    --tokenizer "$CKPT" --dtype float16 --attention-backend CUSTOM --api-key "$key"
    --host 127.0.0.1 --port "$PORT" --served-model-name "$MODEL_NAME" --max-model-len "$mml"
    --max-num-seqs 32 --gpu-memory-utilization 0.3)
  # shellcheck disable=SC2206  # SERVE_EXTRA is a list of flags
  cmd+=(--additional-config "{\"sparse_mla_indexer\": \"$INDEXER\"}" $SERVE_EXTRA)
  if [ -n "$TOPK_DUMP" ]; then   # the plugin's debug dump, for the indexshare step
    x rm -rf "$WORK/topk"
    cmd=(env "VLLM_SPARSE_MLA_DUMP_TOPK=$WORK/topk:$TOPK_DUMP" "${cmd[@]}")
  fi
  if [ -n "$CHAT_TEMPLATE" ]; then   # GLM's tool/think tokens + template, in the HF dir only
    xl serve.log env PYTHONPATH="tests:$PYTHONPATH" "$PY" -m support.glm5_chat "$CKPT" \
      --template "$CHAT_TEMPLATE" || return 1
  fi
  { printf '+ setsid'; printf ' %q' "${cmd[@]}"; printf ' > %s 2>&1 &\n' "$LOGS/server.log"; } | redact
  [ "$DRY_RUN" = 1 ] && return 0
  date +%s > "$WORK/server.started"
  # own session: survives the end of this device call (stop kills the whole group)
  if command -v setsid >/dev/null; then
    setsid "${cmd[@]}" > "$LOGS/server.log" 2>&1 < /dev/null &
  else
    "${cmd[@]}" > "$LOGS/server.log" 2>&1 < /dev/null &
  fi
  echo $! > "$PIDFILE"
  say "server pid $(cat "$PIDFILE")"
}

step_backends() {
  local common=(--dtype float16 --head-size 576 --sparse --kv-cache-dtype auto --block-size 64)
  x "$PY" scripts/probe_backends.py "${common[@]}" ">" "$LOGS/backends_detected.txt" "&"
  x "$PY" scripts/probe_backends.py --capability 12.0 "${common[@]}" ">" "$LOGS/backends_cc12.txt"
  [ "$DRY_RUN" = 1 ] && return 0
  "$PY" scripts/probe_backends.py "${common[@]}" > "$LOGS/backends_detected.txt" 2>&1 &
  local p1=$!
  "$PY" scripts/probe_backends.py --capability 12.0 "${common[@]}" > "$LOGS/backends_cc12.txt" 2>&1
  local r2=$?
  wait "$p1"; local r1=$?
  { echo "## probe_backends.py ${common[*]} (capability detected), exit $r1"
    cat "$LOGS/backends_detected.txt"
    echo; echo "## probe_backends.py --capability 12.0 ${common[*]}, exit $r2"
    cat "$LOGS/backends_cc12.txt"; } > "$OUT/backends.txt"
  cat "$OUT/backends.txt"
  [ "$r1" = 0 ] && [ "$r2" = 0 ]
}

step_health() {
  local url=http://127.0.0.1:$PORT/health
  local left=$(( DEADLINE - $(elapsed) - 75 ))   # keep time for smoke and stop
  local limit=$(( SERVE_TIMEOUT < left ? SERVE_TIMEOUT : left ))
  echo "+ poll $url every 2 s, at most ${limit} s"
  [ "$DRY_RUN" = 1 ] && return 0
  local started; started=$(cat "$WORK/server.started" 2>/dev/null || date +%s)
  local t=0
  until "$PY" -c 'import sys, urllib.request
sys.exit(0 if urllib.request.urlopen(sys.argv[1], timeout=2).status == 200 else 1)' "$url" 2>/dev/null; do
    if ! server_alive; then say "error: the server exited; last lines:"; tail -n 40 "$LOGS/server.log"; return 1; fi
    if [ "$t" -ge "$limit" ]; then say "error: no /health after ${limit} s; last lines:"; tail -n 40 "$LOGS/server.log"; return 1; fi
    sleep 2; t=$((t + 2))
  done
  echo "healthy $(( $(date +%s) - started )) s after launch" | tee "$LOGS/health.log"
  grep -E "attention backend|Using .*[Bb]ackend|CUSTOM|[Cc]uda ?[Gg]raph|[Gg]raph capturing|torch.compile|Compil|KV cache|Loading weights|Model loading took|\[gguf" \
    "$LOGS/server.log" | head -n 60 | tee -a "$LOGS/health.log"
}

step_routes() {
  [ "$DRY_RUN" = 1 ] || api_key > /dev/null   # the key file exists before the checker reads it
  xl routes.log env PYTHONPATH="tests:scripts:$PYTHONPATH" "$PY" -m e2e.route_check \
    --base-url "http://127.0.0.1:$PORT" --api-key-file "$WORK/api_key" --json "$OUT/routes.json"
}

step_indexshare() {
  if [ -z "$TOPK_DUMP" ]; then say "error: indexshare needs TOPK_DUMP=N (set for serve too)"; return 1; fi
  xl indexshare.log env PYTHONPATH="tests:scripts:$PYTHONPATH" "$PY" -m e2e.index_share_check \
    --base-url "http://127.0.0.1:$PORT" --api-key-file "$WORK/api_key" --model "$MODEL_NAME" \
    --hf-dir "$CKPT" --dump-dir "$WORK/topk" --tokens "$TOPK_DUMP" --json "$OUT/index_share.json" \
    --capture "$OUT/capture.json" --topk-out "$OUT/topk.pt"
}

step_reference() {
  local spread=()
  [ -z "${REFERENCE_SPREAD:-}" ] || spread=(--spread-capture "$REFERENCE_SPREAD")
  xl reference.log env PYTHONPATH="tests:$PYTHONPATH" "$PY" -m e2e.reference_check \
    --capture "$OUT/capture.json" --gguf "$MERGED" --hf-dir "$CKPT" --topk "$OUT/topk.pt" \
    --json "$OUT/reference.json" "${spread[@]}"
}

step_tools() {
  xl tools.log env PYTHONPATH="tests:scripts:$PYTHONPATH" "$PY" -m e2e.tool_check \
    --base-url "http://127.0.0.1:$PORT" --api-key-file "$WORK/api_key" --model "$MODEL_NAME" \
    --server-log "$LOGS/server.log" --json "$OUT/tools.json"
}

step_smoke() {
  local key; key=$(api_key)
  # shellcheck disable=SC2206  # SMOKE_ARGS is a list of flags
  local extra=($SMOKE_ARGS)
  xl smoke.log env PYTHONPATH="$SMOKE_SITE:$PYTHONPATH" "$PY" scripts/smoke_test.py \
    --base-url "$SMOKE_BASE_URL" --api-key "$key" --model "$MODEL_NAME" "${extra[@]}" \
    --json "$OUT/smoke.json"
}

step_stop() {
  echo "+ kill -TERM -- -\$(cat $PIDFILE); wait <= 30 s; kill -KILL"
  [ "$DRY_RUN" = 1 ] && return 0
  if server_alive; then
    local pid; pid=$(cat "$PIDFILE")
    kill -TERM -- "-$pid" 2>/dev/null || kill -TERM "$pid"
    for _ in $(seq 30); do server_alive || break; sleep 1; done
    server_alive && kill -KILL -- "-$pid" 2>/dev/null
    say "server stopped"
  else
    say "no server running"
  fi
  rm -f "$PIDFILE"
}

# The run's key out of everything that leaves WORK: vLLM logs its arguments, the key among them.
redact() {
  local key=""; [ -s "$WORK/api_key" ] && key=$(cat "$WORK/api_key")
  if [ -n "$key" ]; then sed "s/$key/<api-key>/g"; else cat; fi
}

report() {
  echo "== report"
  x "$PY" tests/e2e/e2e_report.py --work "$WORK" --out "$OUT"
  [ "$DRY_RUN" = 1 ] && return 0
  [ -f "$LOGS/server.log" ] && tail -c 8000000 "$LOGS/server.log" | redact > "$OUT/server.log"
  local copy="$WORK/redacted"; rm -rf "$copy"; mkdir -p "$copy/logs"
  for f in "$LOGS"/*; do [ -f "$f" ] && redact < "$f" > "$copy/logs/${f##*/}"; done
  tar -C "$copy" -czf "$OUT/logs.tgz" logs 2>/dev/null
  rm -rf "$copy"
  ls -la "$OUT"
}

[ "$DRY_RUN" = 1 ] || mkdir -p "$OUT" "$WORK" "$LOGS"
[ "$DRY_RUN" = 1 ] || echo "# invocation $T0: ${selected[*]}" >> "$WORK/steps.tsv"
trap 'if [ "$DRY_RUN" = 0 ] && [[ " ${selected[*]} " == *" stop "* ]]; then step_stop; fi' EXIT
say "steps: ${selected[*]} (repo $REPO, WORK $WORK, SITE $SITE, OUT $OUT, deadline ${DEADLINE}s)"
rc=0
blocked=""
for s in "${selected[@]}"; do
  echo "== step $s"
  if [ -n "$blocked" ] && [ "$s" != stop ]; then
    say "skip $s: $blocked failed"; status=skipped
    [ "$DRY_RUN" = 1 ] || printf '%s\t%s\t%s\n' "$s" "$status" 0 >> "$WORK/steps.tsv"
    rc=1; continue
  fi
  if [ "$s" != stop ] && [ "$(elapsed)" -ge $(( DEADLINE - 30 )) ]; then
    say "skip $s: past the deadline of ${DEADLINE}s"; status=skipped; rc=1
    [ "$DRY_RUN" = 1 ] || printf '%s\t%s\t%s\n' "$s" "$status" 0 >> "$WORK/steps.tsv"
    continue
  fi
  t=$(date +%s%N)
  if "step_$s"; then status=ok; else status=failed; rc=1; fi
  secs=$(awk -v a="$t" -v b="$(date +%s%N)" 'BEGIN{printf "%.1f", (b-a)/1e9}')
  say "step $s: $status in ${secs}s"
  [ "$DRY_RUN" = 1 ] || printf '%s\t%s\t%s\n' "$s" "$status" "$secs" >> "$WORK/steps.tsv"
  if [ "$status" = failed ] && [[ "$CRITICAL" == *" $s "* ]]; then blocked=$s; fi
done
if [ -n "$blocked" ] && [[ " ${selected[*]} " == *" serve "* ]] && [ "$DRY_RUN" = 0 ]; then step_stop; fi
report
say "done: exit $rc, $(elapsed) s"
exit "$rc"
