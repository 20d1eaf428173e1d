"""Building, listing and shipping sparkctl's serving images (the `build` and `image` commands' core).

`context` says what goes into an image and hashes it into its tag, `build` drives the Docker engine and
reports progress as records, `store` lists, removes and ships what was built, and `spark` turns a recipe
and sparkctl's pins into the build of the Spark image.
"""
