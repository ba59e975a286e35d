"""The two Lua scripts of the Redis budget store: one atomic decision per request, one finish.

Key layout (P is the hash tag "{prefix}", so every key lies in one Redis Cluster slot):
  P:resx                  zset  reservation id -> expiry (µs); the reaper's index
  P:res:<rid>             hash  st = h(eld) | e(xpired) | d(one); d = the reservation as JSON
  P:rl:<scope>            hash  r = requests TAT, t = tokens TAT (GCRA, µs, Redis clock)
  P:cc:<scope>            zset  reservation id -> expiry: requests in flight
  P:bd:<scope>:<YYYYMMDD> hash  ut/uc used tokens/nano-USD, rt/rc reserved ones (day)
  P:bm:<scope>:<YYYYMM>   hash  the same for the month
The scripts build keys from P (the reaper cannot know them in advance); KEYS[1] = P:resx
routes the call. Numbers passed back to redis.call are formatted by hand: Lua's default
formatting keeps 14 digits, and a µs timestamp has 16.
"""

PRELUDE = r"""
local P = ARGV[1]
local RESX = KEYS[1]
local MINUTE = 60000000
local DAY_KEY_TTL = 3 * 86400
local MONTH_KEY_TTL = 40 * 86400
local function int(x) return string.format('%.0f', x) end
local function flt(x) return string.format('%.17g', x) end
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000000 + tonumber(t[2])

local function counter_keys(rec, i)
  local keys = {}
  local f = tonumber(rec.b[i])
  if f % 2 == 1 then keys[#keys + 1] = {P .. ':bd:' .. rec.s[i] .. ':' .. rec.d, DAY_KEY_TTL} end
  if f >= 2 then keys[#keys + 1] = {P .. ':bm:' .. rec.s[i] .. ':' .. rec.m, MONTH_KEY_TTL} end
  return keys
end

local function decr_floor(key, field, amount)
  if amount == 0 then return end
  local v = tonumber(redis.call('HGET', key, field) or '0') - amount
  if v <= 0 then redis.call('HDEL', key, field) else redis.call('HSET', key, field, int(v)) end
end

-- Give back what a held reservation reserved: budget counters and concurrency slots.
local function unreserve(rid, rec)
  local tokens, cost = tonumber(rec.t), tonumber(rec.c)
  for i, sid in ipairs(rec.s) do
    for _, kt in ipairs(counter_keys(rec, i)) do
      decr_floor(kt[1], 'rt', tokens)
      decr_floor(kt[1], 'rc', cost)
    end
    if rec.q and tonumber(rec.q[i]) == 1 then redis.call('ZREM', P .. ':cc:' .. sid, rid) end
  end
  redis.call('ZREM', RESX, rid)
end
"""

# UTC calendar from epoch days (H. Hinnant's civil_from_days / days_from_civil).
CALENDAR = r"""
local function civil(z)
  z = z + 719468
  local era = math.floor(z / 146097)
  local doe = z - era * 146097
  local yoe = math.floor((doe - math.floor(doe / 1460) + math.floor(doe / 36524) - math.floor(doe / 146096)) / 365)
  local y = yoe + era * 400
  local doy = doe - (365 * yoe + math.floor(yoe / 4) - math.floor(yoe / 100))
  local mp = math.floor((5 * doy + 2) / 153)
  local d = doy - math.floor((153 * mp + 2) / 5) + 1
  local m = mp < 10 and mp + 3 or mp - 9
  if m <= 2 then y = y + 1 end
  return y, m, d
end
local function days_from_civil(y, m, d)
  if m <= 2 then y = y - 1 end
  local era = math.floor(y / 400)
  local yoe = y - era * 400
  local mp = m > 2 and m - 3 or m + 9
  local doy = math.floor((153 * mp + 2) / 5) + d - 1
  local doe = yoe * 365 + math.floor(yoe / 4) - math.floor(yoe / 100) + doy
  return era * 146097 + doe - 719468
end
"""

# ARGV: P, rid, ttl_us, tokens, cost_nano, tombstone_ms, n, then 8 per scope:
#       id, rpm, tpm, max_concurrent, tokens_day, tokens_month, cost_day, cost_month (-1 = none)
# Returns {code, scope, what, retry_us (-1 = never), now, day, month,
#          limit_r, remaining_r, reset_r_us, limit_t, remaining_t, reset_t_us} (-1 = no such limit),
#         then per scope: day tokens, day cost, month tokens, month cost used + reserved (after
#         this reservation when admitted; -1 = no such counter); not after 'duplicate'.
RESERVE = PRELUDE + CALENDAR + r"""
local rid = ARGV[2]
local ttl = tonumber(ARGV[3])
local tokens = tonumber(ARGV[4])
local cost = tonumber(ARGV[5])
local tomb_ms = tonumber(ARGV[6])
local n = tonumber(ARGV[7])
local CONC_RETRY = 1000000
local HELD_RETRY = 1000000

local days = math.floor(tonumber(t[1]) / 86400)
local y, m, d = civil(days)
local day = string.format('%04d%02d%02d', y, m, d)
local month = string.format('%04d%02d', y, m)
local next_day = (days + 1) * 86400 * 1000000
local ny, nm = y, m + 1
if nm > 12 then ny, nm = y + 1, 1 end
local next_month = days_from_civil(ny, nm, 1) * 86400 * 1000000

-- Reap expired reservations first, so that a crashed gateway never holds capacity for ever.
local expired = redis.call('ZRANGEBYSCORE', RESX, '-inf', int(now), 'LIMIT', 0, 256)
for _, old in ipairs(expired) do
  local rk = P .. ':res:' .. old
  if redis.call('HGET', rk, 'st') == 'h' then
    unreserve(old, cjson.decode(redis.call('HGET', rk, 'd')))
    redis.call('HSET', rk, 'st', 'e')
  else
    redis.call('ZREM', RESX, old)
  end
end

local rkey = P .. ':res:' .. rid
if redis.call('EXISTS', rkey) == 1 then
  return {'duplicate', '', '', -1, now, day, month, -1, -1, -1, -1, -1, -1}
end

-- Check every scope; change nothing unless all of them pass.
local rate_fail, quota_fail = nil, nil
local function fail(cur, sid, what, retry)
  if cur == nil then return {sid, what, retry} end
  if cur[3] == -1 then return cur end
  if retry == -1 or retry > cur[3] then return {sid, what, retry} end
  return cur
end
-- Header values: `after` if the request is admitted, `before` (state without it) if refused.
local after, before = {-1, -1, -1, -1, -1, -1}, {-1, -1, -1, -1, -1, -1}
local function header(h, off, limit, remaining, reset)
  if h[off] == -1 or remaining < h[off + 1] then
    h[off], h[off + 1], h[off + 2] = limit, math.max(remaining, 0), math.ceil(math.max(reset, 0))
  end
end

-- GCRA over one minute: admitted if the new theoretical arrival time is at most a minute ahead.
local function gcra(sid, limit, cost_units, tat, what, off)
  -- A tier's scope is shared by every tenant: its state stays out of the caller's headers.
  local after, before = after, before
  if string.sub(sid, 1, 2) == 'm:' then after, before = {-1, -1, -1, -1, -1, -1}, {-1, -1, -1, -1, -1, -1} end
  local base = math.max(tat, now)
  if limit == 0 then
    header(after, off, 0, 0, 0)
    header(before, off, 0, 0, 0)
    if cost_units > 0 then return nil, -1 end
    return base, nil
  end
  local T = MINUTE / limit
  local new = base + T * cost_units
  local rem_before = math.floor((MINUTE - (base - now)) / T + 1e-9)
  header(before, off, limit, rem_before, base - now)
  if cost_units > limit then
    header(after, off, limit, rem_before, base - now)
    return nil, -1
  end
  if new - now > MINUTE + 1 then
    header(after, off, limit, rem_before, base - now)
    return nil, math.ceil(new - now - MINUTE - 1)
  end
  header(after, off, limit, math.floor((MINUTE - (new - now)) / T + 1e-9), new - now)
  return new, nil
end

-- Over a budget only with what requests in flight hold (it fits beside what was used): they
-- may give most of it back, so the refusal is a short wait (':held'), not a spent budget.
local function check_budget(sid, key, tlim, clim, reset_at, what_t, what_c)
  local v = redis.call('HMGET', key, 'ut', 'rt', 'uc', 'rc')
  local ut, rt, uc, rc = tonumber(v[1] or '0'), tonumber(v[2] or '0'), tonumber(v[3] or '0'), tonumber(v[4] or '0')
  if tlim >= 0 and ut + rt + tokens > tlim then
    if ut + tokens <= tlim then rate_fail = fail(rate_fail, sid, what_t .. ':held', HELD_RETRY)
    else quota_fail = fail(quota_fail, sid, what_t, tokens <= tlim and reset_at - now or -1) end
  end
  if clim >= 0 and uc + rc + cost > clim then
    if uc + cost <= clim then rate_fail = fail(rate_fail, sid, what_c .. ':held', HELD_RETRY)
    else quota_fail = fail(quota_fail, sid, what_c, cost <= clim and reset_at - now or -1) end
  end
  return ut + rt, uc + rc
end

-- The budget counters of every scope after the decision (`add`: this reservation's share).
local function with_counters(reply, scopes, add)
  for _, s in ipairs(scopes) do
    for _, c in ipairs({{s.dt, s.dc}, {s.mt, s.mc}}) do
      if c[1] < 0 then
        reply[#reply + 1] = -1
        reply[#reply + 1] = -1
      else
        reply[#reply + 1] = c[1] + add * tokens
        reply[#reply + 1] = c[2] + add * cost
      end
    end
  end
  return reply
end

local scopes = {}
for i = 1, n do
  local b = 7 + (i - 1) * 8
  local s = {id = ARGV[b + 1], rpm = tonumber(ARGV[b + 2]), tpm = tonumber(ARGV[b + 3]),
             conc = tonumber(ARGV[b + 4]), tday = tonumber(ARGV[b + 5]), tmon = tonumber(ARGV[b + 6]),
             cday = tonumber(ARGV[b + 7]), cmon = tonumber(ARGV[b + 8]), flags = 0,
             dt = -1, dc = -1, mt = -1, mc = -1}
  scopes[i] = s
  if s.rpm >= 0 or s.tpm >= 0 then
    local tats = redis.call('HMGET', P .. ':rl:' .. s.id, 'r', 't')
    if s.rpm >= 0 then
      local new, retry = gcra(s.id, s.rpm, 1, tonumber(tats[1] or '0'), 'rpm', 1)
      if retry then rate_fail = fail(rate_fail, s.id, 'rpm', retry) else s.new_r = new end
    end
    if s.tpm >= 0 then
      local new, retry = gcra(s.id, s.tpm, tokens, tonumber(tats[2] or '0'), 'tpm', 4)
      if retry then rate_fail = fail(rate_fail, s.id, 'tpm', retry) else s.new_t = new end
    end
  end
  if s.conc >= 0 then
    local cck = P .. ':cc:' .. s.id
    redis.call('ZREMRANGEBYSCORE', cck, '-inf', int(now))
    if redis.call('ZCARD', cck) + 1 > s.conc then
      rate_fail = fail(rate_fail, s.id, 'max_concurrent', s.conc == 0 and -1 or CONC_RETRY)
    end
  end
  -- A key, tenant or tier scope counts its day and month use, limited or not: a budget added
  -- later (a reload) then starts from what was already used in its period. A session (ids the
  -- client picks) keeps only the counters it has a budget for (ScopeRule.budget_flags).
  local every = string.sub(s.id, 1, 2) ~= 's:'
  if every or s.tday >= 0 or s.cday >= 0 then
    s.flags = s.flags + 1
    s.dt, s.dc = check_budget(s.id, P .. ':bd:' .. s.id .. ':' .. day, s.tday, s.cday, next_day,
                              'tokens_per_day', 'cost_per_day')
  end
  if every or s.tmon >= 0 or s.cmon >= 0 then
    s.flags = s.flags + 2
    s.mt, s.mc = check_budget(s.id, P .. ':bm:' .. s.id .. ':' .. month, s.tmon, s.cmon, next_month,
                              'tokens_per_month', 'cost_per_month')
  end
end

local refused = quota_fail or rate_fail
if refused then
  return with_counters({refused[2], refused[1], refused[2], refused[3], now, day, month,
                        before[1], before[2], before[3], before[4], before[5], before[6]}, scopes, 0)
end

-- All scopes pass: reserve in every one of them.
local expiry = now + ttl
local rec = {t = ARGV[4], c = ARGV[5], d = day, m = month, s = {}, b = {}, r = {}, q = {}}
for i, s in ipairs(scopes) do
  if s.new_r or s.new_t then
    local rlk = P .. ':rl:' .. s.id
    if s.new_r and s.new_t then redis.call('HSET', rlk, 'r', flt(s.new_r), 't', flt(s.new_t))
    elseif s.new_r then redis.call('HSET', rlk, 'r', flt(s.new_r))
    else redis.call('HSET', rlk, 't', flt(s.new_t)) end
    local ahead = math.max(s.new_r or now, s.new_t or now) - now
    redis.call('PEXPIRE', rlk, int(math.ceil(ahead / 1000) + 1000))
  end
  if s.conc >= 0 then
    local cck = P .. ':cc:' .. s.id
    redis.call('ZADD', cck, int(expiry), rid)
    redis.call('PEXPIRE', cck, int(math.ceil(ttl / 1000) + 60000))
  end
  rec.s[i], rec.b[i], rec.r[i], rec.q[i] = s.id, s.flags, s.tpm, (s.conc >= 0) and 1 or 0
  for _, kt in ipairs(counter_keys(rec, i)) do
    redis.call('HINCRBY', kt[1], 'rt', int(tokens))
    redis.call('HINCRBY', kt[1], 'rc', int(cost))
    redis.call('EXPIRE', kt[1], kt[2])
  end
end
redis.call('HSET', rkey, 'st', 'h', 'd', cjson.encode(rec))
redis.call('PEXPIRE', rkey, int(math.ceil(ttl / 1000) + tomb_ms))
redis.call('ZADD', RESX, int(expiry), rid)
return with_counters({'ok', '', '', -1, now, day, month, after[1], after[2], after[3], after[4], after[5], after[6]},
                     scopes, 1)
"""

# ARGV: P, rid, actual_tokens, actual_cost_nano, tombstone_ms, the client's record (JSON)
# Returns {status, now}: applied | late | orphan | duplicate
FINISH = PRELUDE + r"""
local rid = ARGV[2]
local tokens = tonumber(ARGV[3])
local cost = tonumber(ARGV[4])
local tomb_ms = tonumber(ARGV[5])
local rkey = P .. ':res:' .. rid
local st = redis.call('HGET', rkey, 'st')
if st == 'd' then return {'duplicate', now} end
local rec
if st then rec = cjson.decode(redis.call('HGET', rkey, 'd')) else rec = cjson.decode(ARGV[6]) end

if st == 'h' then
  unreserve(rid, rec)
  -- Tokens per minute were charged the estimate: charge the difference to the actual count.
  local diff = tokens - tonumber(rec.t)
  for i, sid in ipairs(rec.s) do
    local tpm = tonumber(rec.r[i])
    if tpm > 0 and diff ~= 0 then
      local rlk = P .. ':rl:' .. sid
      local tat = tonumber(redis.call('HGET', rlk, 't') or '0')
      local new = math.max(math.max(tat, now) + diff * (MINUTE / tpm), now)
      redis.call('HSET', rlk, 't', flt(new))
      redis.call('PEXPIRE', rlk, int(math.ceil((new - now) / 1000) + 1000))
    end
  end
end

-- Commit the actual usage to the periods the reservation was counted in.
for i, _ in ipairs(rec.s) do
  for _, kt in ipairs(counter_keys(rec, i)) do
    if tokens > 0 then redis.call('HINCRBY', kt[1], 'ut', int(tokens)) end
    if cost > 0 then redis.call('HINCRBY', kt[1], 'uc', int(cost)) end
    redis.call('EXPIRE', kt[1], kt[2])
  end
end
redis.call('HSET', rkey, 'st', 'd')
redis.call('HDEL', rkey, 'd')           -- a tombstone keeps only its state
redis.call('PEXPIRE', rkey, int(tomb_ms))
if st == 'h' then return {'applied', now} end
if st == 'e' then return {'late', now} end
return {'orphan', now}
"""
