"""Lua scripts of the shared (Redis) circuit breaker; memory_store.py follows them step for step.

Keys per breaker name, all under the budgets' hash tag (one slot):
  KEYS[1] P:br:<name>   hash  st = c|o|h, until (µs), gen, hs (half-open successes)
  KEYS[2] P:brp:<name>  zset  probe id -> expiry (µs): half-open probes in flight
  KEYS[3] P:brw:<name>  hash  the sliding window: e<i> bucket epoch, c<i> calls, f<i> failures, s<i> slow
Every transition bumps `gen`; a record carrying an older generation is ignored, so a call that
started before the breaker opened (or closed) cannot sway the new state.
"""

PRELUDE = r"""
local function int(x) return string.format('%.0f', x) end
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000000 + tonumber(t[2])
local h = redis.call('HMGET', KEYS[1], 'st', 'until', 'gen', 'hs')
local st, open_until = h[1] or 'c', tonumber(h[2] or '0')
local gen, hs = tonumber(h[3] or '0'), tonumber(h[4] or '0')
"""

# ARGV: probe_id, half_open_probes, probe_ttl_us, busy_retry_us
# Returns {code, gen, retry_us}: ok | probe | open | busy
ALLOW = PRELUDE + r"""
local probe_id, limit, probe_ttl, busy = ARGV[1], tonumber(ARGV[2]), tonumber(ARGV[3]), tonumber(ARGV[4])
if st == 'c' then return {'ok', gen, 0} end
if st == 'o' then
  if now < open_until then return {'open', gen, open_until - now} end
  gen, hs = gen + 1, 0
  redis.call('HSET', KEYS[1], 'st', 'h', 'gen', gen, 'hs', 0)
  redis.call('DEL', KEYS[2])
end
redis.call('ZREMRANGEBYSCORE', KEYS[2], '-inf', int(now))
if redis.call('ZCARD', KEYS[2]) + hs < limit then
  redis.call('ZADD', KEYS[2], int(now + probe_ttl), probe_id)
  redis.call('PEXPIRE', KEYS[2], int(math.ceil(probe_ttl / 1000) + 1000))
  return {'probe', gen, 0}
end
return {'busy', gen, busy}
"""

# ARGV: gen, probe_id, outcome (s|f|n), slow (1|0), window_us, buckets, min_calls, failure_rate,
#       slow_rate, open_us, half_open_probes
# Returns {result}: counted | ignored | stale | opened | closed
RECORD = PRELUDE + r"""
local pgen, probe_id, outcome, slow = tonumber(ARGV[1]), ARGV[2], ARGV[3], ARGV[4] == '1'
local window, nb, min_calls = tonumber(ARGV[5]), tonumber(ARGV[6]), tonumber(ARGV[7])
local failure_rate, slow_rate, open_us, limit = tonumber(ARGV[8]), tonumber(ARGV[9]), tonumber(ARGV[10]),
  tonumber(ARGV[11])

local function open()
  redis.call('HSET', KEYS[1], 'st', 'o', 'until', int(now + open_us), 'gen', gen + 1, 'hs', 0)
  redis.call('DEL', KEYS[2], KEYS[3])
  return {'opened'}
end

if pgen ~= gen or st == 'o' then
  if probe_id ~= '' then redis.call('ZREM', KEYS[2], probe_id) end
  return {'stale'}
end
if st == 'h' then
  if probe_id == '' then return {'stale'} end
  redis.call('ZREM', KEYS[2], probe_id)
  if outcome == 'n' then return {'ignored'} end
  if outcome == 'f' or slow then return open() end
  hs = redis.call('HINCRBY', KEYS[1], 'hs', 1)
  if hs >= limit then
    redis.call('HSET', KEYS[1], 'st', 'c', 'gen', gen + 1, 'hs', 0)
    redis.call('DEL', KEYS[2], KEYS[3])
    return {'closed'}
  end
  return {'counted'}
end
if outcome == 'n' then return {'ignored'} end

-- Closed: count the call in the current bucket, then the rates over the whole window.
local width = window / nb
local idx = math.floor(now / width)
local slot = idx % nb
if tonumber(redis.call('HGET', KEYS[3], 'e' .. slot) or '-1') ~= idx then
  redis.call('HSET', KEYS[3], 'e' .. slot, int(idx), 'c' .. slot, 0, 'f' .. slot, 0, 's' .. slot, 0)
end
redis.call('HINCRBY', KEYS[3], 'c' .. slot, 1)
if outcome == 'f' then redis.call('HINCRBY', KEYS[3], 'f' .. slot, 1) end
if slow then redis.call('HINCRBY', KEYS[3], 's' .. slot, 1) end
redis.call('PEXPIRE', KEYS[3], int(math.ceil(window / 1000) * 2))
local calls, fails, slows = 0, 0, 0
for i = 0, nb - 1 do
  local v = redis.call('HMGET', KEYS[3], 'e' .. i, 'c' .. i, 'f' .. i, 's' .. i)
  if v[1] and tonumber(v[1]) > idx - nb then
    calls = calls + tonumber(v[2] or '0')
    fails = fails + tonumber(v[3] or '0')
    slows = slows + tonumber(v[4] or '0')
  end
end
if calls >= min_calls and (fails >= failure_rate * calls or slows >= slow_rate * calls) then return open() end
return {'counted'}
"""

# Returns {st, gen, open_left_us, calls, fails, slows, probes, hs}
STATE = PRELUDE + r"""
local window, nb = tonumber(ARGV[1]), tonumber(ARGV[2])
local idx = math.floor(now / (window / nb))
local calls, fails, slows = 0, 0, 0
for i = 0, nb - 1 do
  local v = redis.call('HMGET', KEYS[3], 'e' .. i, 'c' .. i, 'f' .. i, 's' .. i)
  if v[1] and tonumber(v[1]) > idx - nb then
    calls = calls + tonumber(v[2] or '0')
    fails = fails + tonumber(v[3] or '0')
    slows = slows + tonumber(v[4] or '0')
  end
end
local probes = redis.call('ZCOUNT', KEYS[2], '(' .. int(now), '+inf')
local left = 0
if st == 'o' and open_until > now then left = open_until - now end
return {st, gen, left, calls, fails, slows, probes, hs}
"""
