# sparkctl plan for tiny-gguf-moe (llama.cpp, native); serves http://127.0.0.1:8000/v1
llama-server \
  --model /cache/sparkctl/models/tiny-gguf-qwen3moe/tiny-qwen3moe-F16.gguf \
  --alias tiny-gguf-moe \
  --host 127.0.0.1 \
  --port 8000 \
  --ctx-size 1024 \
  --parallel 2 \
  --kv-unified \
  --kv-unified-per-slot 512 \
  --n-gpu-layers 0 \
  --n-cpu-moe 1 \
  --override-tensor 'blk\.1\.ffn_(up|gate|down)_exps\.weight=CPU' \
  --flash-attn on \
  --threads 2 \
  --metrics \
  --jinja
