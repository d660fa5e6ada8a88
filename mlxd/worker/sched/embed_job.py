"""Per-request state of an embeddings request in the worker. State only: the scheduler decides
which inputs run in which step, the embedder fills in their vectors."""

from __future__ import annotations

from dataclasses import dataclass, field

from mlxd.protocol.messages import Embeddings, Usage
from mlxd.worker.sched.sequence import PRIORITY_LEVELS


@dataclass(eq=False)
class EmbedJob:
    """The inputs of one ``Embed`` message, embedded a step's token budget at a time.

    Inputs run shortest first (``order``), so the inputs that share a step's padded batch have
    similar lengths and pad little; ``vectors`` stays in input order. ``client`` is the ZMQ
    identity of the gateway connection the answer goes back to.
    """

    request_id: str
    client: bytes
    input_ids: list[list[int]]
    priority: int = PRIORITY_LEVELS["normal"]  # ``Embed`` carries none: queued as normal work
    arrival: float = 0.0
    num_scheduled: int = 0  # inputs of ``order`` handed to a step so far
    offset: int = 0  # tokens of input ``order[num_scheduled]`` handed to steps (a long one's)
    order: list[int] = field(init=False)
    vectors: list[bytes] = field(init=False)

    def __post_init__(self) -> None:
        self.order = sorted(range(len(self.input_ids)), key=lambda i: len(self.input_ids[i]))
        self.vectors = [b""] * len(self.input_ids)

    @property
    def num_inputs(self) -> int:
        return len(self.input_ids)

    def length(self, k: int) -> int:
        """Tokens of the ``k``-th shortest input."""
        return len(self.input_ids[self.order[k]])

    def reply(self) -> Embeddings:
        """The answer once every input has its vector (little-endian float32 bytes)."""
        usage = Usage(prompt_tokens=sum(map(len, self.input_ids)), completion_tokens=0)
        dims = len(self.vectors[0]) // 4 if self.vectors else 0
        return Embeddings(
            request_id=self.request_id, dimensions=dims, embeddings=self.vectors, usage=usage
        )
