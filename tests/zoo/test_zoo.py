"""Every zoo arch through one real daemon: greedy output equals mlx-lm's, and batching, joining
a stream, the prefix cache and preemption never change it. Tests run arch by arch (the ``arch``
fixture is module-scoped), so each model loads once and least recently used ones unload."""

from __future__ import annotations

import threading
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import openai
import pytest

from tests.zoo.conftest import Zoo, corpus_ids, greedy, selected_archs

pytestmark = [pytest.mark.zoo]

NUM_TOKENS = 16
LONG_TOKENS = 32
# 150 + 56 tokens = 13 blocks each: any two running outgrow the 24-block pool (three had to, and
# over HTTP a fast model's four requests did not always overlap that much)
PREEMPT_PROMPT, PREEMPT_TOKENS = 150, 56
# A window model's rows shrink once prefilled (their slabs behind the window go back): its rows
# outgrow the pool by decoding, so they decode more (120 + 86 tokens: two admitted, both grow).
WINDOW_PROMPT, WINDOW_TOKENS = 120, 86


# What mlxd does not yet serve as mlx-lm does, per (arch, test): each is an expected failure
# (strict: once fixed, the entry must go). The notes say what was found.
_SPLITS = (
    "compressed-group cache: the output depends on where prefill splits the prompt; "
    "it depends on timing (where each request's prefill falls among the others' steps)"
)
KNOWN = {
    # Its sparse attention picks key blocks cut over cache slots ("place queries by slot, not
    # content", mlx-lm): a left-padded row of a batch picks other blocks than it would alone,
    # in mlx-lm's batch generator too. Whether the requests meet in one batch depends on timing.
    (
        "minimax_m3_vl",
        "test_four_concurrent_equal_each_alone",
    ): "block-sparse attention over padded slots; it depends on timing",
    (
        "minimax_m3_vl",
        "test_preempted_requests_resume_to_the_same_text",
    ): "as batched; it depends on timing",
    # Prefilled together, each prompt's last token runs in a decode step of four rows, where
    # alone it runs in a forward of one: products of another shape round differently, and a
    # near-tie of this random model flips twelve tokens on (the caches after the prompts are
    # equal to the bit). Rounding: it depends on the machine.
    (
        "plamo3",
        "test_preempted_requests_resume_to_the_same_text",
    ): "rounding of a four-row step against a one-row forward; it depends on the machine",
    # It decodes one sequence at a time: whether these differ depends on timing (where each
    # request's prefill falls among the others' steps). Alone it mostly passes now that
    # prefill feeds the last prompt token apart as mlx-lm does, but not in every run.
    ("deepseek_v41", "test_greedy_equals_mlx_lm"): _SPLITS,
    ("deepseek_v41", "test_four_concurrent_equal_each_alone"): _SPLITS,
    ("deepseek_v41", "test_a_request_joining_a_stream_equals_alone"): _SPLITS,
    ("deepseek_v41", "test_a_repeated_long_prompt_hits_the_prefix_cache"): _SPLITS,
}


@pytest.fixture(scope="module", params=selected_archs())
def arch(request: pytest.FixtureRequest) -> str:
    return str(request.param)


@pytest.fixture(autouse=True)
def _known_failures(request: pytest.FixtureRequest) -> None:
    arch = request.node.callspec.params.get("arch") if hasattr(request.node, "callspec") else None
    why = KNOWN.get((str(arch), request.node.originalname))
    if why:  # strict, but where the failure depends on timing or on the machine
        strict = "depends on timing" not in why and "depends on the machine" not in why
        request.applymarker(pytest.mark.xfail(reason=why, strict=strict))


@pytest.fixture(scope="module")
def client(zoo: Zoo) -> Any:
    with openai.OpenAI(base_url=zoo.url("/v1"), api_key="x", max_retries=0, timeout=180) as c:
        yield c


def prompt(zoo: Zoo, arch: str, i: int, length: int = 40) -> list[int]:
    """The i-th slice of stdlib text the tokenizer was trained on: varied, realistic ids."""
    return corpus_ids(str(zoo.dirs[arch]))[i * 150 : i * 150 + length]


def complete(
    client: Any, arch: str, ids: list[int], num_tokens: int = NUM_TOKENS, ignore_eos: bool = True
) -> Any:
    return client.completions.create(
        model=arch,
        prompt=ids,
        max_tokens=num_tokens,
        temperature=0,
        extra_body={"ignore_eos": ignore_eos},
    )


def text(client: Any, arch: str, ids: list[int], num_tokens: int = NUM_TOKENS) -> str:
    return str(complete(client, arch, ids, num_tokens).choices[0].text)


def admin(zoo: Zoo, arch: str, what: str) -> dict[str, Any]:
    r = zoo.daemon.admin_get(f"/admin/models/{arch}/{what}", timeout=60)
    assert r.status_code == 200, r.text
    return r.json()  # type: ignore[no-any-return]


def test_greedy_equals_mlx_lm(zoo: Zoo, client: Any, arch: str) -> None:
    ids = prompt(zoo, arch, 0)
    served = complete(client, arch, ids, ignore_eos=False).choices[0].text  # mlx-lm stops at EOS
    zoo.describe(arch, admin(zoo, arch, "status").get("kv_cache", "?"))
    assert served == greedy(zoo.dirs[arch], ids, NUM_TOKENS)


def test_four_concurrent_equal_each_alone(zoo: Zoo, client: Any, arch: str) -> None:
    prompts = [prompt(zoo, arch, i, 30 + 7 * i) for i in range(1, 5)]
    alone = [text(client, arch, p) for p in prompts]
    with ThreadPoolExecutor(len(prompts)) as pool:
        together = list(pool.map(lambda p: text(client, arch, p), prompts))
    assert together == alone


def test_a_request_joining_a_stream_equals_alone(zoo: Zoo, client: Any, arch: str) -> None:
    first, second = prompt(zoo, arch, 5), prompt(zoo, arch, 6, 33)
    alone = text(client, arch, first, LONG_TOKENS), text(client, arch, second)
    streamed: list[str] = []
    failed: list[BaseException] = []
    started = threading.Event()

    def stream() -> None:
        try:
            for chunk in client.completions.create(
                model=arch,
                prompt=first,
                stream=True,
                max_tokens=LONG_TOKENS,
                temperature=0,
                extra_body={"ignore_eos": True},
            ):
                streamed.append(chunk.choices[0].text if chunk.choices else "")
                started.set()
        except openai.APIError as exc:  # raised again below, in the test's own thread
            failed.append(exc)
        started.set()

    thread = threading.Thread(target=stream)
    thread.start()
    assert started.wait(180)
    joined = text(client, arch, second)
    thread.join(180)
    if failed:
        raise failed[0]
    assert ("".join(streamed), joined) == alone


def test_a_repeated_long_prompt_hits_the_prefix_cache(zoo: Zoo, client: Any, arch: str) -> None:
    ids = prompt(zoo, arch, 7, 120)  # several KV blocks
    cold = complete(client, arch, ids)
    warm = complete(client, arch, ids)
    cached = (
        warm.usage.prompt_tokens_details.cached_tokens if warm.usage.prompt_tokens_details else 0
    )
    zoo.record_fact(arch, "prefix_cached_tokens", cached or 0)
    assert warm.choices[0].text == cold.choices[0].text
    assert (cached or 0) > 0


def test_preempted_requests_resume_to_the_same_text(zoo: Zoo, client: Any, arch: str) -> None:
    # four long requests over a pool of POOL_BLOCKS blocks: decode runs out of blocks
    if "one sequence at a time" in admin(zoo, arch, "status").get("kv_cache", ""):
        zoo.record_fact(arch, "preemptions", "n/a")
        pytest.skip("decodes one sequence at a time: nothing to preempt")
    windowed = "see a" in admin(zoo, arch, "status").get("kv_cache", "")
    size, tokens = (WINDOW_PROMPT, WINDOW_TOKENS) if windowed else (PREEMPT_PROMPT, PREEMPT_TOKENS)
    prompts = [prompt(zoo, arch, 8 + i, size) for i in range(4)]
    alone = [text(client, arch, p, tokens) for p in prompts]
    # A model on its own caches admits a row only with room for it, so whether these four
    # meet in one batch (and preempt) depends on when they arrive: its preemption is tested
    # in tests/model/test_prefix_snapshots.py; here, that the text is the same either way.
    # On the pool they preempt when they meet; they may not (a CI run of a window model's
    # four arrived apart, stop 35), so up to three tries, the same text every time.
    paged = not admin(zoo, arch, "status").get("kv_cache", "").startswith("contiguous")
    preempted = 0
    for _ in range(3 if paged else 1):
        before = admin(zoo, arch, "stats").get("preemptions", 0)
        with ThreadPoolExecutor(len(prompts)) as pool:
            together = list(pool.map(lambda p: text(client, arch, p, tokens), prompts))
        preempted += admin(zoo, arch, "stats").get("preemptions", 0) - before
        assert together == alone
        if preempted:
            break
    zoo.record_fact(arch, "preemptions", preempted)
    if paged:
        assert preempted > 0
