-- Reads one counter, for a call on a Cluster slot being migrated (see
-- migration.rs): a sliding window's previous window, which may be on the
-- other node than the current one. A script of one key, so that Redis
-- serves it on whichever node holds the key (or will hold it).
--
-- KEYS[1]: the counter. Returns its value, or nil.
return redis.call('GET', KEYS[1])
