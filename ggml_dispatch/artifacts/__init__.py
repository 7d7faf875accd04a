"""Every pipeline file's reader (and the simple writers) with one set of validators.

``census`` (census Parquet), ``tuning`` (tuning Parquet), ``table`` (table.json and the rendered
header), ``validators`` (schema key, columns and types, allowed values, provenance, mixing rules).
A command that reads such a file calls the reader here, so every command accepts or refuses a file
alike, with the same ``path: field: message``.
"""
