-- Gives back hits committed by batch.lua, when another hash slot of the same
-- request refused it (Redis Cluster, see README "All or nothing across slots").
--
-- KEYS: one per check, the counter its hits went to (for the sliding window,
--   the current window's: the previous one is only read). A check of one
--   key is a call Redis serves on either node of a slot being migrated.
-- ARGV[1..]: three per check: algorithm ('f', 's' or 't'), hits, interval (µs, token bucket).
-- Returns the number of keys changed. Expiries are kept (KEEPTTL).

local changed = 0
local next_key = 1
for i = 1, #ARGV / 3 do
  local alg = ARGV[(i - 1) * 3 + 1]
  local hits = tonumber(ARGV[(i - 1) * 3 + 2])
  local interval = tonumber(ARGV[(i - 1) * 3 + 3])
  local key = KEYS[next_key]
  next_key = next_key + 1
  local v = tonumber(redis.call('GET', key) or 'nil')
  if v ~= nil and hits > 0 then
    local back = hits
    if alg == 't' then back = hits * interval end
    redis.call('SET', key, string.format('%.0f', math.max(v - back, 0)), 'KEEPTTL')
    changed = changed + 1
  end
end
return changed
