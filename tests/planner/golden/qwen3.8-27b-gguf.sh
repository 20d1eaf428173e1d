# sparkctl plan for qwen3.8-27b-gguf (llama.cpp, native); serves http://127.0.0.1:8000/v1
llama-server \
  --hf-repo vcruz305/Qwen3.8-27B-GGUF:Q4_K_M \
  --alias qwen3.8-27b-gguf \
  --host 127.0.0.1 \
  --port 8000 \
  --ctx-size 32768 \
  --parallel 1 \
  --n-gpu-layers 99 \
  --flash-attn on \
  --jinja
