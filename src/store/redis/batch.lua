-- One request's checks, decided together: all or nothing.
--
-- KEYS: each check's keys in order (sliding window: current then previous
--       window; fixed window and token bucket: one key).
-- ARGV[1]: now, in microseconds since the epoch (the caller's clock: key
--          names carry the window number, so the caller must know it).
-- ARGV[2..]: seven per check:
--   algorithm ('f', 's' or 't'),
--   limit,
--   windows: the window's first µs; token bucket: the period (µs),
--   windows: the window's end (µs);  token bucket: the burst,
--   cost (admission needs room for this many; at least 1),
--   charge (admission spends this many; 0 for a check),
--   enforcement: '1' enforced, '0' shadow (never blocks), 'q' quota mode
--   (blocks only when every 'q' check of the call is refused), 'Q' quota
--   mode decided by the caller (never blocks here; Cluster, across slots).
-- Windows are computed by the caller (calendar months, multiples of a unit);
-- key names already carry the window number.
-- Returns three integers per check, flat: allowed (1/0), remaining, wait (µs).
--
-- Every write is SET ... PXAT: the value and its expiry in one command, so a
-- counter without an expiry cannot exist, even for an instant. Nothing is
-- written when the request is refused.
--
-- Written for Redis's per-call cost: no closures or tables per check beyond
-- the result and the pending writes.

local now = tonumber(ARGV[1])
local ARGS = 7
local checks = (#ARGV - 1) / ARGS

-- Pending writes: key -> value, in order (a key may appear twice in a
-- request; the later check must see the earlier one's hits).
local pending = {}
local order = {}
local function read(key)
  local v = pending[key]
  if v ~= nil then return v end
  return tonumber(redis.call('GET', key) or 0)
end

local out = {}
local blocked = false
local quota, quota_refused = 0, 0
local k = 1
for i = 0, checks - 1 do
  local b = 2 + i * ARGS
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
    if pending[k1] == nil then order[#order + 1] = k1 end
    pending[k1] = value
    pending[k1 .. '\0exp'] = expires
  end
  out[i * 3 + 1] = allowed
  out[i * 3 + 2] = remaining
  out[i * 3 + 3] = wait
end
if quota > 0 and quota == quota_refused then blocked = true end

if blocked then
  -- Nothing is spent: report what the admitted checks had left before this request.
  pending = {}
  k = 1
  for i = 0, checks - 1 do
    local b = 2 + i * ARGS
    local alg = ARGV[b]
    local k1, k2 = KEYS[k], nil
    if alg == 's' then k2 = KEYS[k + 1]; k = k + 2 else k = k + 1 end
    if out[i * 3 + 1] == 1 then
      local _, remaining = ALGORITHMS[alg](
        k1, k2, now, tonumber(ARGV[b + 1]), tonumber(ARGV[b + 2]), tonumber(ARGV[b + 3]),
        1, 0, read)
      out[i * 3 + 2] = remaining
    end
  end
else
  for _, key in ipairs(order) do
    -- Numbers reach Redis as integers (%.17g): µs timestamps stay exact.
    redis.call('SET', key, pending[key], 'PXAT', math.ceil(pending[key .. '\0exp'] / 1000))
  end
end
return out
