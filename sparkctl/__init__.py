"""sparkctl: serve large quantized language models on a DGX Spark with one command."""

__version__ = "0.1.0"
