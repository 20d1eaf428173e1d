# sparkctl plan for qwen3.8-flash-next (vllm, docker); serves http://127.0.0.1:8000/v1
docker run --rm \
  --name sparkctl-qwen3.8-flash-next \
  --gpus all \
  --network host \
  --ipc host \
  --shm-size 16g \
  --ulimit memlock=-1:-1 \
  --ulimit stack=67108864:67108864 \
  -v /cache/sparkctl/packs/hub--turboderp--Qwen3.8-Flash-Next-exl3/3.05bpw_h5_ng5-40603d66be:/models/qwen3.8-flash-next:ro \
  -v /home/user/.cache/huggingface:/root/.cache/huggingface \
  -v /home/user/.cache/sparkctl/jit/triton:/root/.triton \
  -v /home/user/.cache/sparkctl/jit/flashinfer:/root/.cache/flashinfer \
  -v /home/user/.cache/huggingface/hub/models--turboderp--Qwen3.8-Flash-Next-exl3/blobs:/home/user/.cache/huggingface/hub/models--turboderp--Qwen3.8-Flash-Next-exl3/blobs:ro \
  -e PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True \
  -e VLLM_NO_USAGE_STATS=1 \
  -e DO_NOT_TRACK=1 \
  --label io.sparkctl.recipe=qwen3.8-flash-next \
  --label io.sparkctl.recipe-hash=4252e44eddcd76103b24f0788a60a80fe617e5eebe02a665443223dadad8414a \
  --entrypoint vllm \
  sparkctl/vllm-exl3:0.33.0-sm121 \
  serve /models/qwen3.8-flash-next \
  --served-model-name qwen3.8-flash-next \
  --host 127.0.0.1 \
  --port 8000 \
  --quantization exl3 \
  --trust-remote-code \
  --max-model-len 262144 \
  --gpu-memory-utilization 0.8 \
  --max-num-seqs 4 \
  --enable-prefix-caching \
  --speculative-config '{"method":"mtp","num_speculative_tokens":3}' \
  --cudagraph-capture-sizes 1 2 4 8 12 16 \
  --tool-call-parser qwen3_xml \
  --enable-auto-tool-choice \
  --reasoning-parser qwen3 \
  --mamba-ssm-cache-dtype bfloat16
