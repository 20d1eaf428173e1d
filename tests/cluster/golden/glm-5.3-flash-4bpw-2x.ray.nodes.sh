# sparkctl cluster plan for glm-5.3-flash-4bpw-2x: 2 nodes, executor ray (docker), head spark-a
# env on spark-a (computed on that node):
#   NCCL_SOCKET_IFNAME=enp1s0f1np1
#   GLOO_SOCKET_IFNAME=enp1s0f1np1
#   TP_SOCKET_IFNAME=enp1s0f1np1
#   UCX_NET_DEVICES=enp1s0f1np1
#   OMPI_MCA_btl_tcp_if_include=enp1s0f1np1
#   NCCL_IB_HCA=roceP2p1s0f1,rocep1s0f1
#   NCCL_IB_GID_INDEX=3
#   VLLM_HOST_IP=192.168.100.10
#   RAY_NODE_IP_ADDRESS=192.168.100.10
#   RAY_OVERRIDE_NODE_IP_ADDRESS=192.168.100.10
# env on spark-b (computed on that node):
#   NCCL_SOCKET_IFNAME=enp1s0f0np0
#   GLOO_SOCKET_IFNAME=enp1s0f0np0
#   TP_SOCKET_IFNAME=enp1s0f0np0
#   UCX_NET_DEVICES=enp1s0f0np0
#   OMPI_MCA_btl_tcp_if_include=enp1s0f0np0
#   NCCL_IB_HCA=roceP2p1s0f0,rocep1s0f0
#   NCCL_IB_GID_INDEX=5
#   VLLM_HOST_IP=192.168.100.11
#   RAY_NODE_IP_ADDRESS=192.168.100.11
#   RAY_OVERRIDE_NODE_IP_ADDRESS=192.168.100.11

# [1] on spark-a (head): Ray head (enp1s0f1np1 192.168.100.10)
docker run \
  -d \
  --name sparkctl-ray-glm-5.3-flash-4bpw-2x \
  --init \
  --gpus all \
  --network host \
  --ipc host \
  --ulimit memlock=-1:-1 \
  --ulimit stack=67108864:67108864 \
  --device /dev/infiniband \
  -v /cache/sparkctl/packs/hub--Mia-AiLab--GLM-5.3-Flash-EXL3-TR3-4bpw/main-5dd22988da:/models/glm-5.3-flash-4bpw-2x:ro \
  -v /home/user/.cache/huggingface:/root/.cache/huggingface \
  -v /home/user/.cache/sparkctl/jit/triton:/root/.triton \
  -v /home/user/.cache/sparkctl/jit/flashinfer:/root/.cache/flashinfer \
  -v /home/user/.cache/huggingface/hub/models--Mia-AiLab--GLM-5.3-Flash-EXL3-TR3-4bpw/blobs:/home/user/.cache/huggingface/hub/models--Mia-AiLab--GLM-5.3-Flash-EXL3-TR3-4bpw/blobs:ro \
  -e RAY_memory_monitor_refresh_ms=0 \
  -e NCCL_IB_DISABLE=0 \
  -e NCCL_IGNORE_CPU_AFFINITY=1 \
  -e NCCL_NET_GDR_LEVEL=0 \
  -e PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True \
  -e VLLM_NO_USAGE_STATS=1 \
  -e DO_NOT_TRACK=1 \
  -e MASTER_ADDR=192.168.100.10 \
  -e RAY_USAGE_STATS_ENABLED=0 \
  -e VLLM_CONFIG_ROOT=/root/.config/vllm \
  -e NCCL_SOCKET_IFNAME=enp1s0f1np1 \
  -e GLOO_SOCKET_IFNAME=enp1s0f1np1 \
  -e TP_SOCKET_IFNAME=enp1s0f1np1 \
  -e UCX_NET_DEVICES=enp1s0f1np1 \
  -e OMPI_MCA_btl_tcp_if_include=enp1s0f1np1 \
  -e NCCL_IB_HCA=roceP2p1s0f1,rocep1s0f1 \
  -e NCCL_IB_GID_INDEX=3 \
  -e VLLM_HOST_IP=192.168.100.10 \
  -e RAY_NODE_IP_ADDRESS=192.168.100.10 \
  -e RAY_OVERRIDE_NODE_IP_ADDRESS=192.168.100.10 \
  -e SPARKCTL_PORT=8000 \
  --label io.sparkctl.recipe=glm-5.3-flash-4bpw-2x \
  --label io.sparkctl.recipe-hash=0ffc655e8f4eaea072c3d5fad8ab7a16a004386b5c2ff7411e4cc5b7a00c56e3 \
  --label io.sparkctl.managed=true \
  --label io.sparkctl.port=8000 \
  --label io.sparkctl.served-model-name=glm-5.3-flash-4bpw-2x \
  --label io.sparkctl.cluster-role=head \
  --health-cmd 'python3 -c "import sys, urllib.request; urllib.request.urlopen(sys.argv[1], timeout=5)" http://127.0.0.1:8000/health' \
  --health-interval 30s \
  --health-timeout 10s \
  --health-retries 3 \
  --health-start-period 2400s \
  --entrypoint ray sparkctl/vllm-exl3:0.33.0-sm121 start \
  --head \
  --port=6379 \
  --block \
  --node-ip-address=192.168.100.10 \
  --num-gpus=1 \
  --disable-usage-stats

# [2] on spark-b (worker): Ray worker (enp1s0f0np0 192.168.100.11)
docker run \
  -d \
  --name sparkctl-ray-glm-5.3-flash-4bpw-2x \
  --init \
  --gpus all \
  --network host \
  --ipc host \
  --ulimit memlock=-1:-1 \
  --ulimit stack=67108864:67108864 \
  --device /dev/infiniband \
  -v /cache/sparkctl/packs/hub--Mia-AiLab--GLM-5.3-Flash-EXL3-TR3-4bpw/main-5dd22988da:/models/glm-5.3-flash-4bpw-2x:ro \
  -v /home/user/.cache/huggingface:/root/.cache/huggingface \
  -v /home/user/.cache/sparkctl/jit/triton:/root/.triton \
  -v /home/user/.cache/sparkctl/jit/flashinfer:/root/.cache/flashinfer \
  -v /home/user/.cache/huggingface/hub/models--Mia-AiLab--GLM-5.3-Flash-EXL3-TR3-4bpw/blobs:/home/user/.cache/huggingface/hub/models--Mia-AiLab--GLM-5.3-Flash-EXL3-TR3-4bpw/blobs:ro \
  -e RAY_memory_monitor_refresh_ms=0 \
  -e NCCL_IB_DISABLE=0 \
  -e NCCL_IGNORE_CPU_AFFINITY=1 \
  -e NCCL_NET_GDR_LEVEL=0 \
  -e PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True \
  -e VLLM_NO_USAGE_STATS=1 \
  -e DO_NOT_TRACK=1 \
  -e MASTER_ADDR=192.168.100.10 \
  -e RAY_USAGE_STATS_ENABLED=0 \
  -e VLLM_CONFIG_ROOT=/root/.config/vllm \
  -e NCCL_SOCKET_IFNAME=enp1s0f0np0 \
  -e GLOO_SOCKET_IFNAME=enp1s0f0np0 \
  -e TP_SOCKET_IFNAME=enp1s0f0np0 \
  -e UCX_NET_DEVICES=enp1s0f0np0 \
  -e OMPI_MCA_btl_tcp_if_include=enp1s0f0np0 \
  -e NCCL_IB_HCA=roceP2p1s0f0,rocep1s0f0 \
  -e NCCL_IB_GID_INDEX=5 \
  -e VLLM_HOST_IP=192.168.100.11 \
  -e RAY_NODE_IP_ADDRESS=192.168.100.11 \
  -e RAY_OVERRIDE_NODE_IP_ADDRESS=192.168.100.11 \
  -e SPARKCTL_PORT=8000 \
  --label io.sparkctl.recipe=glm-5.3-flash-4bpw-2x \
  --label io.sparkctl.recipe-hash=0ffc655e8f4eaea072c3d5fad8ab7a16a004386b5c2ff7411e4cc5b7a00c56e3 \
  --label io.sparkctl.managed=true \
  --label io.sparkctl.port=8000 \
  --label io.sparkctl.served-model-name=glm-5.3-flash-4bpw-2x \
  --label io.sparkctl.cluster-role=worker \
  --no-healthcheck \
  --entrypoint ray sparkctl/vllm-exl3:0.33.0-sm121 start \
  --address=192.168.100.10:6379 \
  --block \
  --node-ip-address=192.168.100.11 \
  --num-gpus=1 \
  --disable-usage-stats

# [3] on spark-a (head): wait until Ray lists 2 nodes
# repeat until it lists 2 active nodes
docker exec sparkctl-ray-glm-5.3-flash-4bpw-2x ray status

# [4] on spark-a (head): keep the per-node variables per node (vLLM's Ray env carry-over)
docker exec sparkctl-ray-glm-5.3-flash-4bpw-2x sh \
  -c 'mkdir -p /root/.config/vllm && printf '"'"'%s'"'"' '"'"'["NCCL_SOCKET_IFNAME","GLOO_SOCKET_IFNAME","TP_SOCKET_IFNAME","UCX_NET_DEVICES","OMPI_MCA_btl_tcp_if_include","NCCL_IB_HCA","NCCL_IB_GID_INDEX","VLLM_HOST_IP","RAY_NODE_IP_ADDRESS","RAY_OVERRIDE_NODE_IP_ADDRESS"]'"'"' > /root/.config/vllm/ray_non_carry_over_env_vars.json'

# [5] on spark-a (head): the server, TP 2 over Ray
docker exec sparkctl-ray-glm-5.3-flash-4bpw-2x vllm serve /models/glm-5.3-flash-4bpw-2x \
  --served-model-name glm-5.3-flash-4bpw-2x \
  --host 127.0.0.1 \
  --port 8000 \
  --tensor-parallel-size 2 \
  --distributed-executor-backend ray \
  --quantization exl3 \
  --max-model-len 262144 \
  --gpu-memory-utilization 0.83 \
  --max-num-seqs 4 \
  --max-num-batched-tokens 7168 \
  --long-prefill-token-threshold 3584 \
  --enable-prefix-caching \
  --kv-cache-dtype fp8 \
  --speculative-config '{"method":"mtp","num_speculative_tokens":2}' \
  --cudagraph-capture-sizes 1 2 3 4 6 8 9 12 \
  --tool-call-parser glm47 \
  --enable-auto-tool-choice \
  --reasoning-parser glm45 \
  --chat-template /models/glm-5.3-flash-4bpw-2x/chat_template.jinja
