-- The reset epoch: a number every reset raises, so that every instance
-- forgets what it remembers of counters (its over-limit cache, its leases).
-- Instances read it with a plain GET.
-- KEYS[1]: the epoch's key.
-- Returns the epoch after the raise.
-- A value no script wrote (not digits, or too long for INCR) would fail
-- every reset's raise: it starts again, which every instance sees as a
-- change like any other.
local was = redis.call('GET', KEYS[1])
if was and (#was > 18 or not string.match(was, '^%d+$')) then
  redis.call('DEL', KEYS[1])
end
return redis.call('INCR', KEYS[1])
