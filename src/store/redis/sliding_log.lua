-- Sliding log (the same integers as src/algorithm/sliding_log.rs).
-- key: the log, one MessagePack array of integers: each admitted request's
-- time (µs) and hits, oldest first, one entry per time ({at1, hits1, at2,
-- hits2, ...}). An entry counts while at + period > now.
-- Returns allowed (1/0), remaining, wait (µs), and the log to write (a
-- table) with its expiry (µs), or nil when nothing changes.

ALGORITHMS['l'] = function(key, _, now, limit, period, _, cost, charge, _, read_log)
  local log = read_log(key)
  local n = #log
  local first = 1
  while first <= n and log[first] + period <= now do first = first + 2 end
  local used = 0
  for i = first, n, 2 do used = used + log[i + 1] end
  local function left(u)
    if u >= limit then return 0 end
    return limit - u
  end
  if cost > limit then return 0, left(used), period end
  if used + cost > limit then
    -- The first moment enough of the oldest hits have left.
    local excess = used + cost - limit
    local freed = 0
    for i = first, n, 2 do
      freed = freed + log[i + 1]
      if freed >= excess then
        local wait = log[i] + period - now
        if wait < 0 then wait = 0 end
        return 0, left(used), wait
      end
    end
    return 0, left(used), period
  end
  -- A budget's charge may pass the limit (by at most the limit).
  used = used + charge
  local oldest = now
  if first <= n then oldest = log[first] end
  if charge > 0 and oldest > now then oldest = now end
  local wait = oldest + period - now
  if wait < 0 then wait = 0 end
  if charge == 0 then return 1, left(used), wait end
  -- The live entries, with this request's hits in time order.
  local out, placed = {}, false
  for i = first, n, 2 do
    local at = log[i]
    if not placed and at > now then
      out[#out + 1] = now
      out[#out + 1] = charge
      placed = true
    end
    out[#out + 1] = at
    out[#out + 1] = log[i + 1]
    if not placed and at == now then
      out[#out] = log[i + 1] + charge
      placed = true
    end
  end
  if not placed then
    out[#out + 1] = now
    out[#out + 1] = charge
  end
  local newest = out[#out - 1]
  if newest < now then newest = now end
  return 1, left(used), wait, out, newest + period
end
