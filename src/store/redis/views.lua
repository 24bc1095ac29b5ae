-- The view of who is being limited, one field per Tollgate instance, and
-- when Redis last heard from each (Redis's own clock, so no instance's
-- clock, right or wrong, decides what is recent).
-- KEYS[1]: the hash of views; KEYS[2]: the hash of when each was written
--          (ms); both in one slot.
-- ARGV: 'put', the instance, its view (JSON), how long a view lives (ms),
--       the largest view accepted (bytes);
--       or 'get', how long a view lives (ms), the largest view read
--       (bytes), the most views read.
-- 'put' returns 1, or 0 for a view above the bound (not written); it also
-- drops the views of instances that stopped writing. 'get' returns the
-- live views, field and value, never one above the bound, at most the
-- most asked: a view is data from another process.
local now = redis.call('TIME')
local ms = tonumber(now[1]) * 1000 + math.floor(tonumber(now[2]) / 1000)
local function live(at, keep)
  at = tonumber(at)
  return at ~= nil and at <= ms and ms - at <= keep
end
if ARGV[1] == 'put' then
  local keep = tonumber(ARGV[4])
  if #ARGV[3] > tonumber(ARGV[5]) then
    return 0
  end
  redis.call('HSET', KEYS[1], ARGV[2], ARGV[3])
  redis.call('HSET', KEYS[2], ARGV[2], ms)
  local written = redis.call('HGETALL', KEYS[2])
  for i = 1, #written, 2 do
    if not live(written[i + 1], keep) then
      redis.call('HDEL', KEYS[1], written[i])
      redis.call('HDEL', KEYS[2], written[i])
    end
  end
  redis.call('PEXPIRE', KEYS[1], keep)
  redis.call('PEXPIRE', KEYS[2], keep)
  return 1
end
local keep, max_bytes, max_views = tonumber(ARGV[2]), tonumber(ARGV[3]), tonumber(ARGV[4])
local out = {}
local written = redis.call('HGETALL', KEYS[2])
for i = 1, #written, 2 do
  if #out >= 2 * max_views then
    break
  end
  local name = written[i]
  if live(written[i + 1], keep) and redis.call('HSTRLEN', KEYS[1], name) <= max_bytes then
    local view = redis.call('HGET', KEYS[1], name)
    if view then
      out[#out + 1] = name
      out[#out + 1] = view
    end
  end
end
return out
