"""ggml-dispatch stage: tuner."""
