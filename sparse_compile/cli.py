"""``sparse-compile explain MODULE:FACTORY --input-shape 8,128,512``: print the FFN report of a model."""

import argparse
import importlib
import json
import sys

import torch

from sparse_compile.explain import explain
from sparse_compile.options import BackendOptions

_DTYPES = {"float32": torch.float32, "float16": torch.float16, "bfloat16": torch.bfloat16, "int64": torch.int64}


def _shape(text: str) -> tuple[int, ...]:
    try:
        shape = tuple(int(s) for s in text.split(","))
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"--input-shape {text!r}: expected comma-separated ints, e.g. 8,128,512"
        ) from None
    if not shape or any(s <= 0 for s in shape):
        raise argparse.ArgumentTypeError(f"--input-shape {text!r}: every dim must be > 0")
    return shape


def _load(target: str):
    module_name, _, attr = target.partition(":")
    if not module_name or not attr:
        raise SystemExit(f"sparse-compile: {target!r}: expected MODULE:FACTORY, e.g. bench.model:tiny")
    if "" not in sys.path and "." not in sys.path:
        sys.path.insert(0, "")  # MODULE is looked up from the current folder, as with python -m
    try:
        factory = getattr(importlib.import_module(module_name), attr)
    except (ImportError, AttributeError) as e:
        raise SystemExit(f"sparse-compile: cannot load {target!r}: {e}") from None
    return factory() if callable(factory) and not isinstance(factory, torch.nn.Module) else factory


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="sparse-compile", description=__doc__)
    sub = parser.add_subparsers(dest="command", required=True)
    ex = sub.add_parser("explain", help="report every squared-ReLU FFN site of a model and what would run sparse")
    ex.add_argument("target", help="MODULE:FACTORY, a callable returning an nn.Module (or the module itself)")
    ex.add_argument("--input-shape", type=_shape, required=True, help="shape of the one input, e.g. 8,128,512")
    ex.add_argument("--input-dtype", choices=sorted(_DTYPES), default="float32", help="dtype of the input")
    ex.add_argument("--int-high", type=int, default=2, help="int64 inputs are drawn from [0, int-high) (token ids)")
    ex.add_argument("--device", default="cpu", help="device for the model and input (default cpu)")
    ex.add_argument("--options", default="{}", help="JSON of the options given to torch.compile(backend='sparse')")
    args = parser.parse_args(argv)

    try:
        options = json.loads(args.options)
        config = BackendOptions.parse(options).config
    except (json.JSONDecodeError, ValueError) as e:
        parser.error(f"--options: {e}")
    model = _load(args.target).to(args.device)
    dtype = _DTYPES[args.input_dtype]
    if dtype == torch.int64:
        x = torch.randint(0, args.int_high, args.input_shape, device=args.device)
    else:
        model = model.to(dtype)
        x = torch.randn(args.input_shape, dtype=dtype, device=args.device)
    print(explain(model, x, config=config))
    return 0


if __name__ == "__main__":
    sys.exit(main())
