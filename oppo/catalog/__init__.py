"""Facts about the work, read by both backends and by the simulator's cost stack.

- :mod:`~oppo.catalog.gpus`: GPU datasheets (memory bandwidth, dense peak, memory, links);
- :mod:`~oppo.catalog.shapes`: transformer shapes in the fields of a Hugging Face ``config.json``;
- :mod:`~oppo.catalog.lengths`: real response-length traces (bundled or a user's CSV).

The catalog reads files through :mod:`oppo.data` (the bundled files and their readers) and imports nothing else
of oppo.
"""
