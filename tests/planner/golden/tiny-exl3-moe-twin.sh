# sparkctl plan for tiny-exl3-moe-twin (vllm, native); serves http://127.0.0.1:8013/v1
VLLM_NO_USAGE_STATS=1 \
DO_NOT_TRACK=1 \
{python} \
  -m vllm.entrypoints.openai.api_server \
  --model /cache/sparkctl/models/tiny-exl3-moe-twin \
  --served-model-name tiny-exl3-moe-twin \
  --host 127.0.0.1 \
  --port 8013 \
  --distributed-executor-backend uni \
  --dtype float32 \
  --max-model-len 512 \
  --kv-cache-memory-bytes 268435456 \
  --max-num-seqs 4 \
  --enforce-eager
