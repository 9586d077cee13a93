-- common.lua: helpers every function of the library shares. Registers nothing.
--
-- Contract of every function in this library:
--   ARGV[1]  the clock override: '' means the server's TIME (production); a number is
--            used instead so tests can inject the store's clock.
-- Shard functions (runs.lua, claims.lua, leases.lua) additionally take:
--   KEYS[1]  the shard prefix "ns:{ns:k}:"; every key they touch starts with it, so each
--            call lands on one cluster slot.
--   ARGV[2]  the namespace when hint keys may be written inline (single node), or ''
--            (cluster: hints are returned and the caller applies them with hint_set).
--   ARGV[3]  the shard number. Their own arguments start at ARGV[4].
-- and return {payload, workflow_hints, timer_hint, followups} (see done()).
-- Every precondition is checked (fail) before the first write: Lua does not roll back.
-- Payloads (params, results, errors, journal values, signals) are opaque strings here:
-- never decoded, so big integers and empty lists survive byte for byte.

local DONE_TTL = 3600
local NIL = {}

local function now_of(arg)
  if arg ~= nil and arg ~= '' then return tonumber(arg) end
  local t = redis.call('TIME')
  return tonumber(t[1]) + tonumber(t[2]) / 1000000
end

local function fmt(x) return string.format('%.17g', x) end

local function fail(code, msg) error({err = 'PYRULA_' .. code .. ' ' .. msg}) end

-- A call's context. Per workflow it tracks what changed on the shard, so done() can
-- rewrite the hints at the least cost: touched (anything), tt (its timers), wake (push
-- its wake list), removed (a run left its queue), lower (the earliest available_at
-- queued by this call), keep (a claim knows the shard still has due work), solo_due (a
-- claim of the solo default owner saw the shard's next queued run: its available_at, or
-- '' for none; with no other owner queued there is no other queue to read), ready (a run
-- went into its ready list: only the wake list is pushed). A claim takes the queued runs
-- available by due (now, or a little later when the claim looks ahead: see claim_runs).
local function shard_ctx(P, now, ns, shard)
  return {P = P, now = now, due = now, ns = ns, shard = shard, touched = {}, tt = {}, wake = {},
          removed = {}, lower = {}, keep = {}, solo_due = {}, ready = {}, timers = false,
          follow = {}}
end

local function ctx(keys, argv)
  return shard_ctx(keys[1], now_of(argv[1]), argv[2], argv[3])
end

local function load_run(c, id)
  local flat = redis.call('HGETALL', c.P .. K.run .. id)
  if #flat == 0 then return nil end
  local r = {id = id}
  for i = 1, #flat, 2 do r[flat[i]] = flat[i + 1] end
  return r
end

-- A run's fields as one JSON string (codec.py unpack_fields): one reply element instead
-- of ~30, which clients parse far faster, encoded by cjson in C (three times faster than
-- building it in Lua). Every value is a Lua string, so it becomes a JSON string: nothing
-- is decoded, and payloads keep every byte.
local function pack_flat(flat) return cjson.encode(flat) end  -- [field, value, ...]

local function dump(c, id) return pack_flat(redis.call('HGETALL', c.P .. K.run .. id)) end

-- The same from r, a run loaded with load_run and changed only through set_fields (which
-- mirrors every write in r): no second HGETALL. {field: value, ...}, with "id" too.
local function pack_run(r) return cjson.encode(r) end

local TERMINAL = {completed = true, failed = true, cancelled = true, terminated = true,
                  dead = true}

local function require_run(c, id)
  local r = load_run(c, id)
  if r == nil then fail('NOTFOUND', id) end
  return r
end

local function require_live(c, id)
  local r = require_run(c, id)
  if TERMINAL[r.st] then fail('STATE', 'run ' .. id .. ' already ended as ' .. r.st) end
  return r
end

-- A token greater than every one r has had: its next claim's, or terminate's.
local function fence_token(r)
  return tostring(math.max(tonumber(r.cl or '0'), tonumber(r.tk or '0')) + 1)
end

-- r (a run with at least its st and tk) unless it is running under token: PYRULA_LEASE.
local function held(r, token)
  if r.st ~= 'running' or r.tk ~= token then
    fail('LEASE', 'run ' .. r.id .. ' is no longer held with token ' .. token .. ' (status '
      .. r.st .. ', token ' .. (r.tk or '0') .. ')')
  end
  return r
end

local function fenced(c, id, token) return held(require_run(c, id), token) end

-- cmd key items...: one command per 4,000 items (unpack's limit is the Lua C stack).
local function call_many(cmd, key, items)
  for i = 1, #items, 4000 do
    redis.call(cmd, key, unpack(items, i, math.min(i + 3999, #items)))
  end
end

-- Write changed fields (NIL deletes one) and mirror them in r.
local function set_fields(c, r, changes)
  local hset, hdel = {}, {}
  for f, v in pairs(changes) do
    if v == NIL then
      -- r holds every field of the run (load_run) or is new: absent means nothing to delete.
      if r[f] ~= nil then hdel[#hdel + 1] = f end
      r[f] = nil
    else
      r[f] = v
      hset[#hset + 1] = f
      hset[#hset + 1] = v
    end
  end
  local key = c.P .. K.run .. r.id
  if #hset > 0 then redis.call('HSET', key, unpack(hset)) end
  if #hdel > 0 then redis.call('HDEL', key, unpack(hdel)) end
end

-- Queue and timer members sort by submission within equal scores (FIFO ties).
local function member(r) return string.format('%012d', tonumber(r.sq)) .. ':' .. r.id end
local function member_id(m) return string.sub(m, 14) end
local function qkey(c, wf, owner) return c.P .. K.queue .. kpart(wf) .. ':' .. owner end

-- The default owner ('') alone on a shard is "solo": while no other owner has queued
-- runs of wf there, it is left out of the owners zset and its runs carry no DRR stamp,
-- so its claims and submits skip the DRR bookkeeping. Invariant: the owners zset is
-- empty, or it holds every owner with queued runs, the default one included. The
-- default owner joins it when another owner's run is queued (enqueue) with the current
-- counter as its turn: it banks no credit, as an owner back from idle (the tie with the
-- newcomer goes by name: the default owner first). It leaves again when a claim finds it
-- alone (claim_shard). A stamp left on a run from before is at most one turn early.
local function solo(c, wf)
  return redis.call('EXISTS', c.P .. K.owners .. kpart(wf)) == 0
end

-- An owner's DRR turn (stores/flow.py owner_turn) from its head run's stamp (a run
-- queued while its owner was solo has none: the served stamp decides).
local function refresh_owner(c, wf, owner)
  local w = kpart(wf)
  local okey = c.P .. K.owners .. w
  if owner == '' and redis.call('ZSCORE', okey, owner) == false then return end  -- solo
  local head = redis.call('ZRANGE', qkey(c, wf, owner), 0, 0)
  if head[1] == nil then
    redis.call('ZREM', okey, owner)
    return
  end
  local turn = tonumber(redis.call('HGET', c.P .. K.run .. member_id(head[1]), 'sp') or '0')
  local served = redis.call('HGET', c.P .. K.served .. w, owner)
  if served then turn = math.max(turn, tonumber(served)) end
  redis.call('ZADD', okey, fmt(turn), owner)
end

local function follow(c, kind, a, b, d)
  c.follow[#c.follow + 1] = {kind, a or '', b or '', d or ''}
end

-- Single node: the default owner's runs of a workflow in which no run has ever had an
-- owner (no 'm' key under its hint prefix: mark_owned) wait, when queued due at once
-- (submitted with no delay or start_at, released, recovered, retried, woken) and not under
-- flow control, at the tail of the workflow's ready list (hint prefix 'r') instead of in
-- their shard's queue: FIFO by available_at, as the shard's queue would order them. A
-- claim moves them into the in-flight list ('i': one LMOVE, or an LPOP and an LPUSH for
-- more than one, see claim_ready), and that list, not the shard's lease index, is where
-- the orphan scan finds them (recover_lists).
-- An entry is "<shard>:<run_id>"; the run's field q says where it is: 'r' while queued in
-- the ready list, 'i' while running from the in-flight list, '' (or absent) elsewhere;
-- 'x' only in memory, for a run its caller has already taken off the ready list.
local function list_entry(c, id) return c.shard .. ':' .. id end

local function split_entry(e)
  local k = string.find(e, ':', 1, true)
  return string.sub(e, 1, k - 1), string.sub(e, k + 1)
end

-- Take r out of the indexes of its current status.
local function leave(c, r)
  local w = kpart(r.wf)
  if r.st == 'queued' and (r.q == 'r' or r.q == 'x') then
    if r.q == 'r' then
      redis.call('LREM', hint_prefix(c.ns, r.wf) .. 'r', -1, list_entry(c, r.id))
    end
  elseif r.st == 'queued' then
    redis.call('ZREM', qkey(c, r.wf, r.ow), member(r))
    if r.ow ~= '' then redis.call('ZREM', c.P .. K.due .. w, r.id) end  -- see first_due
    refresh_owner(c, r.wf, r.ow)
    c.touched[r.wf] = true
    c.removed[r.wf] = true
    c.keep[r.wf] = nil
  elseif r.st == 'running' then
    -- From the in-flight list's tail (the oldest claims, likeliest to end first); from the
    -- shard's lease index when it is not there (a previous build claimed it through the
    -- shards and left a stale mark).
    if r.q ~= 'i'
        or redis.call('LREM', hint_prefix(c.ns, r.wf) .. 'i', -1, list_entry(c, r.id)) == 0 then
      redis.call('ZREM', c.P .. K.leases, r.id)
    end
    if r.fc then follow(c, 'flow_release', r.wf, r.ow, r.id) end
  elseif r.wa then
    redis.call('ZREM', c.P .. K.timers .. w, member(r))
    redis.call('ZREM', c.P .. K.all_timers, member(r))
    c.touched[r.wf] = true
    c.tt[r.wf] = true
    c.timers = true
  end
end

-- Make r queued, claimable from avail: at the tail of its workflow's ready list when it
-- may wait there (see list_entry: single node, the default owner, due now, no flow
-- control, a workflow no owned run was submitted to), else in its shard's queue, stamped
-- with the workflow's claim counter (unless its owner is solo: see solo()).
local function enqueue(c, r, avail, changes)
  leave(c, r)
  changes = changes or {}
  changes.st = 'queued'
  changes.aa = fmt(avail)
  changes.ua = fmt(c.now)
  -- le stays: it only means something while running (codec.to_run), and leaving it
  -- saves an HDEL.
  changes.wa, changes.ws, changes.wc = NIL, NIL, NIL
  local owner = changes.ow or r.ow  -- a new run: its fields are in changes
  if c.ns ~= '' and owner == '' and avail == c.now
      and not (changes.fk or changes.fc or r.fk or r.fc)
      and redis.call('EXISTS', hint_prefix(c.ns, r.wf) .. 'm') == 0 then
    changes.q = 'r'
    set_fields(c, r, changes)
    redis.call('RPUSH', hint_prefix(c.ns, r.wf) .. 'r', list_entry(c, r.id))
    c.ready[r.wf] = true
    return
  end
  local lone = owner == '' and solo(c, r.wf)
  if not lone then changes.sp = redis.call('GET', c.P .. K.counter .. kpart(r.wf)) or '0' end
  if r.q ~= nil and r.q ~= '' then changes.q = '' end  -- off the lists (an HSET, no HDEL)
  set_fields(c, r, changes)
  local q = qkey(c, r.wf, r.ow)
  redis.call('ZADD', q, fmt(avail), member(r))
  if r.ow ~= '' then redis.call('ZADD', c.P .. K.due .. kpart(r.wf), fmt(avail), r.id) end
  -- The owner's turn (refresh_owner, without its reads): no last-served value exceeds the
  -- counter, so an owner whose head is now r has turn = r's stamp; an owner already
  -- queued whose head did not change keeps its turn.
  local okey = c.P .. K.owners .. kpart(r.wf)
  if lone then
    -- solo: no turn to keep
  elseif redis.call('ZADD', okey, 'NX', changes.sp, r.ow) == 0 then
    if redis.call('ZRANK', q, member(r)) == 0 then redis.call('ZADD', okey, changes.sp, r.ow) end
  elseif r.ow ~= '' and redis.call('ZCARD', okey) == 1
      and redis.call('EXISTS', qkey(c, r.wf, '')) == 1 then
    -- The first other owner: the solo default owner joins the rotation (see solo()).
    redis.call('ZADD', okey, changes.sp, '')
  end
  c.touched[r.wf] = true
  c.wake[r.wf] = true
  if c.lower[r.wf] == nil or avail < c.lower[r.wf] then c.lower[r.wf] = avail end
end

-- Make r terminal; wake its waiters and a parent waiting for it.
local function end_run(c, r, status, changes)
  leave(c, r)
  changes = changes or {}
  changes.st = status
  changes.fa = fmt(c.now)
  changes.ua = fmt(c.now)
  changes.wa, changes.ws, changes.wc = NIL, NIL, NIL  -- le stays (see enqueue)
  set_fields(c, r, changes)
  redis.call('ZADD', c.P .. K.ended, changes.fa, r.id)  -- purge's index (runs.lua)
  local done = c.P .. K.done .. r.id
  redis.call('RPUSH', done, '1')
  redis.call('EXPIRE', done, DONE_TTL)
  if r.pa then
    local p = load_run(c, r.pa)
    if p == nil then
      follow(c, 'child_ended', r.pa, r.id)
    else
      redis.call('SADD', c.P .. K.kids_done .. r.pa, r.id)
      if p.st == 'waiting' and p.wc == r.id then enqueue(c, p, c.now) end
    end
  end
end

-- A journal value is "attempts|token|recorded_at|entry"; entry is Python's packing of
-- kind, name, ok and value ("<n>:<kind><n>:<name><0|1><value>").
local function entry_of(stored)
  local a = string.find(stored, '|', 1, true)
  local b = string.find(stored, '|', a + 1, true)
  local d = string.find(stored, '|', b + 1, true)
  return string.sub(stored, d + 1)
end


local function journal_value(c, attempts, token, entry)
  return attempts .. '|' .. token .. '|' .. fmt(c.now) .. '|' .. entry
end

local function journal_put(c, id, position, attempts, token, entry)
  redis.call('HSET', c.P .. K.journal .. id, position, journal_value(c, attempts, token, entry))
end

-- Journal entry at position unless one is there already. Returns the entry found there
-- when it differs (a replay went elsewhere: nothing was written), else nil. The common
-- case (a new position) is one HSETNX; a repeat of the same entry writes nothing.
local function journal_add(c, id, position, attempts, token, entry)
  local key = c.P .. K.journal .. id
  if redis.call('HSETNX', key, position, journal_value(c, attempts, token, entry)) == 1 then
    return nil
  end
  local stored = entry_of(redis.call('HGET', key, position))
  if stored ~= entry then return stored end
  return nil
end

-- Wake one idle claimer of a workflow. The list is bounded, trimmed only once it grows
-- (a claim that comes up short deletes it). The value says why: WAKE_READY for runs put
-- on the ready list (due now, under no flow control: a claim that finds none of them
-- lost them to another claimer), '1' for anything else (a delayed or rate-limited run
-- too: the claimer's timer loop should look again).
local WAKE_READY = 'r'

local function push_wake(hp, why)
  if redis.call('LPUSH', hp .. 'wake', why or '1') > 16 then
    redis.call('LTRIM', hp .. 'wake', 0, 7)
  end
end

local function apply_hint_at(hp, shard, ver, due, timer, wake)
  local cur = tonumber(redis.call('HGET', hp .. 'v', shard) or '-1')
  if tonumber(ver) > cur then
    redis.call('HSET', hp .. 'v', shard, ver)
    if due == '' then redis.call('ZREM', hp .. 'd', shard)
    else redis.call('ZADD', hp .. 'd', due, shard) end
    if timer ~= nil then
      if timer == '' then redis.call('ZREM', hp .. 't', shard)
      else redis.call('ZADD', hp .. 't', timer, shard) end
    end
  end
  if wake ~= nil and wake ~= '' then push_wake(hp) end
end

local function first_score(key)
  return redis.call('ZRANGE', key, 0, 0, 'WITHSCORES')[2] or ''
end

-- The shard's first queued run of wf, by available_at ('' none). The due index holds the
-- runs of named owners; the default owner's queue is its own index (one write less per
-- submit and per claim of the commonest runs).
local function first_due(c, wf)
  local named = first_score(c.P .. K.due .. kpart(wf))
  local default = first_score(qkey(c, wf, ''))
  if named == '' or (default ~= '' and tonumber(default) < tonumber(named)) then
    return default
  end
  return named
end

-- Single node: write a hint in the same atomic call that changed the shard. No version
-- is needed (versions order the cluster's separate hint writes); the 't' zset is only
-- rewritten when the workflow's timers changed (timer nil).
-- due: the shard's first due time ('' none), {lt = t} (only runs queued: lower it to t
-- if later) or nil (unchanged); wake: the wake-up to push (see push_wake), nil none.
local function write_hint(hp, shard, due, timer, wake)
  if type(due) == 'table' then redis.call('ZADD', hp .. 'd', 'LT', fmt(due.lt), shard)
  elseif due == '' then redis.call('ZREM', hp .. 'd', shard)
  elseif due ~= nil then redis.call('ZADD', hp .. 'd', due, shard) end
  if timer ~= nil then
    if timer == '' then redis.call('ZREM', hp .. 't', shard)
    else redis.call('ZADD', hp .. 't', timer, shard) end
  end
  if wake then push_wake(hp, wake) end
end

-- The shard's due hint for wf after this call, at the least cost (see shard_ctx). A hint
-- in the past means "due now": keeping an older past time is as good as the exact one.
local function due_hint(c, wf)
  if c.removed[wf] then
    if c.keep[wf] then return nil end
    local due, low = c.solo_due[wf], c.lower[wf]
    if due then  -- unless this call queued a run too (a parent an expired run woke)
      if low ~= nil and (due == '' or low < tonumber(due)) then return fmt(low) end
      return due
    end
  elseif c.lower[wf] ~= nil then
    return {lt = c.lower[wf]}
  end
  return first_due(c, wf)
end

local function done_inline(c)
  for wf in pairs(c.ready) do
    if not c.touched[wf] then push_wake(hint_prefix(c.ns, wf), WAKE_READY) end
  end
  for wf in pairs(c.touched) do
    local timer = nil
    if c.tt[wf] then timer = first_score(c.P .. K.timers .. kpart(wf)) end
    local wake = (c.wake[wf] and '1') or (c.ready[wf] and WAKE_READY) or nil
    write_hint(hint_prefix(c.ns, wf), c.shard, due_hint(c, wf), timer, wake)
  end
  if c.timers then
    write_hint(timer_hint_prefix(c.ns), c.shard, first_score(c.P .. K.all_timers), nil, nil)
  end
end

-- Recompute the hints of what this call touched; write them inline or return them.
local function done(c, payload)
  local hints, th = {}, {}
  if c.ns ~= '' then
    done_inline(c)
  elseif next(c.touched) ~= nil or c.timers then
    -- Cluster: the hints live in other slots; return them, versioned, for hint_set.
    local ver = redis.call('INCR', c.P .. K.version)
    for wf in pairs(c.touched) do
      local w = kpart(wf)
      local due = first_due(c, wf)
      local timer = first_score(c.P .. K.timers .. w)
      local wake = c.wake[wf] and '1' or ''
      for _, x in ipairs({wf, ver, due, timer, wake}) do hints[#hints + 1] = x end
    end
    if c.timers then th = {ver, first_score(c.P .. K.all_timers)} end
  end
  local flat = {}
  for _, f in ipairs(c.follow) do
    for i = 1, 4 do flat[#flat + 1] = f[i] end
  end
  return {payload, hints, th, flat}
end

-- How many ready-list runs one owned submission moves to the shards' queues (~19 µs
-- each: a bound on the time the server spends on it in one call).
local MOVE_BATCH = 5000

-- A run with an owner is about to be queued in wf: from now on (for good) wf's runs go
-- through the shards' fair queues, so the ready list's runs move there, keeping their
-- available_at: up to MOVE_BATCH per owned submission, the oldest first, until the list
-- is gone (meanwhile claims still serve what is left of it first). Costs one SET per
-- owned submission, and an EXISTS while a list is left.
local function mark_owned(c, wf)
  local hp = hint_prefix(c.ns, wf)
  if not redis.call('SET', hp .. 'm', '1', 'NX') and redis.call('EXISTS', hp .. 'r') == 0 then
    return
  end
  local items = redis.call('LRANGE', hp .. 'r', 0, MOVE_BATCH - 1)
  redis.call('LTRIM', hp .. 'r', #items, -1)
  local others = {}
  for _, e in ipairs(items) do
    local shard, id = split_entry(e)
    local cs = c
    if shard ~= c.shard then
      cs = others[shard] or shard_ctx(shard_prefix(c.ns, shard), c.now, c.ns, shard)
      others[shard] = cs
    end
    local r = load_run(cs, id)
    if r ~= nil and r.st == 'queued' and r.q == 'r' then
      r.q = 'x'  -- off the ready list already
      enqueue(cs, r, tonumber(r.aa))
    end
  end
  for _, cs in pairs(others) do done(cs, '') end
end

local function register(name, fn)
  redis.register_function(LIBRARY .. '_' .. name, fn)
end
