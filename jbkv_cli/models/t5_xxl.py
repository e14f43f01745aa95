"""The XXL T5 encoder's shape, shared by the text encoders of MAGI-1 (google/t5-v1_1-xxl) and
the Wan family (google/umt5-xxl): their config.json files agree on every field here and differ
in the vocabulary and the special tokens, which each model adds."""

XXL_SHAPE = dict(
    d_model=4096,
    d_kv=64,
    d_ff=10240,
    num_layers=24,
    num_heads=64,
    relative_attention_num_buckets=32,
    relative_attention_max_distance=128,
    feed_forward_proj="gated-gelu",
    tie_word_embeddings=False,
)
