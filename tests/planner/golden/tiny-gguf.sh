# sparkctl plan for tiny-gguf (llama.cpp, native); serves http://127.0.0.1:8000/v1
llama-server \
  --model /cache/sparkctl/models/tiny-gguf-llama/tiny-llama-F16.gguf \
  --alias tiny-gguf \
  --host 127.0.0.1 \
  --port 8000 \
  --ctx-size 1024 \
  --parallel 2 \
  --n-gpu-layers 0 \
  --flash-attn on \
  --threads 2 \
  --load-mode mmap \
  --metrics \
  --jinja
