"""The replica routing policy (gateway/backends/local/prefix_router.py) on plain values."""

from __future__ import annotations

from mlxd.gateway.backends.local.prefix_router import (
    CHUNK_CHARS,
    CHUNK_TOKENS,
    Balance,
    PrefixRouter,
    RoundRobin,
    prefix_keys,
)
from mlxd.protocol.messages import ChatPrompt, TextPrompt, TokenPrompt

READY2 = [0, 0]
EPOCHS2 = [1.0, 1.0]


def chat(*contents: str) -> ChatPrompt:
    roles = ("user", "assistant")
    return ChatPrompt(
        messages=[{"role": roles[i % 2], "content": c} for i, c in enumerate(contents)]
    )


def test_keys_are_whole_chunks_chained_so_shared_leads_share_keys() -> None:
    a = prefix_keys(TextPrompt(text="x" * (3 * CHUNK_CHARS + 5)))
    b = prefix_keys(TextPrompt(text="x" * (2 * CHUNK_CHARS) + "y" * CHUNK_CHARS))
    assert len(a) == 3 and len(b) == 3
    assert a[:2] == b[:2] and a[2] != b[2]
    assert len(set(a)) == 3  # chained: the same chunk text at another depth is another key


def test_token_prompts_hash_token_blocks() -> None:
    ids = list(range(CHUNK_TOKENS * 2 + 3))
    keys = prefix_keys(TokenPrompt(token_ids=ids))
    assert len(keys) == 2
    assert prefix_keys(TokenPrompt(token_ids=ids[:CHUNK_TOKENS])) == keys[:1]


def test_a_chats_next_turn_extends_its_keys() -> None:
    turn1 = chat("hello " * 40)
    turn2 = chat("hello " * 40, "an answer " * 10, "and a question " * 10)
    k1, k2 = prefix_keys(turn1), prefix_keys(turn2)
    assert len(k2) > len(k1) > 1
    assert k2[: len(k1)] == k1


def test_a_known_prefix_goes_back_to_its_replica() -> None:
    router = PrefixRouter(2)
    conversations = [prefix_keys(chat(f"conversation {i} " * 30)) for i in range(6)]
    first = [router.choose(k, READY2, EPOCHS2) for k in conversations]
    assert set(first) == {0, 1}  # new prompts spread in turn
    again = [router.choose(k, READY2, EPOCHS2) for k in conversations]
    assert again == first


def test_a_much_busier_owner_loses_the_prompt() -> None:
    router = PrefixRouter(2, Balance(abs_slack=4, rel_slack=2.0))
    keys = prefix_keys(chat("a long shared system prompt " * 20))
    owner = router.choose(keys, READY2, EPOCHS2)
    busy = [0, 0]
    busy[owner] = 4  # not much busier: 4 - 0 is within abs_slack
    assert router.choose(keys, busy, EPOCHS2) == owner
    busy[owner] = 9
    other = 1 - owner
    assert router.choose(keys, busy, EPOCHS2) == other
    assert router.matched(keys, other, 1.0) == len(keys)  # the prefix moved with it


def test_a_replica_not_ready_gets_nothing_and_a_restart_forgets_its_prefixes() -> None:
    router = PrefixRouter(2)
    keys = prefix_keys(TextPrompt(text="q" * 500))
    owner = router.choose(keys, READY2, EPOCHS2)
    down = [0, 0]
    down[owner] = None  # type: ignore[call-overload]
    assert router.choose(keys, down, EPOCHS2) == 1 - owner
    router.record(keys, owner, 1.0)
    restarted = list(EPOCHS2)
    restarted[owner] = 2.0  # a fresh process: its cache is empty
    assert router.owner(keys, READY2, restarted) is None


def test_round_robin_skips_replicas_not_ready() -> None:
    rr = RoundRobin(3)
    assert [rr.choose([], [0, None, 0], [0.0] * 3) for _ in range(4)] == [0, 2, 0, 2]


def test_no_ready_replica_is_an_error() -> None:
    try:
        PrefixRouter(2).choose([], [None, None], EPOCHS2)
    except ValueError:
        return
    raise AssertionError("expected ValueError")
