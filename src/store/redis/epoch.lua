-- The reset epoch: a number every reset raises, so that every instance
-- forgets what it remembers of counters (its over-limit cache, its leases).
-- KEYS[1]: the epoch's key.
-- ARGV[1]: 'bump' (after a reset) or 'read'.
-- Returns the epoch (0 before the first reset).
if ARGV[1] == 'bump' then
  return redis.call('INCR', KEYS[1])
end
return tonumber(redis.call('GET', KEYS[1]) or '0')
