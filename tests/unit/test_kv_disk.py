"""The prefix cache's disk tier (engine_proc/kv_disk/): spill and reload round trips, the bound in bytes, damaged
files, and the model identity its folders are keyed by. Real files in tmp_path, a real KVCache, no model."""
from __future__ import annotations

import os

import msgspec
import pytest
import torch
from transformers import LlamaConfig

from rill.asgi.http.auth import digest
from rill.asgi.requests.cache_salt import engine_salt
from rill.engine_proc.attention.kv_cache import KVCache
from rill.engine_proc.kv_disk.identity import identity_folder, lock_folder, model_identity
from rill.engine_proc.kv_disk.store import BlockStore, file_name
from rill.engine_proc.kv_disk.tier import DiskTier
from rill.engine_proc.sched.block_manager import BlockManager
from rill.engine_proc.sched.request import EngineRequest
from rill.ipc.protocol import SamplingParams
from tests.helpers.prefix_blocks import BS, ids

NUM_BLOCKS = 12
CONFIG = LlamaConfig(hidden_size=32, num_attention_heads=4, num_key_value_heads=2, num_hidden_layers=3,
                     intermediate_size=64, vocab_size=1000)


def req(req_id: str, prompt: list[int], salt: bytes = b"", lora: str = "") -> EngineRequest:
    r = EngineRequest(req_id, "w0", list(prompt), SamplingParams(max_tokens=4, cache_salt=salt, lora=lora))
    r.lora_load_id = 1 if lora else 0
    return r


def computed(bm: BlockManager, kv: KVCache, r: EngineRequest, tier: DiskTier | None = None) -> EngineRequest:
    """Blocks for all of r's tokens (schedule()), the evicted spilled (the busy loop), random K/V written into them
    (the step), entered as computed (update())."""
    bm.allocate(r, r.num_tokens)
    if tier is not None:
        tier.spill_evicted()
    block_ids = torch.tensor(r.block_ids)
    shape, dtype = kv.read_blocks(block_ids).shape, kv.read_blocks(block_ids).dtype
    kv.write_blocks(block_ids, torch.randn(shape).to(dtype))
    r.num_computed_tokens = r.num_tokens
    bm.after_step(r)
    return r


def engine(tmp_path, max_bytes: int = 1 << 30, dtype=torch.bfloat16):
    """A fresh 'process': KV cache, block manager, and a disk tier on tmp_path/disk."""
    kv = KVCache(CONFIG, num_blocks=NUM_BLOCKS, block_size=BS, dtype=dtype)
    bm = BlockManager(NUM_BLOCKS, BS, record_events=True)
    return kv, bm, DiskTier(BlockStore(tmp_path / "disk", max_bytes), kv, bm)


def kv_of(kv: KVCache, block_ids: list[int]) -> torch.Tensor:
    return kv.read_blocks(torch.tensor(block_ids))


def test_evicted_blocks_spill_and_a_restart_reloads_them_equal(tmp_path) -> None:
    kv, bm, tier = engine(tmp_path)
    tier.start()
    prompt = ids(100, 3 * BS + 1)
    a = computed(bm, kv, req("a", prompt))
    before = kv_of(kv, a.block_ids[:3])
    bm.free(a)
    computed(bm, kv, req("b", ids(5000, (NUM_BLOCKS - 1) * BS)), tier)  # takes every block: a's three are evicted
    assert bm.find_cached_blocks(req("a2", prompt), 3) == []
    tier.writer.close(10)
    assert tier.writer.num_written == 3 and len(tier.store) == 3

    kv2, bm2, tier2 = engine(tmp_path)  # the restart
    assert tier2.reload() == 3
    hits = bm2.find_cached_blocks(req("a3", prompt), 3)
    assert len(hits) == 3
    assert torch.equal(kv_of(kv2, hits), before)  # bit for bit
    assert bm2.num_free_blocks() == NUM_BLOCKS - 1  # reloaded blocks are cached and evictable
    stored = bm2.prefix_cache.take_events()  # KV events: BlockStored for each, as register() records them
    assert [e[0] for e in stored] == ["stored"] * 3
    assert [e[1] for e in stored] == [bm2.prefix_cache._entries[i].block_hash for i in hits]
    assert stored[0][2] is None and stored[1][2] == stored[0][1] and stored[2][3] == tuple(prompt[2 * BS : 3 * BS])


def test_a_clean_stop_spills_the_cached_blocks_and_salted_chains_come_back(tmp_path) -> None:
    salt = engine_salt(digest("sk-a"), None)
    kv, bm, tier = engine(tmp_path)
    tier.start()
    prompt = ids(300, 2 * BS + 2)
    salted = computed(bm, kv, req("s", prompt, salt=salt))
    plain = computed(bm, kv, req("p", prompt))
    adapter = computed(bm, kv, req("l", ids(900, 2 * BS + 1), lora="ad"))
    expected = {"s": kv_of(kv, salted.block_ids[:2]), "p": kv_of(kv, plain.block_ids[:2])}
    for r in (salted, plain, adapter):
        bm.free(r)
    tier.close()
    assert len(tier.store) == 4  # two blocks each of the base and salted chains; the adapter's are never kept

    kv2, bm2, tier2 = engine(tmp_path)
    assert tier2.reload() == 4
    assert bm2.find_cached_blocks(req("x", prompt, salt=engine_salt(digest("sk-b"), None)), 2) == []
    for name, salt_of in (("s", salt), ("p", b"")):
        hits = bm2.find_cached_blocks(req(name, prompt, salt=salt_of), 2)
        assert len(hits) == 2 and torch.equal(kv_of(kv2, hits), expected[name])


def test_the_disk_is_bounded_in_bytes_least_recently_used_first(tmp_path) -> None:
    kv, bm, tier = engine(tmp_path)
    a = computed(bm, kv, req("a", ids(100, 4 * BS + 1)))
    bm.free(a)
    tier.close()  # four blocks written, hottest (the head, freed last) stamped newest
    sizes = [p.stat().st_size for p in (tmp_path / "disk").glob("*.kvb")]
    assert len(sizes) == 4
    store = BlockStore(tmp_path / "disk", 2 * sizes[0] + sizes[0] // 2)  # room for two and a half
    assert len(store) == 2 and store.num_bytes <= store.max_bytes and store.num_evicted == 2
    kept = set(store.hottest())
    blocks = sorted(bm.prefix_cache.hottest(bm.ref_counts), key=lambda item: item[1].depth)
    assert kept == {blocks[0][1].block_hash, blocks[1][1].block_hash}  # the prompt's head: what others share

    store.touch(blocks[1][1].block_hash)  # used again: the other one goes first
    header, payload = store.read(blocks[1][1].block_hash)
    other = blocks[0][1].block_hash
    store.write(msgspec.structs.replace(header, block_hash=12345), payload)
    assert 12345 in store and other not in store and blocks[1][1].block_hash in store


@pytest.mark.parametrize("damage", ["truncate", "flip", "garbage"])
def test_a_damaged_file_is_never_served_and_is_removed(tmp_path, damage) -> None:
    kv, bm, tier = engine(tmp_path)
    prompt = ids(100, 3 * BS + 1)
    a = computed(bm, kv, req("a", prompt))
    head_kv = kv_of(kv, a.block_ids[:1])
    bm.free(a)
    tier.close()
    second = bm.prefix_cache.find(req("q", prompt), 3)[1]
    path = tmp_path / "disk" / file_name(bm.prefix_cache._entries[second].block_hash)
    data = path.read_bytes()
    if damage == "truncate":  # a crash mid-write, after a rename without fsync
        data = data[: len(data) - 100]
    elif damage == "flip":
        data = data[:-10] + bytes([data[-10] ^ 0xFF]) + data[-9:]
    else:
        data = b"\0" * len(data)
    path.write_bytes(data)
    (tmp_path / "disk" / "x.kvb.tmp123").write_bytes(b"half")  # a write cut short by a crash

    kv2, bm2, tier2 = engine(tmp_path)
    assert not (tmp_path / "disk" / "x.kvb.tmp123").exists()
    assert tier2.reload() == 1  # the head only: the damaged second block, and the third behind it, stay out
    hits = bm2.find_cached_blocks(req("r", prompt), 3)
    assert len(hits) == 1 and torch.equal(kv_of(kv2, hits), head_kv)
    assert not path.exists()


def test_the_folder_is_keyed_by_the_model_identity(tmp_path) -> None:
    model = tmp_path / "m"
    model.mkdir()
    (model / "config.json").write_text('{"hidden_size": 32}')
    layout = ("bfloat16", [3, 2, 16, 2, 8])

    def folder(**changes):
        kw = dict(dtype="bfloat16", block_size=16, block_layout=layout, load_format="auto", quantization="none")
        return identity_folder(tmp_path / "disk", model_identity(str(model), **{**kw, **changes}))

    base = folder()
    assert folder() == base  # the same model: the same folder, across processes (no str hash in it)
    others = [folder(dtype="float32"), folder(block_size=32), folder(block_layout=("int8", [3, 2, 16, 2, 12])),
              folder(load_format="dummy"), folder(quantization="int8")]
    (model / "config.json").write_text('{"hidden_size": 64}')
    others.append(folder())
    (model / "config.json").write_text('{"hidden_size": 32}')
    (model / "model.safetensors").write_bytes(b"w")
    others.append(folder())
    assert len({base, *others}) == len(others) + 1
    assert (base / "identity.json").is_file()
    assert folder(dtype="bfloat16") != folder(dtype="bfloat16").parent / "rank1"
    assert identity_folder(tmp_path / "disk", model_identity(str(model), dtype="x", block_size=1, block_layout=layout,
                                                            load_format="auto", quantization="none"), 1).name == "rank1"


def test_one_engine_per_folder(tmp_path) -> None:
    fd = lock_folder(tmp_path)
    pid = os.fork()
    if pid == 0:  # another process: the lock is held
        try:
            lock_folder(tmp_path)
        except ValueError:
            os._exit(0)
        os._exit(1)
    assert os.waitpid(pid, 0)[1] == 0
    os.close(fd)


def test_a_full_queue_drops_spills_instead_of_waiting(tmp_path) -> None:
    kv, bm, tier = engine(tmp_path)
    tier.start()
    tier.writer.max_queued_bytes = 0  # nothing fits
    a = computed(bm, kv, req("a", ids(100, 2 * BS + 1)))
    bm.free(a)
    bm.allocate(req("b", ids(5000, (NUM_BLOCKS - 1) * BS)), (NUM_BLOCKS - 1) * BS)
    tier.spill_evicted()  # returns: a wait for room would never end (pytest-timeout fails it)
    assert tier.writer.num_dropped == 2 and len(tier.store) == 0
    tier.writer.close(5)


def test_an_idle_engine_spills_its_cached_blocks_so_a_stop_has_nothing_left(tmp_path) -> None:
    kv, bm, tier = engine(tmp_path)
    tier.start()
    assert not tier.has_idle_work()
    a = computed(bm, kv, req("a", ids(100, 4 * BS + 1)))  # 4 full blocks cached, still held
    before = kv_of(kv, a.block_ids[:4])
    assert tier.has_idle_work()
    for _ in range(10):
        if not tier.has_idle_work():
            break
        tier.spill_idle()
    assert not tier.has_idle_work()
    tier.writer.close(10)
    assert tier.writer.num_written == 4 and len(tier.store) == 4  # nothing evicted: all written while idle
    tier.writer = None
    tier.close(budget_s=0.0)  # the stop: nothing left to write

    kv2, bm2, tier2 = engine(tmp_path)
    assert tier2.reload() == 4
    hits = bm2.find_cached_blocks(req("a2", ids(100, 4 * BS + 1)), 4)
    assert torch.equal(kv_of(kv2, hits), before)
