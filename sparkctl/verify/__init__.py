"""`sparkctl verify`: prove on the serving machine that a pack is served exactly.

Three layers, each a list of `records.Check` rows the CLI only renders:

- `pack`: the files themselves (shapes, K, codebook markers, storage vs the config the plugin reads, the
  n-gram table's layout, index vs files, hub checksums where the cache has them);
- `kernels`: a sample of modules of every kind through the plugin's forward path against the reference decoder
  in fp64 (the CUDA kernels where a GPU is present, else the CPU path, said so);
- `engine`: prompt log-probs from a running server against the plugin's own forward functions on the same weights.

`run.verify` runs them and returns one `records.VerifyRecord`; `records.save` keeps it beside the bench records.
"""
