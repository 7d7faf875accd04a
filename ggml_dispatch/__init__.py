"""Shared core of ggml-dispatch: schema, errors, file helpers and the command line root."""

from ggml_dispatch.schema import TOOL_VERSION as __version__

__all__ = ["__version__"]
