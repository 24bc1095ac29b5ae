-- Fixed window (the same integers as src/algorithm/fixed_window.rs).
-- key: the counter of the current window (its name holds the window number).
-- Times in µs; the caller gives the window's end. Returns allowed (1/0),
-- remaining, wait (µs), and the value to write with its expiry (µs), or nil
-- when nothing changes.
ALGORITHMS['f'] = function(key, _, now, limit, _, window_end, cost, charge, read)
  local used = read(key)
  -- A cost above the limit is refused before any sum (hits may be ~2^64).
  if cost > limit or used + cost > limit then
    local left = limit - used
    if left < 0 then left = 0 end
    return 0, left, window_end - now
  end
  -- A budget's charge may pass the limit (by at most the limit).
  used = used + charge
  local left = limit - used
  if left < 0 then left = 0 end
  if charge > 0 then
    return 1, left, window_end - now, used, window_end
  end
  return 1, left, window_end - now
end
