-- Sliding window counter (mirrors src/algorithm/sliding_window.rs).
-- key: this window's counter; previous_key: the previous window's counter.
-- Admitted while previous * (period - offset) / period + current + cost - 1 < limit.
-- Returns allowed (1/0), remaining, wait (µs), and the value to write with its
-- expiry (µs), or nil when nothing changes.

-- The earliest offset at which previous * (period - o) < room * period.
local function earliest(period, previous, room)
  if previous == 0 then return 0 end
  local o = period - math.floor((room * period - 1) / previous)
  if o < 0 then return 0 end
  return o
end

ALGORITHMS['s'] = function(key, previous_key, now, limit, period, _, hits, read)
  local window = math.floor(now / period)
  local offset = now - window * period
  local window_end = (window + 1) * period
  local current = read(key)
  local previous = read(previous_key)
  local cost = hits
  if cost < 1 then cost = 1 end
  local weighted = previous * (period - offset) / period
  if weighted + current + cost - 1 >= limit then
    local wait
    local room_now = limit + 1 - current - cost
    if room_now > 0 then
      local at = earliest(period, previous, room_now)
      if at < offset then at = offset end
      if at < period then wait = at - offset end
    end
    if wait == nil then
      local room = limit + 1 - cost
      wait = period - offset
      if room > 0 then wait = wait + earliest(period, current, room) end
    end
    local left = limit - math.ceil(weighted + current)
    if left < 0 then left = 0 end
    return 0, left, wait
  end
  current = current + hits
  local left = limit - math.ceil(weighted + current)
  if left < 0 then left = 0 end
  if hits > 0 then
    -- This window still counts, as the previous one, through the next window.
    return 1, left, window_end - now, current, window_end + period
  end
  return 1, left, window_end - now
end
