"""ggml-dispatch stage: codegen."""
