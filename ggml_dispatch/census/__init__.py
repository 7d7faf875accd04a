"""ggml-dispatch stage: census."""
