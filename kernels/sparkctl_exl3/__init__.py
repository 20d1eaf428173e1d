"""sparkctl's EXL3 kernels: the pure-torch reference decoder, the torch custom ops, and the vLLM plugin.

Modules (imported on demand, so importing the package stays cheap and torch-free):

- ``sparkctl_exl3.reference``: the reference decoder, the executable form of ``shared/exl3/SPEC.md``
  (codebook decode, trellis unpack, tile layout, Hadamard rotations, ``W`` and ``y = x . W``).
- ``sparkctl_exl3.ops``: ``torch.ops.sparkctl_exl3.*`` custom ops with fake implementations; CUDA inputs go
  to the compiled kernels when they are built, everything else to the reference.
- ``sparkctl_exl3.cuda``: the compiled CUDA extension's Python face.
- ``sparkctl_exl3.vllm_plugin``: the ``exl3`` quantization method for vLLM.
"""
