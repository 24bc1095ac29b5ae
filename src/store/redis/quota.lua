-- One Tollgate instance's exchange for one rate limit quota (RLQS) bucket:
-- record this instance's weight (the demand of its Envoy clients) and what
-- they admitted since the last exchange; answer every live instance's
-- weight added up, and what all of them admitted in the current window.
--
-- KEYS[1]: hash, instance -> "weight updated_us" (weights in millionths)
-- KEYS[2]: admitted in the current window
-- ARGV[1]: this instance
-- ARGV[2]: its weight, in millionths of a request per second
-- ARGV[3]: now, in microseconds
-- ARGV[4]: how old a weight may be before it no longer counts, in microseconds
-- ARGV[5]: requests admitted since the last exchange
-- ARGV[6]: milliseconds until the window's counter may go (window end + slack)
--
-- Every key gets an expiry in the same call that writes it. Weights of
-- instances that stopped (no update for ARGV[4]) are removed here.
local now = tonumber(ARGV[3])
local stale = tonumber(ARGV[4])
redis.call('HSET', KEYS[1], ARGV[1], ARGV[2] .. ' ' .. ARGV[3])
redis.call('PEXPIRE', KEYS[1], math.floor(stale / 1000) * 2 + 1000)
local total = 0
local all = redis.call('HGETALL', KEYS[1])
for i = 1, #all, 2 do
  local weight, updated = string.match(all[i + 1], '^(%d+) (%d+)$')
  if weight == nil or now - tonumber(updated) > stale then
    redis.call('HDEL', KEYS[1], all[i])
  else
    total = total + tonumber(weight)
  end
end
local used = redis.call('INCRBY', KEYS[2], ARGV[5])
redis.call('PEXPIRE', KEYS[2], ARGV[6])
return {total, used}
