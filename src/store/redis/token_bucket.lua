-- Token bucket as GCRA (mirrors src/algorithm/token_bucket.rs).
-- keys[1]: the theoretical arrival time (µs); the key expires when the bucket is full.
-- Returns allowed (1/0), remaining, wait (µs), and the writes or nil.
ALGORITHMS['t'] = function(keys, now, limit, period, burst, hits, read)
  if limit == 0 then
    return 0, 0, period, nil
  end
  local interval = math.max(math.floor(period / limit), 1)
  local tolerance = interval * burst
  local tat = math.max(tonumber(read(keys[1]) or '0'), now)
  local cost = math.max(hits, 1)
  local needed = tat + interval * cost
  if needed - now > tolerance then
    local wait = needed - now - tolerance
    if cost > burst then wait = tat - now end
    return 0, math.floor(math.max(tolerance - (tat - now), 0) / interval), wait, nil
  end
  tat = tat + interval * hits
  local writes = nil
  if hits > 0 then
    writes = {{keys[1], tat, tat}}
  end
  return 1, math.floor((tolerance - (tat - now)) / interval), tat - now, writes
end
