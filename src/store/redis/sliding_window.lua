-- Sliding window counter (mirrors src/algorithm/sliding_window.rs).
-- keys[1]: this window's counter, keys[2]: the previous window's counter.
-- Admitted while previous * (period - offset) / period + current + cost - 1 < limit.
-- Returns allowed (1/0), remaining, wait (µs), and the writes or nil.
ALGORITHMS['s'] = function(keys, now, limit, period, burst, hits, read)
  local window = math.floor(now / period)
  local offset = now - window * period
  local window_end = (window + 1) * period
  local current = tonumber(read(keys[1]) or '0')
  local previous = tonumber(read(keys[2]) or '0')
  local cost = math.max(hits, 1)
  local weighted = previous * (period - offset) / period
  local function remaining(count)
    return math.max(limit - math.ceil(weighted + count), 0)
  end
  if weighted + current + cost - 1 >= limit then
    -- The earliest offset at which previous * (period - o) < room * period.
    local function earliest(prev, room)
      if prev == 0 then return 0 end
      return math.max(period - math.floor((room * period - 1) / prev), 0)
    end
    local wait
    local room_now = limit + 1 - current - cost
    if room_now > 0 then
      local at = math.max(earliest(previous, room_now), offset)
      if at < period then wait = at - offset end
    end
    if wait == nil then
      local room = limit + 1 - cost
      wait = period - offset
      if room > 0 then wait = wait + earliest(current, room) end
    end
    return 0, remaining(current), wait, nil
  end
  current = current + hits
  local writes = nil
  if hits > 0 then
    -- This window still counts, as the previous one, through the next window.
    writes = {{keys[1], current, window_end + period}}
  end
  return 1, remaining(current), window_end - now, writes
end
