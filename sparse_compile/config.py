"""The sparsity configuration's public names, from the three modules that hold them by job:

schema.py   SparsityConfig (what the sparse phase computes) and its validation; pattern parsing
presets.py  PRESETS, the named recipes, and DEFAULT_PRESET
options.py  BackendOptions: torch.compile(options=...) and command-line text parsed into a config
"""

from sparse_compile.options import DUMP_DIR_ENV, BackendOptions, options_from_text
from sparse_compile.presets import DEFAULT_PRESET, PRESETS
from sparse_compile.schema import (
    KERNEL_CHOICES,
    SMALL_FFN_CHOICES,
    WEIGHT_GRAD_RULE,
    WEIGHT_PATTERNS,
    SparsityConfig,
    parse_activation_pattern,
    parse_weight_grad,
)

__all__ = [
    "DEFAULT_PRESET",
    "DUMP_DIR_ENV",
    "KERNEL_CHOICES",
    "PRESETS",
    "SMALL_FFN_CHOICES",
    "WEIGHT_GRAD_RULE",
    "WEIGHT_PATTERNS",
    "BackendOptions",
    "SparsityConfig",
    "options_from_text",
    "parse_activation_pattern",
    "parse_weight_grad",
]
