#!/usr/bin/env bash
# The GPU tier in one run, on a machine with CUDA, torch, Triton and transformers but no network
# (the lent GPU machines): the tests marked gpu or run on the GPU when it has one, the engine
# step benchmark on the GPU, and one real `rill serve --device cuda` under load. Logs and result
# files go to $OUT (default: gpu-tier-out). Wheels the machine lacks (msgspec, pyzmq, granian for
# its Python) are installed from ./.whl when that folder exists; the bundled model's weights
# (98 MB) are not carried, so the benchmark and the server use its config with random weights
# (`--load-format dummy`, a copy of the converted model's directory without its weights in
# .gpu/smollm2-dummy): the same shapes and the same work per step.
set -u
OUT=${OUT:-gpu-tier-out}
mkdir -p "$OUT"
export PYTHONUNBUFFERED=1 HF_HUB_OFFLINE=1 PYTHONPATH="$PWD:/tmp/site"
mkdir -p /tmp/site
[ -d .whl ] && python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl
# Not installed here: the repo's folders as the packages an install names rill.asgi, rill.engine_proc, ...
for d in asgi engine_proc ipc bench templates; do ln -sfn "../$d" "rill/$d"; done
STAGES=${STAGES:-tests profile engine_step serve}  # a rerun can name fewer
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv | tee "$OUT/gpu.txt"
python3 -c "import torch, triton, transformers; print('torch', torch.__version__, 'triton', triton.__version__,
'transformers', transformers.__version__, torch.cuda.get_device_name())" | tee -a "$OUT/gpu.txt"

stage() {  # stage NAME SECONDS COMMAND...: bounded, logged, and the next stage runs whatever this one did
  local name=$1 limit=$2; shift 2
  case " $STAGES " in *" $name "*) ;; *) return ;; esac
  echo "== $name (at most $limit s)"
  local start=$SECONDS
  timeout "$limit" "$@" > "$OUT/$name.log" 2>&1
  echo "== $name: exit $? in $((SECONDS - start)) s"
  tail -n 25 "$OUT/$name.log"
}

stage tests 180 python3 -m pytest -q -p no:cacheprovider -o addopts= \
  tests/model/test_triton_kernels.py tests/model/test_triton_path.py tests/model/test_gpu_decode_graphs.py
stage profile 130 python3 -m rill.bench.kernels.gpu_step_profile --model .gpu/smollm2-dummy --out "$OUT/profile-135m.json"
stage profile1b 130 python3 -m rill.bench.kernels.gpu_step_profile --model bench/models/llama-3.2-1b --out "$OUT/profile-1b.json"
stage engine_step 200 python3 -m rill.bench.kernels.engine_step --device cuda --dtype bfloat16 --model .gpu/smollm2-dummy \
  --batch-sizes 1,8,32 --rounds 3 --machine gpu --out "$OUT/engine_step-bfloat16-cuda-gpu.json"

# A served run: the engine process on the GPU behind the real HTTP stack, 128 in / 128 out at concurrency 32.
serve_and_load() {
  python3 -c 'import sys; from rill.cli import main; sys.argv[0] = "rill"; sys.exit(main())' serve \
    --model .gpu/smollm2-dummy --load-format dummy --served-model-name smollm2-dummy --port 8123 \
    --max-model-len 2048 > "$OUT/serve_stderr.log" 2>&1 &
  local pid=$!
  for _ in $(seq 150); do curl -sf localhost:8123/ready > /dev/null && break; sleep 1; done
  curl -s localhost:8123/stats; echo
  curl -s localhost:8123/v1/chat/completions -H 'content-type: application/json' \
    -d '{"model": "smollm2-dummy", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 8}'; echo
  python3 -m rill.bench serve --port 8123 --endpoint /v1/completions --num-prompts 128 --max-concurrency 32 \
    --random-input-len 128 --random-output-len 128 --ignore-eos --disable-tqdm --num-warmups 4 \
    --tokenizer .gpu/smollm2-dummy --save-result --result-dir "$OUT" --label gpu-serve
  kill -INT $pid; wait $pid
  tail -n 20 "$OUT/serve_stderr.log"
}
export -f serve_and_load
export OUT
stage serve 150 bash -c serve_and_load
