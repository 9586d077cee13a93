-- claim_due.lua: the single node's claim, one call for every workflow a worker serves:
-- each workflow's ready list (common.lua list_entry) and its due shards (claims.lua's
-- claim_shard on each), with one TIME for all.
--
--   claim_due  KEYS[1] the first workflow's hint prefix; ARGV: see the function below

-- Claim up to limit runs from wf's ready list (hint prefix hp), each moved into the
-- in-flight list (see list_entry): one LMOVE for a claim of one, else an LPOP of up to
-- limit entries and one LPUSH of them (the in-flight list's head is its newest, as
-- LMOVE ... LEFT LEFT leaves it), appending them to leases and followups to follow.
-- Returns how many it claimed and whether the list ran dry.
local function claim_ready(hp, now, ns, worker, limit, ttl, leases, follow)
  local claimed = 0
  while claimed < limit do
    local want = limit - claimed
    local got
    if want == 1 then
      got = {redis.call('LMOVE', hp .. 'r', hp .. 'i', 'LEFT', 'LEFT')}
      if not got[1] then return claimed, true end
    else
      got = redis.call('LPOP', hp .. 'r', want)
      if not got then return claimed, true end
      call_many('LPUSH', hp .. 'i', got)
    end
    for _, e in ipairs(got) do
      local shard, id = split_entry(e)
      local c = {P = shard_prefix(ns, shard), now = now}  -- enough for start_lease
      local r = load_run(c, id)
      if r == nil or r.st ~= 'queued' or r.q ~= 'r' then
        -- Its record is gone (data loss), or a previous build took it off the list its
        -- own way (a cancel): drop the entry.
        redis.call('LREM', hp .. 'i', 1, e)
      elseif r.ex and tonumber(r.ex) <= now then
        redis.call('LREM', hp .. 'i', 1, e)
        r.q = 'x'
        c = shard_ctx(c.P, now, ns, shard)
        expired(c, r)
        for _, x in ipairs(done(c, '')[4]) do follow[#follow + 1] = x end
      else
        start_lease(c, r, worker, ttl, leases, nil)
        claimed = claimed + 1
      end
    end
    if #got < want then return claimed, true end
  end
  return claimed, false
end

-- Claim up to limit runs of wf on its due shards (hint prefix hp), appending them to
-- leases and followups to follow. Returns the shards stopped by flow control ({shard,
-- owed, blocked (6 fields), ...}), how many shards it visited, how many runs it claimed
-- and owes, and whether it drained every due shard.
-- The due shards are visited in a fixed order (their names sorted as strings: not the
-- hint's, which changes as a shard's hint is rewritten, and would skip shards), rotated
-- by the cursor, the worker's own shards first. Nothing is converted or copied: Lua is
-- slow per element here, and with 64 shards due converting and copying them cost more
-- than the claim itself.
local function claim_shards(hp, now, by, ns, wf, worker, limit, ttl, cursor, own, leases, follow)
  local due = redis.call('ZRANGEBYSCORE', hp .. 'd', '-inf', fmt(by))
  local groups = {due}
  if next(own) ~= nil then
    local mine, others = {}, {}
    for i = 1, #due do
      local shard = due[i]
      if own[shard] then mine[#mine + 1] = shard else others[#others + 1] = shard end
    end
    groups = {mine, others}
  end
  for _, group in ipairs(groups) do table.sort(group) end
  local blocked = {}
  local claimed, owed, visited = 0, 0, 0
  local left = {}  -- shard -> whether its last visit left a due run
  for _, group in ipairs(groups) do
    local open, first = group, cursor
    while #open > 0 and claimed + owed < limit do
      local count = #open
      local each = math.max(CLAIM_SHARE, math.ceil((limit - claimed - owed) / count))
      local still = {}
      for j = 0, count - 1 do
        local n = math.min(each, limit - claimed - owed)
        if n <= 0 then break end
        local shard = open[(first + j) % count + 1]
        visited = visited + 1
        local c = shard_ctx(shard_prefix(ns, shard), now, ns, shard)
        c.due = by
        local got, stop = claim_shard(c, wf, worker, n, ttl, {}, {}, {})
        left[shard] = c.keep[wf] or false
        local reply = done(c, '')
        for _, x in ipairs(reply[4]) do follow[#follow + 1] = x end
        for _, x in ipairs(got) do leases[#leases + 1] = x end
        local taken = #got / 2
        claimed = claimed + taken
        if #stop > 0 then
          owed = owed + n - taken
          for _, x in ipairs({shard, tostring(n - taken), unpack(stop)}) do
            blocked[#blocked + 1] = x
          end
        elseif taken >= n then
          still[#still + 1] = shard  -- gave all it was asked: may have more
        end
      end
      open, first = still, 0
    end
  end
  local drained = 0
  for _, more in pairs(left) do
    if not more then drained = drained + 1 end
  end
  return blocked, visited, claimed, owed, drained == #due
end

local HINT_FIRST = 'h'

-- Claim up to limit runs of wf: from its ready list, then its due shards if that came up
-- short; or, with mode HINT_FIRST, the other way round (the caller asks for that now and
-- then, so runs in the shards' queues, such as delayed ones, are not left behind a long
-- ready list; and while the ready list is found dry). Returns the leases, the shards
-- stopped by flow control, how many shards it visited, how many runs it owes, flags ('h'
-- when the shards were read, 's' when due runs were left there, 'd' when the ready list
-- ran dry), and whether its wake list is spent (the caller deletes it).
local function claim_due_wf(hp, now, by, ns, wf, worker, limit, ttl, cursor, own, follow, mode)
  local leases, blocked, visited, owed = {}, {}, 0, 0
  local taken, dry, drained, flags = 0, false, true, ''
  if mode ~= HINT_FIRST then
    taken, dry = claim_ready(hp, now, ns, worker, limit, ttl, leases, follow)
  end
  if taken < limit then
    local claimed
    blocked, visited, claimed, owed, drained = claim_shards(
      hp, now, by, ns, wf, worker, limit - taken, ttl, cursor, own, leases, follow)
    taken = taken + claimed
    flags = drained and 'h' or 'hs'
    if mode == HINT_FIRST then
      -- Not limit - taken - owed: runs owed to flow control may not be admitted, and a
      -- run on the ready list must not wait behind them.
      local more
      more, dry = claim_ready(hp, now, ns, worker, limit - taken, ttl, leases, follow)
      taken = taken + more
    end
  end
  if dry then flags = flags .. 'd' end
  -- The wake-ups pushed so far are spent when this claim came up short, or drained every
  -- due shard and the ready list. Otherwise due runs are left (a later claim's, or a woken
  -- waiter's: not a spurious wake-up), and the DEL is saved.
  return leases, blocked, visited, owed, flags, taken < limit or (drained and dry)
end

-- Workflows a claim_due probes at once, at most (3 keys each: within unpack's limit).
local PROBE_MAX = 1000

-- Single node only (it touches every shard's keys): for each workflow in the order given,
-- hint_read and the claims on its due shards, with one TIME for all, until limit runs
-- are claimed (or owed to flow control). The plan per workflow is the cluster path's
-- (queue.py), with shard names sorted as strings rather than numbers (claim_due_wf): the
-- worker's own shards first, then the others, each group rotated by the workflow's
-- cursor; every round asks each open shard for an equal share of what is left
-- (at least CLAIM_SHARE), and a shard that gave all it was asked stays open. A workflow
-- the limit did not reach is left alone, its wake list too.
-- KEYS[1] the first workflow's hint prefix; ARGV[2..] namespace, worker_id, limit,
-- lease_ttl, ahead (runs due within it are taken too), n, then n (workflow, cursor, mode)
-- triples (mode: HINT_FIRST or '', see
-- claim_due_wf), then the worker's own shards
-- -> {payload = {{{run_id, packed run, ...}, {shard, owed, blocked (6 fields), ...},
--     shards visited, flags} per workflow reached}, {}, {}, followups}
register('claim_due', function(keys, argv)
  local ns, worker = argv[2], argv[3]
  local limit, ttl, ahead, n = tonumber(argv[4]), tonumber(argv[5]), tonumber(argv[6]),
                             tonumber(argv[7])
  if n >= 2 and n <= PROBE_MAX and limit > 0 then
    -- A claim over several workflows (an idle worker's poll names them all) first asks
    -- whether any of them has a ready list, a due-shard index or a wake list at all: one
    -- command instead of two or three per workflow when none has, as if each had been
    -- read and found dry (no shard due, ready list empty, no wake-up to spend).
    local probe = {}
    for j = 0, n - 1 do
      local hp = hint_prefix(ns, argv[8 + 3 * j])
      probe[#probe + 1] = hp .. 'r'
      probe[#probe + 1] = hp .. 'd'
      probe[#probe + 1] = hp .. 'wake'
    end
    if redis.call('EXISTS', unpack(probe)) == 0 then
      local out = {}
      for j = 1, n do out[j] = {{}, {}, '0', 'hd'} end
      return {out, {}, {}, {}}
    end
  end
  local now = now_of(argv[1])
  local own = {}
  for i = 8 + 3 * n, #argv do own[argv[i]] = true end
  local out, follow, taken, spent = {}, {}, 0, {}
  for j = 0, n - 1 do
    if taken >= limit then break end
    local at = 8 + 3 * j
    local wf, cursor, mode = argv[at], tonumber(argv[at + 1]), argv[at + 2]
    local hp = hint_prefix(ns, wf)
    local leases, blocked, visited, owed, flags, wake_spent = claim_due_wf(
      hp, now, now + ahead, ns, wf, worker, limit - taken, ttl, cursor, own, follow, mode)
    taken = taken + #leases / 2 + owed
    if wake_spent then spent[#spent + 1] = hp .. 'wake' end
    out[#out + 1] = {leases, blocked, tostring(visited), flags}
  end
  if #spent > 0 then redis.call('DEL', unpack(spent)) end  -- one DEL for all of them
  return {out, {}, {}, follow}
end)
