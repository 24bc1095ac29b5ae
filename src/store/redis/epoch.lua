-- The reset epoch: a number every reset raises, so that every instance
-- forgets what it remembers of counters (its over-limit cache, its leases).
-- Instances read it with a plain GET.
-- KEYS[1]: the epoch's key.
-- Returns the epoch after the raise.
return redis.call('INCR', KEYS[1])
