"""The named recipes of SparsityConfig (SparsityConfig.preset, options' 'preset' key) and the default."""

from sparse_compile.schema import SparsityConfig

PRESETS: dict[str, SparsityConfig] = {
    # The default: each 128-token block keeps 4 of every 16 chunks of 128 hidden units (1/4 of H),
    # chosen from the norms of the previous block's last 16 tokens; a site whose hidden size is not a
    # multiple of 2048 takes the largest chunk of 64, 32 or 16 that fits (passes/legality.fit_chunk).
    # Under autocast the op casts the float32 weights itself, forward and backward (weight_copies
    # "recompute"). Its schedule: PhaseSchedule.from_fractions' default.
    "chunked": SparsityConfig(activations="128:4:16", chunk=128, causal=True, score_rows=16, weight_copies="recompute"),
    # routed tokens: each token keeps 4 of every 16 chunks of 128 units (1/4 of H), one of 8 groups
    # chosen from its own input (kernels/routing.py)
    "routed": SparsityConfig(activations="128:4:16", chunk=128, routes=8, weight_copies="recompute"),
    # keeps 4 of every 8 chunks of 64 units (1/2 of H), chosen from all 128 rows of the previous block
    "chunked-half": SparsityConfig(activations="128:4:8", chunk=64, causal=True),
    "activation24": SparsityConfig(activations="2:4"),
    "weight24": SparsityConfig(weights="2:4"),
    "venom": SparsityConfig(weights="2:4", activations="64:2:8"),
}

DEFAULT_PRESET = "chunked"  # what backend="sparse" runs with no preset, weights or activations option
