# sparkctl plan for tiny (vllm, native); serves http://127.0.0.1:8000/v1
VLLM_NO_USAGE_STATS=1 \
DO_NOT_TRACK=1 \
{python} \
  -m vllm.entrypoints.openai.api_server \
  --model /cache/sparkctl/models/tiny-llama \
  --served-model-name tiny \
  --host 127.0.0.1 \
  --port 8000 \
  --distributed-executor-backend uni \
  --dtype float32 \
  --max-model-len 512 \
  --kv-cache-memory-bytes 268435456 \
  --max-num-seqs 4 \
  --enforce-eager
