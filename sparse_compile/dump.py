"""Write what a compile did: the FX graph before and after the rewrite, and the report table.

To a folder (``options={'dump_dir': ...}`` or env SPARSE_COMPILE_DUMP_DIR) as
graph_NNN_before.py, graph_NNN_after.py, graph_NNN_report.txt; and always through
torch._logging.trace_structured, so ``tlparse`` shows them (run with TORCH_TRACE=dir).
"""

from pathlib import Path

import torch
from torch._logging import trace_structured


def graph_code(gm: torch.fx.GraphModule) -> str:
    return gm.print_readable(print_output=False, include_stride=True, include_device=True)


def dump_compile(
    graph_id: int, before: torch.fx.GraphModule, after: torch.fx.GraphModule, report: str, dump_dir: str | None
) -> None:
    texts = {"before.py": graph_code(before), "after.py": graph_code(after), "report.txt": report}
    for name, text in texts.items():
        trace_structured(
            "artifact",
            metadata_fn=lambda name=name: {"name": f"sparse_compile_{name.replace('.', '_')}", "encoding": "string"},
            payload_fn=lambda text=text: text,
        )
    if dump_dir:
        folder = Path(dump_dir)
        folder.mkdir(parents=True, exist_ok=True)
        for name, text in texts.items():
            (folder / f"graph_{graph_id:03d}_{name}").write_text(text + "\n")
