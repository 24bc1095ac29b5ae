-- Requests decided together in one call, in order; each all or nothing.
--
-- Concurrent requests waiting on one connection are coalesced into one call
-- (see coalesce.rs): a script call costs Redis far more than the limiting
-- logic, so one call for many requests is what makes Redis fast.
--
-- KEYS: every key the call reads or writes, each once.
-- ARGV[1]: one MessagePack array of integers (see msgpack.rs: one argument
--   parsed in C, not a string per number): the number of requests, then per
--   request:
--   the number of checks,
--   now, in microseconds since the epoch (the caller's clock: key names
--   carry the window number, so the caller must know it),
--   and nine per check:
--   algorithm (the byte 'f', 's', 't' or 'l'),
--   the key's index in KEYS,
--   sliding window: the previous window's key's index in KEYS (else 0),
--   limit,
--   windows: the window's first µs; token bucket and sliding log: the
--   period (µs),
--   windows: the window's end (µs);  token bucket: the burst (else 0),
--   cost (admission needs room for this many; at least 1),
--   charge (admission spends this many; 0 for a check),
--   enforcement (a byte): '1' enforced, '0' shadow (never blocks), 'q' quota
--   mode (blocks only when every 'q' check of the request is refused), 'Q'
--   quota mode decided by the caller (never blocks here; Cluster, across
--   slots).
-- Windows are computed by the caller (calendar months, multiples of a unit);
-- key names already carry the window number.
-- ARGV[2]: the lifetime (ms) of the call's receipt, whose key is the last of
--   KEYS (in the call's slot). When the call commits anything, the receipt
--   records what (key index, amount added, ...), so that a caller who gave
--   up waiting can take it back (cancel.lua); a receipt that holds 'x' says
--   the caller cancelled before the call ran, and the call commits nothing.
--   Empty: no receipt (a call on a Cluster slot being migrated, where a key
--   that exists on neither node would make Redis refuse the call; see
--   migration.rs).
-- ARGV[3] (optional): one MessagePack array of values that stand for keys
--   #KEYS + 1, #KEYS + 2, ...: counters read before the call (a sliding
--   window's previous window, on a slot being migrated).
-- Returns one MessagePack array: three integers per check, in order: allowed
-- (1/0), remaining, wait (µs).
--
-- A later request sees what the earlier ones of the call spent, exactly as
-- if each had been a call of its own. A key is created only by SET ... PXAT:
-- the value and its expiry in one command, so a counter without an expiry
-- cannot exist, even for an instant. A window counter that exists already
-- carries the expiry its window fixes, and is only INCRBY'd (which keeps
-- it); a token bucket's expiry moves with its value, so it is always SET.
-- Nothing is written for a refused request. A sliding log ('l') is a
-- MessagePack array, read and written whole (SET ... PXAT); it has no
-- receipt entry: a call cancelled late leaves its hits in the log, on the
-- side of refusing (the log never admits more than its limit).
--
-- Written for Redis's per-call cost: one MGET for every key of the call, no
-- closures per check.

local FIELDS = 9
local ALG = {}
for code, decide in pairs(ALGORITHMS) do ALG[string.byte(code)] = decide end
local ENFORCED, QUOTA, TOKEN = string.byte('1'), string.byte('q'), string.byte('t')
local input = cmsgpack.unpack(ARGV[1])
local receipt_ttl = ARGV[2]
local receipt = nil
if receipt_ttl and receipt_ttl ~= '' then receipt = #KEYS end
local receipt_was = false

-- What the call has committed so far (key -> value and expiry, in order),
-- what the current request would commit, and what Redis held before the
-- call. The pending tables are emptied, not made anew, for each request.
-- Keys are their indices in KEYS here (the algorithms only hand them to
-- `read`): tables indexed 1..n live in Lua's array part, without hashing.
local committed, committed_exp, committed_order = {}, {}, {}
local pending, pending_exp, pending_order = {}, {}, {}
-- Every key the call may read, in one MGET: one redis.call per call
-- instead of one per key (a call from Lua costs more than the read itself).
-- `raw`: what Redis holds, as it holds it, for keys that hold a number.
local stored, raw, blob = {}, {}, {}
-- unpack() is bounded by Lua's stack (8,000 values): slices.
for from = 1, #KEYS, 4000 do
  local to = math.min(#KEYS, from + 3999)
  local values = redis.call('MGET', unpack(KEYS, from, to))
  for i = from, to do
    local r = values[i - from + 1]
    local v = tonumber(r or 'nil')
    stored[i] = v or 0
    if v ~= nil then raw[i] = r elseif r then blob[i] = r end
  end
  if receipt and to == #KEYS then receipt_was = values[to - from + 1] end
end
if ARGV[3] then
  for i, v in ipairs(cmsgpack.unpack(ARGV[3])) do stored[#KEYS + i] = v end
end
-- Cancelled by its caller before it ran: nobody waits for the answer.
if receipt_was == 'x' then return cmsgpack.pack({}) end
-- Keys of window counters (fixed and sliding window): their expiry follows
-- from their name (the window), so once written it never changes.
local windowed = {}
local function read(key)
  local v = pending[key]
  if v ~= nil then return v end
  v = committed[key]
  if v ~= nil then return v end
  return stored[key] or 0
end

-- A sliding log, decoded once per call: what this call wrote, else what
-- Redis holds. Anything but what Tollgate writes (a MessagePack array of
-- pairs of whole numbers: times below 2^53 µs in order, hits from 1 to
-- 2^32) is read as an empty log: a value no script wrote must not fail the
-- call (everyone's requests in it), nor count as infinite or negative hits.
local logs = {}
local EXACT_US, MAX_HITS = 9007199254740992, 4294967295
local function read_log(key)
  local v = pending[key]
  if v ~= nil then return v end
  v = committed[key]
  if v ~= nil then return v end
  v = logs[key]
  if v == nil then
    v = {}
    local r = blob[key]
    if r then
      local ok, t = pcall(cmsgpack.unpack, r)
      if ok and type(t) == 'table' and #t % 2 == 0 then
        local valid, last = true, 0
        for i = 1, #t, 2 do
          local at, hits = t[i], t[i + 1]
          if type(at) ~= 'number' or type(hits) ~= 'number'
            or at ~= math.floor(at) or at < last or at >= EXACT_US
            or hits ~= math.floor(hits) or hits < 1 or hits > MAX_HITS then
            valid = false
            break
          end
          last = at
        end
        if valid then v = t end
      end
    end
    logs[key] = v
  end
  return v
end

-- Held request IDs (held.lua), decoded once per call like a log: what
-- this call wrote, else what Redis holds. Anything but triples of a string,
-- a whole number from 0 to 2^32 and a time below 2^53 µs reads as none.
local helds = {}
local function read_held(key)
  local v = pending[key]
  if v ~= nil then return v end
  v = committed[key]
  if v ~= nil then return v end
  v = helds[key]
  if v == nil then
    v = {}
    local r = blob[key]
    if r then
      local ok, t = pcall(cmsgpack.unpack, r)
      if ok and type(t) == 'table' and #t % 3 == 0 then
        local valid = true
        for i = 1, #t, 3 do
          local id, n, u = t[i], t[i + 1], t[i + 2]
          if type(id) ~= 'string' or type(n) ~= 'number' or type(u) ~= 'number'
            or n ~= math.floor(n) or n < 0 or n > MAX_HITS
            or u ~= math.floor(u) or u < 0 or u >= EXACT_US then
            valid = false
            break
          end
        end
        if valid then v = t end
      end
    end
    helds[key] = v
  end
  return v
end

-- Codes whose call also writes its second key (a budget's held IDs), and
-- codes that report what already happened (a release, a settlement): those
-- are applied whatever the request's other checks decide.
local SECOND = {[string.byte('r')] = true, [string.byte('e')] = true}
local AFTER = {[string.byte('o')] = true, [string.byte('e')] = true}
-- Codes that hold (a slot taken, a reservation made): a refused request
-- does not ask them again for what was left (asking takes or reserves), and
-- reports their rows as decided.
local HOLDS = {[string.byte('i')] = true, [string.byte('r')] = true}
-- Counters a reservation wrote: never in the call's receipt, since taking
-- the hits back would leave the reservation to be refunded once more.
local no_undo = {}

local function commit(key, value, expires)
  if committed[key] == nil then committed_order[#committed_order + 1] = key end
  committed[key] = value
  committed_exp[key] = expires
end

local out = {}
-- A request of several checks, its rows at out[o + 1 ...]: all or nothing,
-- so what it would write is held in `pending` until every check is decided.
local function several(first, checks, now, o)
  for i = #pending_order, 1, -1 do
    local key = pending_order[i]
    pending[key] = nil
    pending_exp[key] = nil
    pending_order[i] = nil
  end
  local blocked = false
  local quota, quota_refused = 0, 0
  for i = 0, checks - 1 do
    local b = first + i * FIELDS
    local k1 = input[b + 1]
    local allowed, remaining, wait, value, expires, value2, expires2 = ALG[input[b]](
      k1, input[b + 2], now, input[b + 3], input[b + 4], input[b + 5], input[b + 6],
      input[b + 7], read, read_log, read_held)
    local enforce = input[b + 8]
    if value2 ~= nil then
      local k2 = input[b + 2]
      if pending[k2] == nil then pending_order[#pending_order + 1] = k2 end
      pending[k2] = value2
      pending_exp[k2] = expires2
    end
    if SECOND[input[b]] then no_undo[k1] = true end
    if enforce == ENFORCED then
      if allowed == 0 then blocked = true end
    elseif enforce == QUOTA then
      quota = quota + 1
      if allowed == 0 then quota_refused = quota_refused + 1 end
    end
    if value ~= nil then
      if pending[k1] == nil then pending_order[#pending_order + 1] = k1 end
      pending[k1] = value
      pending_exp[k1] = expires
      if input[b] ~= TOKEN then windowed[k1] = true end
    end
    out[o + i * 3 + 1] = allowed
    out[o + i * 3 + 2] = remaining
    out[o + i * 3 + 3] = wait
  end
  if quota > 0 and quota == quota_refused then blocked = true end

  if blocked then
    -- Nothing is spent: report what the admitted checks had left before
    -- this request.
    for i = #pending_order, 1, -1 do
      pending[pending_order[i]] = nil
      pending_order[i] = nil
    end
    for i = 0, checks - 1 do
      if out[o + i * 3 + 1] == 1 then
        local b = first + i * FIELDS
        if not AFTER[input[b]] and not HOLDS[input[b]] then
          local _, remaining = ALG[input[b]](
            input[b + 1], input[b + 2], now, input[b + 3], input[b + 4], input[b + 5],
            1, 0, read, read_log, read_held)
          out[o + i * 3 + 2] = remaining
        end
      end
    end
    -- What already happened is applied alone, in order.
    for i = 0, checks - 1 do
      local b = first + i * FIELDS
      if AFTER[input[b]] then
        local allowed, remaining, wait, value, expires, value2, expires2 = ALG[input[b]](
          input[b + 1], input[b + 2], now, input[b + 3], input[b + 4], input[b + 5],
          input[b + 6], input[b + 7], read, read_log, read_held)
        if value ~= nil then commit(input[b + 1], value, expires) end
        if value2 ~= nil then commit(input[b + 2], value2, expires2) end
        if SECOND[input[b]] then no_undo[input[b + 1]] = true end
        out[o + i * 3 + 1] = allowed
        out[o + i * 3 + 2] = remaining
        out[o + i * 3 + 3] = wait
      end
    end
  else
    for _, key in ipairs(pending_order) do
      commit(key, pending[key], pending_exp[key])
    end
  end
  -- `read` looks at `pending` first: left behind, this request's values
  -- would hide what later one-check requests of the call commit (each
  -- would count from the same stale value, and hits would be lost).
  for i = #pending_order, 1, -1 do
    local key = pending_order[i]
    pending[key] = nil
    pending_exp[key] = nil
    pending_order[i] = nil
  end
end

local o = 0
local a = 2
for _ = 1, input[1] do
  local checks = input[a]
  local now = input[a + 1]
  local first = a + 2
  if checks == 1 then
    -- One check (one descriptor, one limit: most requests). A refused
    -- check writes nothing (no value), so there is nothing to hold back or
    -- undo: what it would write is committed at once.
    local allowed, remaining, wait, value, expires, value2, expires2 = ALG[input[first]](
      input[first + 1], input[first + 2], now, input[first + 3], input[first + 4],
      input[first + 5], input[first + 6], input[first + 7], read, read_log, read_held)
    if value ~= nil then
      commit(input[first + 1], value, expires)
      if input[first] ~= TOKEN then windowed[input[first + 1]] = true end
    end
    if value2 ~= nil then commit(input[first + 2], value2, expires2) end
    if SECOND[input[first]] then no_undo[input[first + 1]] = true end
    out[o + 1] = allowed
    out[o + 2] = remaining
    out[o + 3] = wait
  else
    several(first, checks, now, o)
  end
  o = o + checks * 3
  a = first + checks * FIELDS
end

-- Numbers go to Redis as integer strings: a Lua number given to redis.call
-- is printed with '%.17g', which costs several times more. Below 2^53 every
-- value here is an integer held exactly (counters, µs timestamps); anything
-- larger is left to '%.17g'.
local EXACT = 9007199254740992
local function integer(n)
  if n < EXACT and n > -EXACT then return string.format('%d', n) end
  return n
end
local undo = {}
for _, key in ipairs(committed_order) do
  local value = committed[key]
  local was = stored[key]
  if type(value) == 'table' and #value == 0 then
    redis.call('DEL', KEYS[key])
  elseif type(value) == 'table' then
    redis.call('SET', KEYS[key], cmsgpack.pack(value), 'PXAT',
      integer(math.ceil(committed_exp[key] / 1000)))
  else
    if windowed[key] and value < EXACT and raw[key] == integer(was) then
      -- A window counter that exists already has the expiry its window
      -- gives it (every write of a new key sets it, below): INCRBY keeps
      -- it, and costs Redis about 60 % of a SET with PXAT on a key out of
      -- the cache. Only on a value written as Tollgate writes integers:
      -- Lua reads more as numbers than INCRBY takes (' 7', '0x10', '1e3',
      -- '7.5'), and an INCRBY error would fail the whole call, everyone's
      -- requests in it.
      redis.call('INCRBY', KEYS[key], integer(value - was))
    else
      redis.call('SET', KEYS[key], integer(value), 'PXAT',
        integer(math.ceil(committed_exp[key] / 1000)))
    end
    if not no_undo[key] then
      undo[#undo + 1] = key
      undo[#undo + 1] = value - was
    end
  end
end
if receipt and #undo > 0 then
  redis.call('SET', KEYS[receipt], cmsgpack.pack(undo), 'PX', receipt_ttl)
end
return cmsgpack.pack(out)
