-- One request's checks, decided together: all or nothing.
--
-- KEYS: each check's keys in order (sliding window: current then previous
--       window; fixed window and token bucket: one key).
-- ARGV[1]: now, in microseconds since the epoch (the caller's clock: key
--          names carry the window number, so the caller must know it).
-- ARGV[2..]: six per check: algorithm ('f', 's' or 't'), limit, period (µs),
--          burst, hits, enforced (1, or 0 in shadow mode).
-- Returns one {allowed, remaining, wait_us} per check.
--
-- Every write is SET ... PXAT: the value and its expiry in one command, so a
-- counter without an expiry cannot exist, even for an instant. Nothing is
-- written when an enforced check is denied.

local now = tonumber(ARGV[1])
local overlay = {}
local function read(key)
  local v = overlay[key]
  if v ~= nil then return v end
  return redis.call('GET', key)
end

local results, writes, specs = {}, {}, {}
local blocked = false
local next_key = 1
local checks = (#ARGV - 1) / 6
for i = 1, checks do
  local base = 2 + (i - 1) * 6
  local spec = {
    alg = ARGV[base],
    limit = tonumber(ARGV[base + 1]),
    period = tonumber(ARGV[base + 2]),
    burst = tonumber(ARGV[base + 3]),
    keys = {},
  }
  local hits = tonumber(ARGV[base + 4])
  local enforced = ARGV[base + 5] == '1'
  local nkeys = 1
  if spec.alg == 's' then nkeys = 2 end
  for j = 1, nkeys do
    spec.keys[j] = KEYS[next_key]
    next_key = next_key + 1
  end
  local allowed, remaining, wait, w =
    ALGORITHMS[spec.alg](spec.keys, now, spec.limit, spec.period, spec.burst, hits, read)
  if allowed == 0 and enforced then blocked = true end
  if w then
    for _, write in ipairs(w) do
      overlay[write[1]] = write[2]
      writes[#writes + 1] = write
    end
  end
  results[i] = {allowed, remaining, wait}
  specs[i] = spec
end

if blocked then
  -- Nothing is spent: report what the admitted checks had left before this request.
  overlay = {}
  for i, r in ipairs(results) do
    if r[1] == 1 then
      local s = specs[i]
      local _, remaining = ALGORITHMS[s.alg](s.keys, now, s.limit, s.period, s.burst, 0, read)
      r[2] = remaining
    end
  end
else
  for _, w in ipairs(writes) do
    redis.call('SET', w[1], string.format('%.0f', w[2]), 'PXAT', string.format('%.0f', math.ceil(w[3] / 1000)))
  end
end
return results
