"""Getting model weights onto the host: hub downloads, local paths, and locally generated tiny models."""
