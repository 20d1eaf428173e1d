"""Click options more than one command takes, declared once so their names, help and types agree."""

from __future__ import annotations

import click

from sparkctl.runtimes.registry import RUNTIMES

set_option = click.option(
    "--set",
    "sets",
    multiple=True,
    metavar="KEY.PATH=VALUE",
    help="Override a recipe field (value parsed as YAML), e.g. --set serve.max_model_len=32768. Repeatable.",
)
json_option = click.option("--json", "as_json", is_flag=True, help="Print JSON for scripts.")
model_path_option = click.option(
    "--model-path",
    type=click.Path(exists=True, file_okay=True, dir_okay=True),
    default=None,
    help="A local model directory to plan with (mounted into the container for docker recipes).",
)
port_option = click.option(
    "--port", type=click.IntRange(0, 65535), help="Serve on this port (serve.port); 0 picks a free one."
)
runtime_option = click.option("--runtime", type=click.Choice(RUNTIMES), help="Override the recipe's runtime.")
output_option = click.option(
    "-o", "--output", "output_path", type=click.Path(dir_okay=False), default=None, help="Write to a file."
)
