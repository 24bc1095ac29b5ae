-- Requests decided together in one call, in order; each all or nothing.
--
-- Concurrent requests waiting on one connection are coalesced into one call
-- (see coalesce.rs): a script call costs Redis far more than the limiting
-- logic, so one call for many requests is what makes Redis fast.
--
-- KEYS: every check's keys, request after request (sliding window: current
--       then previous window; fixed window and token bucket: one key).
-- ARGV[1]: the number of requests. Then per request:
--   the number of checks,
--   now, in microseconds since the epoch (the caller's clock: key names
--   carry the window number, so the caller must know it),
--   and seven per check:
--   algorithm ('f', 's' or 't'),
--   limit,
--   windows: the window's first µs; token bucket: the period (µs),
--   windows: the window's end (µs);  token bucket: the burst,
--   cost (admission needs room for this many; at least 1),
--   charge (admission spends this many; 0 for a check),
--   enforcement: '1' enforced, '0' shadow (never blocks), 'q' quota mode
--   (blocks only when every 'q' check of the request is refused), 'Q' quota
--   mode decided by the caller (never blocks here; Cluster, across slots).
-- Windows are computed by the caller (calendar months, multiples of a unit);
-- key names already carry the window number.
-- Returns three integers per check, flat, in order: allowed (1/0),
-- remaining, wait (µs).
--
-- A later request sees what the earlier ones of the call spent, exactly as
-- if each had been a call of its own. Every write is SET ... PXAT: the value
-- and its expiry in one command, so a counter without an expiry cannot
-- exist, even for an instant. Nothing is written for a refused request.
--
-- Written for Redis's per-call cost: one MGET for every key of the call, no
-- closures per check.

local ARGS = 7

-- What the call has committed so far (key -> value and expiry, in order),
-- what the current request would commit, and what Redis held before the
-- call. The pending tables are emptied, not made anew, for each request.
local committed, committed_exp, committed_order = {}, {}, {}
local pending, pending_exp, pending_order = {}, {}, {}
-- Every key the call may read, in one MGET: one redis.call per call
-- instead of one per key (a call from Lua costs more than the read itself).
local stored = {}
do
  -- Each key once (a hot key is in every request of the call), in slices:
  -- unpack() is bounded by Lua's stack (8,000 values).
  local unique, n = {}, 0
  for i = 1, #KEYS do
    local key = KEYS[i]
    if stored[key] == nil then
      stored[key] = 0
      n = n + 1
      unique[n] = key
    end
  end
  for from = 1, n, 4000 do
    local to = math.min(n, from + 3999)
    local values = redis.call('MGET', unpack(unique, from, to))
    for i = from, to do
      stored[unique[i]] = tonumber(values[i - from + 1] or 0)
    end
  end
end
local function read(key)
  local v = pending[key]
  if v ~= nil then return v end
  v = committed[key]
  if v ~= nil then return v end
  return stored[key] or 0
end

local out = {}
local o = 0
local k = 1
local a = 2
for _ = 1, tonumber(ARGV[1]) do
  local checks = tonumber(ARGV[a])
  local now = tonumber(ARGV[a + 1])
  local first, first_key = a + 2, k
  for i = #pending_order, 1, -1 do
    local key = pending_order[i]
    pending[key] = nil
    pending_exp[key] = nil
    pending_order[i] = nil
  end
  local blocked = false
  local quota, quota_refused = 0, 0
  for i = 0, checks - 1 do
    local b = first + i * ARGS
    local alg = ARGV[b]
    local k1, k2 = KEYS[k], nil
    if alg == 's' then k2 = KEYS[k + 1]; k = k + 2 else k = k + 1 end
    local allowed, remaining, wait, value, expires = ALGORITHMS[alg](
      k1, k2, now, tonumber(ARGV[b + 1]), tonumber(ARGV[b + 2]), tonumber(ARGV[b + 3]),
      tonumber(ARGV[b + 4]), tonumber(ARGV[b + 5]), read)
    local enforce = ARGV[b + 6]
    if enforce == '1' then
      if allowed == 0 then blocked = true end
    elseif enforce == 'q' then
      quota = quota + 1
      if allowed == 0 then quota_refused = quota_refused + 1 end
    end
    if value ~= nil then
      if pending[k1] == nil then pending_order[#pending_order + 1] = k1 end
      pending[k1] = value
      pending_exp[k1] = expires
    end
    out[o + i * 3 + 1] = allowed
    out[o + i * 3 + 2] = remaining
    out[o + i * 3 + 3] = wait
  end
  if quota > 0 and quota == quota_refused then blocked = true end

  if blocked then
    -- Nothing is spent: report what the admitted checks had left before
    -- this request.
    for i = #pending_order, 1, -1 do
      pending[pending_order[i]] = nil
      pending_order[i] = nil
    end
    local kk = first_key
    for i = 0, checks - 1 do
      local b = first + i * ARGS
      local alg = ARGV[b]
      local k1, k2 = KEYS[kk], nil
      if alg == 's' then k2 = KEYS[kk + 1]; kk = kk + 2 else kk = kk + 1 end
      if out[o + i * 3 + 1] == 1 then
        local _, remaining = ALGORITHMS[alg](
          k1, k2, now, tonumber(ARGV[b + 1]), tonumber(ARGV[b + 2]), tonumber(ARGV[b + 3]),
          1, 0, read)
        out[o + i * 3 + 2] = remaining
      end
    end
  else
    for _, key in ipairs(pending_order) do
      if committed[key] == nil then committed_order[#committed_order + 1] = key end
      committed[key] = pending[key]
      committed_exp[key] = pending_exp[key]
    end
  end
  o = o + checks * 3
  a = first + checks * ARGS
end

for _, key in ipairs(committed_order) do
  -- Numbers reach Redis as integers (%.17g): µs timestamps stay exact.
  redis.call('SET', key, committed[key], 'PXAT', math.ceil(committed_exp[key] / 1000))
end
return out
