"""What a model gets to be served, in one place: its plain quantized layers take a batch as rows
of one matrix (``quantized``), its output head projects each row's last position only
(``output_head``), its recurrent layers' short convolutions run as shifted multiply-adds
(``short_conv``), and its experts' gate and up projections run as one (``fused_experts``). Each
change is in place and undoable: benchmarks run mlx-lm on the model as it made it, then serve
it again. ``for_this_process`` does the same for what is patched per process, not per model:
gated delta prefill in chunks (``delta_chunks``) and attention padded to planned shapes
(``kv.attention_shapes``).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import mlx.nn as nn

from mlxd.worker.kv import attention_shapes
from mlxd.worker.runners import delta_chunks, fused_experts, quantized, short_conv
from mlxd.worker.runners.output_head import last_position_only


@dataclass(slots=True)
class Served:
    """The layers ``for_serving`` changed, and how to undo it."""

    quantized: list[nn.Module]
    convs: list[nn.Module]
    experts: list[fused_experts.Fused]
    whole_head: Callable[[], None]

    def undo(self) -> None:
        self.whole_head()
        quantized.restore(self.quantized)
        short_conv.restore(self.convs)
        fused_experts.restore(self.experts)


def for_serving(model: nn.Module, head: Any = None) -> Served:
    """``model`` made ready to serve; ``head`` is the module whose output head is projected
    (a VLM's language model; by default ``model``)."""
    return Served(
        quantized=quantized.batch_as_rows(model),
        convs=short_conv.as_taps(model),
        experts=fused_experts.fuse(model),
        whole_head=last_position_only(model if head is None else head),
    )


@dataclass(slots=True)
class Patched:
    """What ``for_this_process`` patched, and how to undo it."""

    delta_modules: int  # gated delta layers' modules whose prefill runs in chunks
    padded_attention: bool  # multi-query attention padded to planned shapes

    def undo(self) -> None:
        delta_chunks.uninstall()
        if self.padded_attention:
            attention_shapes.uninstall()


def for_this_process(model: nn.Module) -> Patched:
    """This process's functions patched to serve ``model`` (each where its backend needs it:
    chunks where Metal is absent, padding where attention plans are built per shape)."""
    return Patched(delta_chunks.install(model), attention_shapes.install())
