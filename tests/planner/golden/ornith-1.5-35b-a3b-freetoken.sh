# sparkctl plan for ornith-1.5-35b-a3b-freetoken (freetoken, native); serves http://127.0.0.1:8000/v1
ft serve \
  --model-path vcruz305/Ornith-1.5-35B-A3B-GGUF \
  --served-model-name ornith-1.5-35b-a3b-freetoken \
  --host 127.0.0.1 \
  --port 8000 \
  --max-seq-len-override 32768 \
  --max-running-requests 1 \
  --dtype bfloat16 \
  --moe-strategy auto
