-- The view of who is being limited, one field per Tollgate instance.
-- KEYS[1]: the hash of views.
-- ARGV: 'put', the instance, its view (JSON), how long the hash lives (ms);
--       or 'get'.
-- Returns 1 for 'put'; every field and value for 'get'.
if ARGV[1] == 'put' then
  redis.call('HSET', KEYS[1], ARGV[2], ARGV[3])
  redis.call('PEXPIRE', KEYS[1], ARGV[4])
  return 1
end
return redis.call('HGETALL', KEYS[1])
