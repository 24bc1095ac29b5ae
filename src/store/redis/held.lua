-- Held request IDs (the same integers as src/algorithm/held.rs): an
-- in-flight cap's slots ('i' takes, 'o' releases) and a fixed-window
-- budget's reservations ('r' reserves, 'e' settles).
-- A key's held IDs are one MessagePack array, three values per ID: the ID
-- (a string), what it holds (1 for a slot, the hits reserved) and when it
-- lapses (µs). Read whole with `read_held`, written whole (an empty list
-- deletes the key).
-- 'i'/'o': key: the cap's held IDs; id: the request's ID; span: how long a
--   slot is held at most (µs).
-- 'r'/'e': key: the budget's counter (this window's); held: the key of its
--   held IDs; id: the request's ID; window_end (µs); most: the most
--   reservations the key holds (in the cost's place: a reservation's cost
--   is its charge).
-- Return allowed (1/0), remaining, wait (µs), the value of `key` to write
-- with its expiry (or nil), and for 'r'/'e' the held IDs to write with
-- their expiry (or nil).

local function live(held, now, until_max)
  local kept = {}
  for j = 1, #held - 2, 3 do
    local u = held[j + 2]
    if u > now and (until_max == nil or u <= until_max) then
      kept[#kept + 1] = held[j]
      kept[#kept + 1] = held[j + 1]
      kept[#kept + 1] = u
    end
  end
  return kept
end

local function find(held, id)
  for j = 1, #held - 2, 3 do
    if held[j] == id then return j end
  end
  return nil
end

local function remove(held, j)
  table.remove(held, j + 2)
  table.remove(held, j + 1)
  table.remove(held, j)
end

local function lapses(held)
  local at = 0
  for j = 3, #held, 3 do
    if held[j] > at then at = held[j] end
  end
  return at
end

local function left(limit, used)
  if used >= limit then return 0 end
  return limit - used
end

local function in_flight(release)
  return function(key, id, now, limit, span, _, _, _, _, _, read_held)
    local stored = read_held(key)
    local held = live(stored, now)
    local pruned = #held ~= #stored
    local mine = find(held, id)
    if release then
      if mine then remove(held, mine) end
      if mine or pruned then
        return 1, left(limit, #held / 3), 0, held, lapses(held)
      end
      return 1, left(limit, #held / 3), 0
    end
    if mine or #held / 3 >= limit then
      local soonest = now
      for j = 3, #held, 3 do
        if soonest == now or held[j] < soonest then soonest = held[j] end
      end
      return 0, left(limit, #held / 3), soonest - now
    end
    held[#held + 1] = id
    held[#held + 1] = 1
    held[#held + 1] = now + span
    return 1, left(limit, #held / 3), span, held, lapses(held)
  end
end
ALGORITHMS['i'] = in_flight(false)
ALGORITHMS['o'] = in_flight(true)

local function reserved(settle)
  return function(key, held_key, now, limit, id, window_end, most, charge, read, _, read_held)
    local cost = charge
    local used = read(key)
    local stored = read_held(held_key)
    local held = live(stored, now, window_end)
    local pruned = #held ~= #stored
    local mine = find(held, id)
    local wait = window_end - now
    if not settle then
      if mine or #held / 3 >= most or cost > limit or used + cost > limit then
        return 0, left(limit, used), wait
      end
      held[#held + 1] = id
      held[#held + 1] = charge
      held[#held + 1] = window_end
      used = used + charge
      return 1, left(limit, used), wait, used, window_end, held, lapses(held)
    end
    -- Settle: `charge` is the real cost (already cut to the budget).
    local back = 0
    if mine then
      back = held[mine + 1]
      remove(held, mine)
    end
    local after = used + charge - back
    if after < 0 then after = 0 end
    local value = nil
    if after ~= used then value = after end
    if mine or pruned then
      return 1, left(limit, after), wait, value, window_end, held, lapses(held)
    end
    return 1, left(limit, after), wait, value, window_end
  end
end
ALGORITHMS['r'] = reserved(false)
ALGORITHMS['e'] = reserved(true)
