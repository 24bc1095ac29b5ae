-- Tollgate instances' exchange for rate limit quota (RLQS) buckets, many
-- buckets in one call: for each, record this instance's weight (the demand
-- of its Envoy clients) and what they admitted since the last exchange;
-- answer every live instance's weight added up, and what all of them
-- admitted in the current window.
--
-- KEYS[2i-1]: bucket i's hash, instance -> "weight updated_us" (weights in
--             millionths of a request per second)
-- KEYS[2i]:   bucket i's count of requests admitted in the current window
-- ARGV[1]: this instance
-- ARGV[2]: now, in microseconds
-- ARGV[3]: how old a weight may be before it no longer counts, in microseconds
-- ARGV[3i+1], ARGV[3i+2], ARGV[3i+3]: bucket i's weight from this instance,
--          requests admitted since the last exchange, and milliseconds until
--          the window's counter may go (window end + slack)
--
-- Returns {total_1, used_1, total_2, used_2, ...}. Every key gets an expiry
-- in the same call that writes it. Weights of instances that stopped (no
-- update for ARGV[3]) are removed here.
local now = tonumber(ARGV[2])
local stale = tonumber(ARGV[3])
local weights_ttl = math.floor(stale / 1000) * 2 + 1000
local out = {}
for i = 1, #KEYS / 2 do
  local weights, used_key = KEYS[2 * i - 1], KEYS[2 * i]
  local base = 3 * i
  redis.call('HSET', weights, ARGV[1], ARGV[base + 1] .. ' ' .. ARGV[2])
  redis.call('PEXPIRE', weights, weights_ttl)
  local total = 0
  local all = redis.call('HGETALL', weights)
  for j = 1, #all, 2 do
    local weight, updated = string.match(all[j + 1], '^(%d+) (%d+)$')
    if weight == nil or now - tonumber(updated) > stale then
      redis.call('HDEL', weights, all[j])
    else
      total = total + tonumber(weight)
    end
  end
  local used = redis.call('INCRBY', used_key, ARGV[base + 2])
  redis.call('PEXPIRE', used_key, ARGV[base + 3])
  out[2 * i - 1] = total
  out[2 * i] = used
end
return out
