-- Gives back hits committed by batch.lua, when another hash slot of the same
-- request refused it (Redis Cluster, see README "All or nothing across slots").
--
-- KEYS: one per check, the counter its hits went to (for the sliding window,
--   the current window's: the previous one is only read). A check of one
--   key is a call Redis serves on either node of a slot being migrated.
-- ARGV[1..]: three per check: algorithm ('f', 's', 't' or 'l'), hits, and
--   the interval between a token bucket's tokens or a sliding log's request
--   time (µs).
-- 'i' and 'r' (held IDs) take the ID as their third argument; 'r' has two
-- keys (see below).
-- Returns the number of keys changed. Expiries are kept (KEEPTTL).

-- A sliding log ('l') gives back its hits at the request's time (the third
-- argument, µs) from the entry of that time.
local function refund_log(key, hits, at)
  local r = redis.call('GET', key)
  if not r or hits <= 0 then return 0 end
  local ok, log = pcall(cmsgpack.unpack, r)
  if not ok or type(log) ~= 'table' then return 0 end
  for j = 1, #log - 1, 2 do
    if log[j] == at then
      local left = log[j + 1] - hits
      if left > 0 then
        log[j + 1] = left
      else
        table.remove(log, j + 1)
        table.remove(log, j)
      end
      redis.call('SET', key, cmsgpack.pack(log), 'KEEPTTL')
      return 1
    end
  end
  return 0
end

-- A held ID ('i': an in-flight slot at KEYS[k]; 'r': a reservation, whose
-- counter is KEYS[k] and held IDs KEYS[k + 1]) gives its hold back: the
-- third argument is the ID. Returns what the ID held (0: nothing).
local function unhold(key, id)
  local r = redis.call('GET', key)
  if not r then return 0 end
  local ok, held = pcall(cmsgpack.unpack, r)
  if not ok or type(held) ~= 'table' then return 0 end
  for j = 1, #held - 2, 3 do
    if held[j] == id then
      local amount = held[j + 1]
      table.remove(held, j + 2)
      table.remove(held, j + 1)
      table.remove(held, j)
      if #held == 0 then
        redis.call('DEL', key)
      else
        redis.call('SET', key, cmsgpack.pack(held), 'KEEPTTL')
      end
      return amount
    end
  end
  return 0
end

local changed = 0
local next_key = 1
for i = 1, #ARGV / 3 do
  local alg = ARGV[(i - 1) * 3 + 1]
  local hits = tonumber(ARGV[(i - 1) * 3 + 2])
  local interval = tonumber(ARGV[(i - 1) * 3 + 3])
  local key = KEYS[next_key]
  next_key = next_key + 1
  local v = nil
  if alg == 'i' then
    if unhold(key, ARGV[(i - 1) * 3 + 3]) > 0 then changed = changed + 1 end
  elseif alg == 'r' then
    local held_key = KEYS[next_key]
    next_key = next_key + 1
    local amount = unhold(held_key, ARGV[(i - 1) * 3 + 3])
    local counter = tonumber(redis.call('GET', key) or 'nil')
    if amount > 0 and counter ~= nil then
      redis.call('SET', key, string.format('%.0f', math.max(counter - amount, 0)), 'KEEPTTL')
      changed = changed + 1
    end
  elseif alg == 'l' then
    changed = changed + refund_log(key, hits, interval)
  else
    v = tonumber(redis.call('GET', key) or 'nil')
  end
  if v ~= nil and hits > 0 then
    local back = hits
    if alg == 't' then back = hits * interval end
    redis.call('SET', key, string.format('%.0f', math.max(v - back, 0)), 'KEEPTTL')
    changed = changed + 1
  end
end
return changed
