-- Takes back what a batch call committed, for a caller that stopped waiting
-- for its answer (a timeout, a dropped connection): the request was answered
-- from the failure modes, so it must spend nothing. See batch.lua's receipt.
--
-- KEYS: the call's keys, its receipt last (sent on the same connection after
-- the call, so it runs after the call if the call runs at all).
-- ARGV[1]: how long (ms) the cancellation stands, for a call still to come.
-- Returns the number of keys given back.

local receipt = KEYS[#KEYS]
local was = redis.call('GET', receipt)
redis.call('SET', receipt, 'x', 'PX', ARGV[1])
if not was or was == 'x' then return 0 end
local undo = cmsgpack.unpack(was)
local changed = 0
for i = 1, #undo, 2 do
  local key = KEYS[undo[i]]
  local v = tonumber(redis.call('GET', key) or 'nil')
  if v ~= nil and undo[i + 1] > 0 then
    redis.call('SET', key, string.format('%.0f', math.max(v - undo[i + 1], 0)), 'KEEPTTL')
    changed = changed + 1
  end
end
return changed
