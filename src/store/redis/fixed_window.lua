-- Fixed window (the same integers as src/algorithm/fixed_window.rs).
-- key: the counter of the current window (its name holds the window number).
-- Times in µs. Returns allowed (1/0), remaining, wait (µs), and the value to
-- write with its expiry (µs), or nil when nothing changes.
ALGORITHMS['f'] = function(key, _, now, limit, period, _, hits, read)
  local window_end = (math.floor(now / period) + 1) * period
  local used = read(key)
  local cost = hits
  if cost < 1 then cost = 1 end
  -- A cost above the limit is refused before any sum (hits may be ~2^64).
  if cost > limit or used + cost > limit then
    local left = limit - used
    if left < 0 then left = 0 end
    return 0, left, window_end - now
  end
  used = used + hits
  if hits > 0 then
    return 1, limit - used, window_end - now, used, window_end
  end
  return 1, limit - used, window_end - now
end
