-- Resets counters: deletes them (an operator's POST /counters/reset).
-- KEYS: the counters, all of one hash slot (one call is atomic).
-- ARGV: none.
-- Returns the number of keys that existed.
return redis.call('DEL', unpack(KEYS))
