"""The Redis state store's Lua scripts: each write with its bounds, and the reads that must see one snapshot.

The keys they use are described in asgi/stores/redis_store.py.
"""
from __future__ import annotations

# Every script gets KEYS: index, bytes, total of the kind, the key prefix of an entry's events and the hash of their
# sizes (what a response's events take of its bytes); ARGV[1..3]: the key prefixes of an
# entry, its items and its item ids; ARGV[4]: the id; ARGV[5..7]: ttl_ms, max_entries, max_bytes.
COMMON = """
local A, B, C, id = ARGV[1], ARGV[2], ARGV[3], ARGV[4]
local function now_ms()
  local t = redis.call('TIME')
  return tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
end
local function drop(old)
  local existed = redis.call('DEL', A .. old, B .. old, C .. old, KEYS[4] .. old)
  redis.call('ZREM', KEYS[1], old)
  local size = tonumber(redis.call('HGET', KEYS[2], old) or '0')
  redis.call('HDEL', KEYS[2], old)
  redis.call('HDEL', KEYS[5], old)
  if size ~= 0 then redis.call('DECRBY', KEYS[3], size) end
  return existed
end
local function resize(delta)
  redis.call('HINCRBY', KEYS[2], id, delta)
  redis.call('INCRBY', KEYS[3], delta)
end
-- What is past its TTL leaves the index and the sizes (its keys expired on their own), then the
-- oldest go while the count or the total bytes is past its bound; never `id` itself.
local function evict()
  for _, old in ipairs(redis.call('ZRANGEBYSCORE', KEYS[1], '-inf', now_ms() - tonumber(ARGV[5]))) do
    if old ~= id then drop(old) end
  end
  while redis.call('ZCARD', KEYS[1]) > tonumber(ARGV[6])
      or tonumber(redis.call('GET', KEYS[3]) or '0') > tonumber(ARGV[7]) do
    local oldest = redis.call('ZRANGE', KEYS[1], 0, 1)
    local victim = oldest[1]
    if victim == id then victim = oldest[2] end
    if not victim then break end
    drop(victim)
  end
end
-- ARGV from `first` on: item id, item JSON, item id, ...
local function push(first, ttl)
  if #ARGV < first then return end
  for i = first, #ARGV, 2 do
    redis.call('RPUSH', C .. id, ARGV[i])
    redis.call('RPUSH', B .. id, ARGV[i + 1])
  end
  redis.call('PEXPIRE', B .. id, ttl)
  redis.call('PEXPIRE', C .. id, ttl)
end
"""
# ARGV[8]: the body, ARGV[9]: the entry's bytes, then the items. The TTL counts from now, for its events too (kept).
PUT_RESPONSE = COMMON + """
local old = tonumber(redis.call('HGET', KEYS[2], id) or '0')
local events = tonumber(redis.call('HGET', KEYS[5], id) or '0')
redis.call('DEL', B .. id, C .. id)
redis.call('SET', A .. id, ARGV[8], 'PX', ARGV[5])
push(10, ARGV[5])
redis.call('PEXPIRE', KEYS[4] .. id, ARGV[5])
redis.call('ZADD', KEYS[1], now_ms(), id)
resize(tonumber(ARGV[9]) + events - old)
evict()
"""
# ARGV[8]: max bytes of a response, ARGV[9]: the number of events it holds already, ARGV[10]: the new events' bytes,
# then the events. 1 appended; 0 gone, out of room or out of order. A write: the response's TTL starts again from
# it (its keys and events, and its place in the index), so a background stream outlives the TTL while it runs.
APPEND_EVENTS = COMMON + """
if redis.call('PTTL', A .. id) <= 0 then return 0 end
if redis.call('LLEN', KEYS[4] .. id) ~= tonumber(ARGV[9]) then return 0 end
local size = tonumber(ARGV[10])
if tonumber(redis.call('HGET', KEYS[2], id) or '0') + size > tonumber(ARGV[8]) then return 0 end
for i = 11, #ARGV do redis.call('RPUSH', KEYS[4] .. id, ARGV[i]) end
for _, key in ipairs({A .. id, B .. id, C .. id, KEYS[4] .. id}) do redis.call('PEXPIRE', key, ARGV[5]) end
redis.call('ZADD', KEYS[1], now_ms(), id)
redis.call('HINCRBY', KEYS[5], id, size)
resize(size)
evict()
return 1
"""
# ARGV[8]: the body, ARGV[9]: its bytes and the items', then the items. Creates (indexed by now)
# or updates the metadata (keeps the TTL and the items).
PUT_CONVERSATION = COMMON + """
if redis.call('EXISTS', A .. id) == 1 then
  local old = redis.call('STRLEN', A .. id)
  redis.call('SET', A .. id, ARGV[8], 'KEEPTTL')
  resize(string.len(ARGV[8]) - old)
  evict()
  return 0
end
redis.call('SET', A .. id, ARGV[8], 'PX', ARGV[5])
push(10, ARGV[5])
redis.call('ZADD', KEYS[1], now_ms(), id)
resize(tonumber(ARGV[9]))
evict()
return 1
"""
# ARGV[8]: max items, ARGV[9]: max bytes of a conversation, ARGV[10]: the items' bytes, then the
# items. 1 added, 0 gone, -1 too many items, -2 too many bytes. The items expire with the conversation.
ADD_ITEMS = COMMON + """
local ttl = redis.call('PTTL', A .. id)
if ttl <= 0 then return 0 end
if redis.call('LLEN', C .. id) + (#ARGV - 10) / 2 > tonumber(ARGV[8]) then return -1 end
if tonumber(redis.call('HGET', KEYS[2], id) or '0') + tonumber(ARGV[10]) > tonumber(ARGV[9]) then return -2 end
push(11, ttl)
resize(tonumber(ARGV[10]))
evict()
return 1
"""
DELETE = COMMON + "return drop(id)"
# ARGV[5]: the item id. Removes the first item with that id (an emptied slot, then LREM of it:
# no id or item JSON is empty).
DELETE_ITEM = COMMON + """
local at = redis.call('LPOS', C .. id, ARGV[5])
if not at then return 0 end
local raw = redis.call('LINDEX', B .. id, at)
for _, key in ipairs({B .. id, C .. id}) do
  redis.call('LSET', key, at, '')
  redis.call('LREM', key, 1, '')
end
resize(-string.len(raw))
return 1
"""
# KEYS: the entry, its items, their ids; ARGV: limit, order, after (empty: none).
# {-1}: the entry is gone; {-2}: `after` is not among the ids; else {has_more, items...}.
PAGE = """
if redis.call('EXISTS', KEYS[1]) == 0 then return {-1} end
local limit, asc = tonumber(ARGV[1]), ARGV[2] == 'asc'
local first, last = 0, redis.call('LLEN', KEYS[3]) - 1
if ARGV[3] ~= '' then
  local at = redis.call('LPOS', KEYS[3], ARGV[3])
  if not at then return {-2} end
  if asc then first = at + 1 else last = at - 1 end
end
local got
if asc then
  got = redis.call('LRANGE', KEYS[2], first, first + limit)
else
  if last < 0 then return {0} end
  got = redis.call('LRANGE', KEYS[2], math.max(0, last - limit), last)
  local n = #got
  for i = 1, math.floor(n / 2) do got[i], got[n + 1 - i] = got[n + 1 - i], got[i] end
end
local page = {#got > limit and 1 or 0}
for i = 1, math.min(#got, limit) do page[i + 1] = got[i] end
return page
"""
# KEYS: the entry, its items, their ids; ARGV: the item id. The item, or nil.
GET_ITEM = """
local at = redis.call('LPOS', KEYS[3], ARGV[1])
if not at then return false end
return redis.call('LINDEX', KEYS[2], at)
"""
