-- Token bucket as GCRA (mirrors src/algorithm/token_bucket.rs).
-- key: the theoretical arrival time (µs); the key expires when the bucket is full.
-- Returns allowed (1/0), remaining, wait (µs), and the value to write with its
-- expiry (µs), or nil when nothing changes.
ALGORITHMS['t'] = function(key, _, now, limit, period, burst, hits, read)
  if limit == 0 then
    return 0, 0, period
  end
  local interval = math.floor(period / limit)
  if interval < 1 then interval = 1 end
  local tolerance = interval * burst
  local tat = read(key)
  if tat < now then tat = now end
  local cost = hits
  if cost < 1 then cost = 1 end
  local needed = tat + interval * cost
  if needed - now > tolerance then
    local wait = needed - now - tolerance
    if cost > burst then wait = tat - now end
    local left = tolerance - (tat - now)
    if left < 0 then left = 0 end
    return 0, math.floor(left / interval), wait
  end
  tat = tat + interval * hits
  local left = math.floor((tolerance - (tat - now)) / interval)
  if hits > 0 then
    return 1, left, tat - now, tat, tat
  end
  return 1, left, tat - now
end
