"""`python -m prewarm`."""

from prewarm.cli import main

main(prog_name="python -m prewarm")
