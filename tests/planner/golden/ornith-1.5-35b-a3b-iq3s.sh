# sparkctl plan for ornith-1.5-35b-a3b-iq3s (llama.cpp, native); serves http://127.0.0.1:8000/v1
llama-server \
  --hf-repo vcruz305/Ornith-1.5-35B-A3B-GGUF:IQ3_S \
  --alias ornith-1.5-35b-a3b-iq3s \
  --host 127.0.0.1 \
  --port 8000 \
  --ctx-size 32768 \
  --parallel 1 \
  --n-gpu-layers 99 \
  --flash-attn on \
  --jinja
