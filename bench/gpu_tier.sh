#!/usr/bin/env bash
# The GPU tier in about 10 minutes of device time, as two calls of under 10 minutes (a cold start of the
# 135M shape compiles for about 100 s): STAGES="tests profile serve serve_baseline", then
# STAGES="profile1b serve1b". It runs, on a machine with CUDA, torch, Triton and transformers but
# no network (the lent GPU machines): the tests that run on the GPU when it has one, the step profile
# (kernels per step, GPU busy time, wall time) at the bundled model's shape and at Llama-3.2-1B's, and
# real `rill serve --device cuda` servers under load: the 135M shape at concurrency 32 (this tree, and
# the baseline tree in .gpu/baseline when there is one, with the same client), the 1B shape at
# concurrency 1 and 32. Wheels the machine lacks (msgspec, pyzmq, granian for its Python) are
# installed from ./.whl when that folder exists. Weights are random (`--load-format dummy`) over the
# model directories in .gpu/ (configs and tokenizers only: python -m rill.bench.kernels.dummy_model_dir):
# the same shapes and the same work per step. Everything lands in $OUT/gpu-tier.tar.gz, re-packed
# after each stage so a run cut short still brings back what it did.
set -u
OUT=${OUT:-gpu-tier-out}
WORK=/tmp/gpu-tier
mkdir -p "$OUT" "$WORK"
export PYTHONUNBUFFERED=1 HF_HUB_OFFLINE=1 PYTHONPATH="$PWD:/tmp/site"
mkdir -p /tmp/site
[ -d "${WHEELS:-.whl}" ] && python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site "${WHEELS:-.whl}"/*.whl
# Not installed here: the repo's folders as the packages an install names rill.asgi, rill.engine_proc, ...
for tree in . .gpu/baseline; do
  [ -d "$tree/rill" ] && for d in asgi engine_proc ipc bench templates; do ln -sfn "../$d" "$tree/rill/$d"; done
done
STAGES=${STAGES:-tests profile serve serve_baseline profile1b serve1b}  # a rerun can name fewer
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv | tee "$WORK/gpu.txt"
python3 -c "import torch, triton, transformers; print('torch', torch.__version__, 'triton', triton.__version__,
'transformers', transformers.__version__, torch.cuda.get_device_name())" | tee -a "$WORK/gpu.txt"

stage() {  # stage NAME SECONDS COMMAND...: bounded, logged, and the next stage runs whatever this one did
  local name=$1 limit=$2; shift 2
  case " $STAGES " in *" $name "*) ;; *) return ;; esac
  echo "== $name (at most $limit s)"
  local start=$SECONDS
  timeout "$limit" "$@" > "$WORK/$name.log" 2>&1
  echo "== $name: exit $? in $((SECONDS - start)) s" | tee -a "$WORK/stages.txt"
  tail -n 12 "$WORK/$name.log"
  tar czf "$OUT/gpu-tier.tar.gz" -C "$WORK" .
}

stage tests 150 python3 -m pytest -q -p no:cacheprovider -o addopts= \
  tests/model/test_triton_decode.py tests/model/test_triton_kernels.py tests/model/test_triton_path.py \
  tests/model/test_triton_ops.py tests/model/test_compiled_prefill.py tests/model/test_prompt_graphs.py \
  tests/model/test_gpu_decode_graphs.py "tests/model/test_transformers_route.py::test_the_triton_backend_under_the_route_matches_transformers"
stage profile 150 python3 -m rill.bench.kernels.gpu_step_profile --model .gpu/smollm2-dummy --out "$WORK/profile-135m.json"

# serve_and_load TREE MODEL LABEL PORT CONCURRENCY:PROMPTS...: a server from TREE on the GPU behind the
# real HTTP stack, loaded by this tree's client with 128-token prompts and 128 forced output tokens.
serve_and_load() {
  local tree=$1 model=$2 label=$3 port=$4; shift 4
  (cd "$tree" && PYTHONPATH="$PWD:/tmp/site" exec python3 -c \
    'import sys; from rill.cli import main; sys.argv[0] = "rill"; sys.exit(main())' serve \
    --model "$OLDPWD/$model" --load-format dummy --served-model-name dummy --port "$port" \
    --max-model-len 2048) > "$WORK/$label-server.log" 2>&1 &
  local pid=$!
  for _ in $(seq 150); do curl -sf "localhost:$port/ready" > /dev/null && break; sleep 1; done
  grep -E "compiled|captured|KV cache" "$WORK/$label-server.log" | tail -n 4
  for load in "$@"; do
    python3 -m rill.bench serve --port "$port" --endpoint /v1/completions --num-prompts "${load#*:}" \
      --max-concurrency "${load%%:*}" --random-input-len 128 --random-output-len 128 --ignore-eos \
      --disable-tqdm --num-warmups 2 --tokenizer "$model" --save-result --result-dir "$WORK" \
      --label "$label-c${load%%:*}" | grep -E "throughput|TTFT|ITL|TPOT|Failed" | head -n 8
  done
  kill -INT $pid
  for _ in $(seq 10); do kill -0 $pid 2> /dev/null || break; sleep 1; done
  kill_tree $pid
  return 0
}
kill_tree() {  # a process and every descendant, by their parent ids
  local child
  for child in $(pgrep -P "$1"); do kill_tree "$child"; done
  kill -9 "$1" 2> /dev/null
}
export -f kill_tree
export -f serve_and_load
export OUT WORK
stage serve 110 bash -c 'serve_and_load . .gpu/smollm2-dummy serve-135m 8123 32:128'
[ -d .gpu/baseline ] && stage serve_baseline 75 bash -c 'serve_and_load .gpu/baseline .gpu/smollm2-dummy baseline-135m 8124 32:128'
stage profile1b 90 python3 -m rill.bench.kernels.gpu_step_profile --model .gpu/llama-3.2-1b-dummy --out "$WORK/profile-1b.json"
stage serve1b 90 bash -c 'serve_and_load . .gpu/llama-3.2-1b-dummy serve-1b 8125 1:16 32:128'
cat "$WORK/stages.txt"
