-- Token bucket as GCRA (the same integers as src/algorithm/token_bucket.rs).
-- key: the theoretical arrival time (µs); the key expires when the bucket is full.
-- Returns allowed (1/0), remaining, wait (µs), and the value to write with its
-- expiry (µs), or nil when nothing changes.

-- 100 years in µs: the longest refill (src/algorithm/mod.rs MAX_BUCKET_SPAN).
local MAX_SPAN = 3153600000000000

ALGORITHMS['t'] = function(key, _, now, limit, period, burst, cost, charge, read)
  if limit == 0 then
    return 0, 0, period
  end
  local interval = math.floor(period / limit)
  if interval < 1 then interval = 1 end
  local tolerance = interval * burst
  if tolerance > MAX_SPAN then tolerance = MAX_SPAN end
  local most = math.floor(tolerance / interval)
  local tat = read(key)
  if tat < now then tat = now end
  local function left(t)
    local l = tolerance - (t - now)
    if l < 0 then return 0 end
    return math.floor(l / interval)
  end
  if cost > most then
    return 0, left(tat), tat - now
  end
  local needed = tat + interval * cost
  if needed - now > tolerance then
    return 0, left(tat), needed - now - tolerance
  end
  -- A budget's charge may overdraw the bucket (by at most the burst).
  tat = tat + interval * charge
  if charge > 0 then
    return 1, left(tat), tat - now, tat, tat
  end
  return 1, left(tat), tat - now
end
