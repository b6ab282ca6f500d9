"""Parsing ``torch.compile(backend="sparse", options=...)`` and command-line sparsity into BackendOptions."""

import dataclasses
import json
import os
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from sparse_compile.presets import DEFAULT_PRESET, PRESETS
from sparse_compile.schema import SparsityConfig, parse_activation_pattern, score_rows_apply

_CONFIG_KEYS = {f.name for f in dataclasses.fields(SparsityConfig)}
_BACKEND_KEYS = {"preset", "dump_dir", "mode", "inductor"}
DUMP_DIR_ENV = "SPARSE_COMPILE_DUMP_DIR"


@dataclass(frozen=True)
class BackendOptions:
    """Everything ``torch.compile(backend='sparse', options=...)`` may say."""

    config: SparsityConfig
    dump_dir: str | None = None
    mode: str | None = None
    inductor: dict[str, Any] = field(default_factory=dict)

    @classmethod
    def parse(cls, options: Mapping[str, Any] | None, mode: str | None = None) -> "BackendOptions":
        """Parse compile options. With no 'preset', 'weights' or 'activations' key, the default preset
        (DEFAULT_PRESET), with the other keys applied on top. A preset's score_rows and weight_copies
        hold for its own pattern: where the keys on top leave a pattern it cannot score (causal False,
        chunk 1, or blocks of fewer tokens), the blocks are scored on all their rows (score_rows
        None), and with 2:4 weights the weight copies are kept ("keep"), as SparsityConfig's defaults
        do, unless the keys name them.

        Errors lead with "sparse_compile: ": torch.compile hands the options to the backend only at the
        first call, and its error (BackendCompilerFailed) quotes ours. Not a mapping: TypeError; a bad
        key or value: ValueError naming it."""
        if options is not None and not isinstance(options, Mapping):
            hint = f" (to name a preset: options={{'preset': {options!r}}})" if isinstance(options, str) else ""
            raise TypeError(
                f"sparse_compile: options={options!r} is a {type(options).__name__}, not a mapping; expected a dict "
                f"such as {{'preset': {DEFAULT_PRESET!r}}} or {{'activations': '128:4:16'}}{hint}; presets: "
                f"{sorted(PRESETS)}"
            )
        options = dict(options or {})
        unknown = sorted(set(options) - _CONFIG_KEYS - _BACKEND_KEYS, key=repr)
        if unknown:
            raise ValueError(
                f"sparse_compile: unknown option(s) {unknown}; allowed: {sorted(_CONFIG_KEYS | _BACKEND_KEYS)}"
            )
        fields = {k: options[k] for k in _CONFIG_KEYS if k in options}
        try:
            if "preset" not in options and ("weights" in fields or "activations" in fields):
                config = SparsityConfig(**fields)
            else:
                preset = SparsityConfig.preset(options.get("preset", DEFAULT_PRESET))
                config = dataclasses.replace(preset, **{**_not_applying(preset, fields), **fields})
        except ValueError as e:
            raise ValueError(f"sparse_compile: bad options for backend='sparse': {e}") from None
        inductor = options.get("inductor", {})
        if not isinstance(inductor, Mapping):
            raise ValueError(f"sparse_compile: options['inductor']={inductor!r}: expected a dict of Inductor config")
        if "mode" in options and mode is not None:
            raise ValueError("sparse_compile: give mode either to torch.compile or in options, not both")
        return cls(
            config=config,
            dump_dir=options.get("dump_dir") or os.environ.get(DUMP_DIR_ENV) or None,
            mode=options.get("mode", mode),
            inductor=dict(inductor),
        )


def _not_applying(preset: SparsityConfig, fields: Mapping[str, Any]) -> dict[str, Any]:
    """The field defaults that replace ``preset``'s where ``fields`` on top leave a configuration its
    value cannot apply to: score_rows None without causal chunks of blocks of at least score_rows
    tokens; weight_copies "keep" with 2:4 weights (masked copies). A bad value in ``fields`` is left
    to SparsityConfig's error; keys that ``fields`` names win over these."""
    out: dict[str, Any] = {}
    if preset.score_rows is not None:
        causal, chunk = fields.get("causal", preset.causal), fields.get("chunk", preset.chunk)
        try:
            v = parse_activation_pattern(fields.get("activations", preset.activations))[0]
        except (TypeError, ValueError):  # a bad pattern: SparsityConfig names it
            v = preset.score_rows
        if not score_rows_apply(preset.score_rows, v if v > 1 else None, causal, chunk):
            out["score_rows"] = None
    if fields.get("routes", preset.routes) is not None:  # routing replaces the causal block choice
        out.update(causal=False, score_rows=None, permute=False)
    if preset.weight_copies != "keep" and fields.get("weights", preset.weights) is not None:
        out["weight_copies"] = "keep"
    return out


def options_from_text(text: str) -> dict[str, Any]:
    """Command-line sparsity: a preset name ('chunked') or JSON options ('{"activations": "2:4"}').

    Raises ValueError (bad JSON included) naming the text; the options are not validated here.
    """
    if not text.lstrip().startswith("{"):
        return {"preset": text}
    try:
        return json.loads(text)
    except json.JSONDecodeError as e:
        raise ValueError(f"{text!r} is not valid JSON: {e}") from None
