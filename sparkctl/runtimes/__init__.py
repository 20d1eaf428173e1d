"""Runtimes turn a Plan into a running server: `native` (a supervised process) and `docker`."""
