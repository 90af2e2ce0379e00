#!/usr/bin/env bash
# One prepared GPU session (see benchmarks/README or the closing notes): train the heads with the GPU preset, then
# run `bench` on CUDA in bf16 and fp32, profile a decode step (benchmarks/step_profile.py), and a second training on
# the greedy responses alone (the data-scaling control). Every stage has its own time limit, and what each leaves is
# packed into $OUT as soon as it ends.
#   PRESET=configuration/smollm2-135m-gpu.yaml OUT=/tmp/out bash benchmarks/gpu_run.sh
# Environment: PRESET, PROMPTS, CHAINED_PRESET (a chained drafter on the same answers, after the first training), OUT,
# DEVICE (cuda), BENCH_LIMIT (8 prompts), BENCH_TOKENS (128), and TRAIN_S / BENCH_S /
# PROFILE_S / CONTROL_S / CHAINED_S: seconds allowed to each stage.
set -u
PRESET=${PRESET:-configuration/smollm2-135m-gpu.yaml}
OUT=${OUT:?set OUT to the folder for results}
DEVICE=${DEVICE:-cuda}
RUN=${RUN:-outputs/gpu-run}
# PROMPTS: a JSONL of prompts (written by benchmarks/export_prompts.py; carry it with the run) that replaces the
# preset's `data:` list, for presets whose prompt packages this machine cannot install (it reaches no registry).
if [ -n "${PROMPTS:-}" ]; then
  mkdir -p "$RUN" && sed "s|^  data: .*|  data: $PROMPTS|" "$PRESET" > "$RUN/preset.yaml" && PRESET=$RUN/preset.yaml
fi
# A preset whose answers come from vLLM (distill_engine: vllm) needs its answer cache carried: the GPU machine has no
# vLLM. Without the cache, its answers are written here by generate() instead, in GPU-sized batches and into a cache
# of their own (a cache written by one engine is never reused by the other).
# Answers committed under benchmarks/data (written by vLLM on a CPU: docs/training.md) travel with the working tree;
# they are unpacked into the cache first: the greedy file whole, the sampled rounds from their parts, in order.
unpack_committed_answers() {  # unpack_committed_answers CACHE
  local name; name=$(basename "$1" .jsonl)
  if [ ! -f "$1" ] && [ -f "benchmarks/data/$name.jsonl.gz" ]; then
    mkdir -p "$(dirname "$1")" && gunzip -c "benchmarks/data/$name.jsonl.gz" > "$1"
    local parts=(benchmarks/data/"$name".sampled.part*.jsonl.gz)
    [ -f "${parts[0]}" ] && cat "${parts[@]}" | gunzip > "${1%.jsonl}.sampled.jsonl"
    echo "answers unpacked from benchmarks/data: $(wc -l < "$1") greedy, $(cat "${1%.jsonl}.sampled.jsonl" 2>/dev/null | wc -l) sampled"
  fi
}
generate_answers_here() {  # generate_answers_here PRESET_IN PRESET_OUT
  local cache
  cache=$(python3 -c "import yaml,sys; t=yaml.safe_load(open('$1'))['train']; print(t['data_cache'] if t.get('distill_engine') == 'vllm' else '')")
  [ -n "$cache" ] && unpack_committed_answers "$cache"
  local short=""
  if [ -n "$cache" ] && [ -f "$cache" ]; then  # vLLM's answers unfinished: this machine cannot write the rest
    short=$(python3 - "$1" "$cache" <<'PY'
import os, sys, yaml
train = yaml.safe_load(open(sys.argv[1]))["train"]
count = lambda f: sum(1 for _ in open(f)) if os.path.exists(f) else 0
greedy, sampled = count(sys.argv[2]), count(sys.argv[2].removesuffix(".jsonl") + ".sampled.jsonl")
prompts = min(train["num_prompts"], greedy)
edits = [f"s|^  num_prompts: .*|  num_prompts: {prompts}|"] if prompts < train["num_prompts"] else []
if sampled < prompts * train.get("sampled_per_prompt", 0):
    edits.append("s|^  sampled_per_prompt: .*|  sampled_per_prompt: 0|")
print(";".join(edits))
PY
)
  fi
  if [ -n "$short" ]; then
    echo "the committed answers are unfinished ($short): training on the answers there are"
    sed "$short" "$1" > "$2"
  elif [ -n "$cache" ] && [ ! -f "$cache" ]; then
    echo "no vLLM answer cache $cache carried: the answers are written here by generate()"
    sed -e '/^  distill_engine: /d' -e '/^  distill_dtype: /d' -e 's|^  distill_batch_size: .*|  distill_batch_size: 384|' \
        -e "s|^  data_cache: .*|  data_cache: ${cache%.jsonl}-generate.jsonl|" "$1" > "$2"
  elif [ "$1" != "$2" ]; then
    cp "$1" "$2"
  fi
}
export PYTHONUNBUFFERED=1 TRANSFORMERS_MTP_DEBUG=1 TOKENIZERS_PARALLELISM=false
mkdir -p "$OUT" "$RUN"
stamp() { echo "=== $(date +%T) $*"; }
# The device tool returns at most 8 files from $OUT, 16 MiB each: this script writes 8 (train.log, heads, corpus,
# chained.log, chained, bench, step_profile.json, control), and packs adapters, never checkpoints (a checkpoint's
# optimizer state made a pack of 33 MB in a CPU dry run; the --time-limit of each training stage makes sure its
# adapter is written).
pack() {  # pack FILE.tar.gz PATHS...: whatever of PATHS exists
  local name=$1; shift
  local present=(); for p in "$@"; do [ -e "$p" ] && present+=("$p"); done
  [ ${#present[@]} -gt 0 ] && tar czf "$OUT/$name" "${present[@]}" && ls -la "$OUT/$name"
  if [ -f "$OUT/$name" ] && [ "$(stat -c %s "$OUT/$name")" -gt $((16 * 1024 * 1024)) ]; then
    echo "WARNING: $OUT/$name is over 16 MiB: the device tool will not return it"
  fi
}

mkdir -p "$RUN"
generate_answers_here "$PRESET" "$RUN/answers-preset.yaml" && PRESET=$RUN/answers-preset.yaml
stamp environment
python3 -c "import torch, transformers, peft; print('torch', torch.__version__, 'transformers', transformers.__version__,
'peft', peft.__version__, 'cuda', torch.cuda.is_available(), torch.cuda.get_device_name() if torch.cuda.is_available() else '')"

# train_for SECONDS ARGS...: a training stage of SECONDS in all. Its steps stop 30 s before the end (--time-limit,
# answers and features included) and the run then evaluates and saves its heads as a finished one does; the hard
# timeout only acts if that end takes more than a minute.
train_for() {
  local seconds=$1; shift
  timeout "$((seconds + 30))" python3 -m transformers_mtp train --time-limit "$((seconds - 30))" "$@"
}

stamp "train (${TRAIN_S:-330} s)"
rm -rf "$RUN/heads"
train_for "${TRAIN_S:-330}" --preset "$PRESET" --output-dir "$RUN/heads" \
  --device "$DEVICE" 2>&1 | grep -v "it/s\]$" | tee "$OUT/train.log" | tail -40
cache=$(python3 -c "import yaml,sys; print(yaml.safe_load(open('$PRESET'))['train']['data_cache'])")
pack heads.tar.gz "$RUN/heads/adapter"
pack corpus.tar.gz "$cache" "${cache%.jsonl}.sampled.jsonl"

if [ -n "${CHAINED_PRESET:-}" ]; then  # a chained drafter on the same answers (the preset names the same data_cache)
  chained=$CHAINED_PRESET
  [ -n "${PROMPTS:-}" ] && sed "s|^  data: .*|  data: $PROMPTS|" "$CHAINED_PRESET" > "$RUN/chained.yaml" && chained=$RUN/chained.yaml
  generate_answers_here "$chained" "$RUN/chained-answers.yaml" && chained=$RUN/chained-answers.yaml
  stamp "train the chained drafter (${CHAINED_S:-150} s)"
  rm -rf "$RUN/chained"
  train_for "${CHAINED_S:-150}" --preset "$chained" --output-dir "$RUN/chained" \
    --device "$DEVICE" 2>&1 | grep -v "it/s\]$" | tee "$OUT/chained.log" | tail -20
  pack chained.tar.gz "$RUN/chained/adapter"
fi

stamp "bench on $DEVICE (${BENCH_S:-150} s)"
model_arg=(); [ -f "$RUN/heads/merged/config.json" ] && model_arg=(--model "$RUN/heads/merged")
for dtype in bfloat16 float32; do
  timeout "${BENCH_S:-150}" python3 -m transformers_mtp bench "${model_arg[@]}" --device "$DEVICE" --dtype "$dtype" \
    --limit "${BENCH_LIMIT:-8}" --max-new-tokens "${BENCH_TOKENS:-128}" --modes verified prompt_lookup \
    --draft-tree-sizes ${BENCH_TREES:-0 8 16} \
    --output-dir "$RUN/bench-$dtype" 2>&1 | grep -v "it/s\]$" | tail -25
done
pack bench.tar.gz "$RUN/bench-bfloat16" "$RUN/bench-float32"

stamp "step profile on $DEVICE, shipped heads (${PROFILE_S:-120} s): why bf16 verified lost to bf16 greedy"
timeout "${PROFILE_S:-120}" python3 benchmarks/step_profile.py --device "$DEVICE" --dtype bfloat16 float32 \
  --limit 2 --repeats 2 --max-new-tokens "${BENCH_TOKENS:-128}" --output "$OUT/step_profile.json" 2>&1 | grep -v "it/s\]$" | tail -30

stamp "control: greedy responses only (${CONTROL_S:-150} s)"
sed 's/^  sampled_per_prompt: .*/  sampled_per_prompt: 0/' "$PRESET" > "$RUN/greedy-only.yaml"
rm -rf "$RUN/greedy-only"
train_for "${CONTROL_S:-150}" --preset "$RUN/greedy-only.yaml" \
  --output-dir "$RUN/greedy-only" --device "$DEVICE" 2>&1 | grep -v "it/s\]$" | tee "$RUN/control.log" | tail -15
pack control.tar.gz "$RUN/greedy-only/adapter" "$RUN/control.log"
stamp done
