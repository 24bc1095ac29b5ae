-- Sliding window counter (the same integers as src/algorithm/sliding_window.rs).
-- key: this window's counter; previous_key: the previous window's counter.
-- The caller gives the window's start and end (µs).
-- The window is cut into n <= 2^19 steps of `step` µs; after e whole steps the
-- previous window weighs (n - e) / n. Admitted while
--   previous * (n - e) + (current + cost - 1) * n < limit * n.
-- Every product stays below 2^53, where doubles hold integers exactly.
-- Returns allowed (1/0), remaining, wait (µs), and the value to write with its
-- expiry (µs), or nil when nothing changes.

local MAX_STEPS = 524288

-- The first step at which previous * (n - e) < room * n (at most n).
local function earliest(previous, room, n)
  if previous == 0 then return 0 end
  local e = n - math.floor((room * n - 1) / previous)
  if e < 0 then return 0 end
  return e
end

-- Steps by period: a call decides many requests over a few periods.
local STEPS = {}

ALGORITHMS['s'] = function(key, previous_key, now, limit, window_start, window_end, cost, charge, read)
  local period = window_end - window_start
  local step = STEPS[period]
  if step == nil then
    step = 1
    while math.ceil(period / step) > MAX_STEPS do step = step * 10 end
    STEPS[period] = step
  end
  local n = math.ceil(period / step)
  local offset = now - window_start
  local elapsed = math.floor(offset / step)
  local current = read(key)
  local previous = read(previous_key)
  local weighted = previous * (n - elapsed)
  if cost > limit or weighted + (current + cost - 1) * n >= limit * n then
    local wait
    if cost > limit then
      wait = period - offset
    else
      local room_now = limit + 1 - current - cost
      if room_now > 0 then
        local at = earliest(previous, room_now, n) * step
        if at < period then
          wait = at - offset
          if wait < 0 then wait = 0 end
        end
      end
      if wait == nil then
        local at = earliest(current, limit + 1 - cost, n) * step
        if at > period then at = period end
        wait = period - offset + at
      end
    end
    local left = limit - math.ceil((weighted + current * n) / n)
    if left < 0 then left = 0 end
    return 0, left, wait
  end
  -- A budget's charge may pass the limit (by at most the limit).
  current = current + charge
  local left = limit - math.ceil((weighted + current * n) / n)
  if left < 0 then left = 0 end
  if charge > 0 then
    -- This window still counts, as the previous one, through the next window.
    return 1, left, window_end - now, current, window_end + period
  end
  return 1, left, window_end - now
end
