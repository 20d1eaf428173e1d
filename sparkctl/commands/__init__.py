"""One module per group of CLI commands; imported lazily by sparkctl.cli."""
