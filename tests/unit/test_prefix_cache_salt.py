"""Prefix-cache isolation: salted chains share no block across salts, the root table stays bounded, and the
data-parallel router and KV events see the same salted hashes as the cache (docs/prefix-caching.md)."""
from __future__ import annotations

from rill.asgi.engine_link.dp_router import EngineChooser, block_hashes
from rill.asgi.http.auth import ApiKeyGuard, digest
from rill.asgi.requests.cache_salt import engine_salt
from rill.engine_proc.sched.block_manager import BlockManager
from rill.engine_proc.sched.request import EngineRequest
from rill.ipc.cache_salt import SALT_LEN
from rill.ipc.protocol import SamplingParams
from tests.helpers.prefix_blocks import BS, ids
from tests.helpers.scheduling import PagedFakeModel, make_scheduler, run_until_done

KEY_A, KEY_B = digest("sk-a"), digest("sk-b")
SALT_A, SALT_B = engine_salt(KEY_A, None), engine_salt(KEY_B, None)


def salted(req_id: str, prompt: list[int], salt: bytes, lora: str = "") -> EngineRequest:
    return EngineRequest(req_id, "w0", list(prompt), SamplingParams(max_tokens=4, cache_salt=salt, lora=lora))


def computed(bm: BlockManager, req: EngineRequest) -> EngineRequest:
    """Gives req blocks for all its tokens and enters them as computed, as a step would."""
    bm.allocate(req, req.num_tokens)
    req.num_computed_tokens = req.num_tokens
    bm.after_step(req)
    return req


# ---- the salt the API worker derives ----------------------------------------------------------------


def test_the_salt_separates_keys_and_their_own_salts_and_is_empty_for_neither() -> None:
    assert engine_salt("", None) == b""  # isolation none, no cache_salt: the shared cache, as before
    salts = {engine_salt(k, s) for k in ("", KEY_A, KEY_B) for s in (None, "x", "y")} - {b""}
    assert len(salts) == 8 and {len(s) for s in salts} == {SALT_LEN}
    assert engine_salt(KEY_A, "x") == engine_salt(KEY_A, "x")  # stable: the same tenant hits its own blocks
    # a caller who copies another key's cache_salt still gets its own key's namespace
    assert engine_salt(KEY_B, "x") != engine_salt(KEY_A, "x")


def test_the_guard_names_the_key_that_matched() -> None:
    guard = ApiKeyGuard([KEY_A, KEY_B])
    assert guard.check("/v1/completions", [(b"authorization", b"Bearer sk-b")]) == KEY_B
    assert guard.check("/v1/completions", [(b"x-api-key", b"sk-a")]) == KEY_A
    assert guard.check("/health", []) == ""  # an open path: no key, no namespace
    assert ApiKeyGuard().check("/v1/completions", []) == ""


# ---- the cache ---------------------------------------------------------------------------------------


def test_the_same_prompt_under_two_salts_shares_no_block() -> None:
    bm = BlockManager(20, BS)
    prompt = ids(100, 12)  # three full blocks
    a = computed(bm, salted("a", prompt, SALT_A))
    find = bm.find_cached_blocks
    assert find(salted("a2", prompt + [1], SALT_A), 3) == a.block_ids  # its own: every block
    assert find(salted("b", prompt + [1], SALT_B), 3) == []
    assert find(salted("none", prompt + [1], b""), 3) == []  # nor the unsalted cache
    b = computed(bm, salted("b", prompt, SALT_B))
    assert not set(a.block_ids) & set(b.block_ids)
    assert bm.prefix_cache.num_cached_blocks() == 6  # both copies, side by side


def test_salts_stay_apart_even_when_every_hash_collides() -> None:
    """Roots are told apart by serial, not hash: a hash collision costs a miss, never another tenant's KV."""
    bm = BlockManager(20, BS, hash_fn=lambda key: hash(key[1]))  # blind to the parent: every salt's chain collides
    prompt = ids(100, 8)
    computed(bm, salted("a", prompt, SALT_A))
    assert bm.find_cached_blocks(salted("b", prompt + [1], SALT_B), 2) == []
    assert bm.find_cached_blocks(salted("base", prompt + [1], b""), 2) == []


def test_a_salt_and_a_lora_adapter_combine() -> None:
    bm = BlockManager(20, BS)
    prompt = ids(100, 8)
    computed(bm, salted("a", prompt, SALT_A, lora="ad"))
    find = bm.find_cached_blocks
    assert len(find(salted("a2", prompt + [1], SALT_A, lora="ad"), 2)) == 2
    assert find(salted("a-base", prompt + [1], SALT_A), 2) == []
    assert find(salted("b", prompt + [1], SALT_B, lora="ad"), 2) == []


def test_the_root_table_is_bounded_by_the_cached_blocks() -> None:
    """Salts are many (a key each, and any cache_salt): a root lives only while a cached block chains to it."""
    bm = BlockManager(5, BS)  # four usable blocks
    cache = bm.prefix_cache
    for i in range(50):
        req = computed(bm, salted(f"r{i}", ids(100, 8), engine_salt(KEY_A, f"salt-{i}")))
        assert len(cache.roots) <= cache.num_cached_blocks() <= 4
        bm.free(req)
    assert len(cache.roots) == 2  # the last two salts' chains hold the four blocks
    assert len(bm.find_cached_blocks(salted("again", ids(100, 9), engine_salt(KEY_A, "salt-49")), 2)) == 2
    assert bm.find_cached_blocks(salted("gone", ids(100, 9), engine_salt(KEY_A, "salt-0")), 2) == []


def test_a_root_made_again_finds_nothing_left_under_the_old_one() -> None:
    bm = BlockManager(3, BS)  # two usable blocks
    a = computed(bm, salted("a", ids(100, 8), SALT_A))
    bm.free(a)
    computed(bm, salted("b", ids(200, 8), SALT_B))  # evicts both of a's: a's root goes with them
    assert len(bm.prefix_cache.roots) == 1
    assert bm.find_cached_blocks(salted("a2", ids(100, 9), SALT_A), 2) == []


def test_cached_tokens_count_only_a_salts_own_hits() -> None:
    """What the caller sees in usage.prompt_tokens_details.cached_tokens."""
    sched = make_scheduler(block_size=BS)
    model = PagedFakeModel(BS, sched.block_manager)
    prompt = ids(100, 10)
    reqs = [salted("a", prompt, SALT_A), salted("b", prompt, SALT_B), salted("a2", prompt, SALT_A)]
    for req in reqs:
        sched.add(req)
        run_until_done(sched, model)
    assert [r.num_cached_tokens for r in reqs] == [0, 0, 8]


# ---- the same root outside the cache -------------------------------------------------------------------


def test_kv_events_and_the_router_chain_from_the_same_salted_root() -> None:
    bm = BlockManager(10, BS, record_events=True)
    prompt = ids(100, 8)
    computed(bm, salted("a", prompt, SALT_A))
    computed(bm, salted("base", prompt, b""))
    events = bm.prefix_cache.take_events()
    salted_hashes, base_hashes = [e[1] for e in events[:2]], [e[1] for e in events[2:]]
    assert [e[2] for e in events[:2]] == [None, salted_hashes[0]]  # a chain: vLLM's first parent is None
    assert salted_hashes == block_hashes(prompt, BS, SALT_A)  # the router's affinity keys are the cache's
    assert base_hashes == block_hashes(prompt, BS)
    assert not set(salted_hashes) & set(base_hashes)


def test_router_affinity_holds_per_tenant() -> None:
    chooser = EngineChooser(2, BS)
    prompt = ids(100, 12)
    first = chooser.choose(prompt, SALT_A)
    assert chooser.choose(prompt, SALT_A) == first  # its own prefix: back to its holder
    assert chooser.choose(prompt, SALT_B) == 1 - first  # another tenant's identical prompt: least loaded


def test_the_salt_survives_the_wire() -> None:
    from rill.ipc import protocol as p

    submit = p.Submit(["r-0"], "w0", SamplingParams(max_tokens=4, cache_salt=SALT_A), [[1, 2, 3]])
    assert p.input_decoder.decode(p.input_encoder.encode(submit)).params.cache_salt == SALT_A
