-- Fixed window (mirrors src/algorithm/fixed_window.rs).
-- keys[1]: the counter of the current window (its name holds the window number).
-- Returns allowed (1/0), remaining, wait (µs), and the writes {key, value, expire_at_us} or nil.
ALGORITHMS['f'] = function(keys, now, limit, period, burst, hits, read)
  local window = math.floor(now / period)
  local window_end = (window + 1) * period
  local used = tonumber(read(keys[1]) or '0')
  local cost = math.max(hits, 1)
  if used + cost > limit then
    return 0, math.max(limit - used, 0), window_end - now, nil
  end
  used = used + hits
  local writes = nil
  if hits > 0 then
    writes = {{keys[1], used, window_end}}
  end
  return 1, limit - used, window_end - now, writes
end
