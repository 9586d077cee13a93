-- leases.lua: what a lease holder does to its run: renew, journal, signals, children,
-- finish, release, suspend; and taking runs back from workers whose lease expired.
-- Writes carrying a token are fenced: PYRULA_LEASE unless the run is running with it.
--
-- Shard functions (contract in common.lua):
--   renew          ARGV[4] lease_ttl, then run_id, token pairs
--                  -> {{'ok'|'cancel'|'lost'|'done', ...}, expires_at}  ('done': it ended
--                  under that token, e.g. finished while this renewal was on its way)
--   append         ARGV[4..] run_id, token, position, attempts, entry
--                  -> {'ok', cancel_requested '0'|'1'} or {'nondet', existing entry}
--   consume_signal ARGV[4..] the signal list key, run_id, token, position, attempts,
--                  entry_head (the packed entry without ok and value), ok
--                  -> {'consumed', payload} | {'journaled', entry} | {'none'} | {'nondet', e}
--   start_child    ARGV[4..] parent_id, token, position, attempts, entry, then the child
--                  as create's ARGV[4..18] -> {'ok', child} or {'nondet', existing entry}
--   check_entry    ARGV[4..] run_id, token, position, entry -> {'ok'} | {'nondet', e}
--   append_child   ARGV[4..] parent_id, token, position, attempts, entry, child_id
--                  -> {'ok'} | {'nondet', e}   (a child on another shard was created)
--   finish         ARGV[4..] run_id, token, status, has_result, result, has_error, error,
--                  failed_position ('' none), then optionally the last step's journal
--                  entry: position ('' none), attempts, entry -> {'ok', run} or
--                  {'nondet', e}
-- Single node, several finishes in one call: finish_many (see the function).
--   release        ARGV[4..] run_id, token, available_at ('' now) -> ''
--   set_progress   ARGV[4..] run_id, token, state, info -> ''
--   suspend        ARGV[4..] the signal list key ('' none), run_id, token, wake_at
--                  ('' none), has_signal, signal, child ('' none), child_here
--                  -> '1' suspended or '0' (the wait is already over)
--   recover        ARGV[4..] max_recoveries, limit -> {{requeued ids}, {run_id, token, ...}
--                  of runs past max_recoveries, to dead-letter}
--   dead_letter    ARGV[4..] run_id, token, max_recoveries, error -> '1' | '0'
-- Single node only (it touches every shard's keys):
--   recover_lists  KEYS[1] the meta hash; ARGV[2..] namespace, max_recoveries, limit
--                  -> {{requeued ids}, {run_id, token, shard, ...} to dead-letter}:
--                  recover's work for runs claimed from a ready list (common.lua
--                  list_entry), found in each recorded workflow's in-flight list

-- What a lease check reads of a run: its status, token, cancel request and flow-control
-- fields, with one HMGET. Not load_run's HGETALL, which copies the params and the result
-- (megabytes for a big payload) at every renewal and journal write. nil: no such run.
local LEASE_FIELDS = {'st', 'tk', 'cr', 'fc', 'wf', 'ow'}
local function load_lease(c, id)
  local v = redis.call('HMGET', c.P .. K.run .. id, unpack(LEASE_FIELDS))
  if not v[1] then return nil end
  local r = {id = id}
  for i, f in ipairs(LEASE_FIELDS) do
    if v[i] then r[f] = v[i] end
  end
  return r
end

-- fenced (common.lua) for a write that needs only load_lease's fields of the run.
local function fenced_lease(c, id, token)
  local r = load_lease(c, id)
  if r == nil then fail('NOTFOUND', id) end
  return held(r, token)
end

register('renew', function(keys, argv)
  local c = ctx(keys, argv)
  local expires = c.now + tonumber(argv[4])
  local out = {}
  for i = 5, #argv, 2 do
    local r = load_lease(c, argv[i])
    if r ~= nil and TERMINAL[r.st] and r.tk == argv[i + 1] then
      -- Ended under this very lease (its finish crossed this renewal): not lost.
      out[#out + 1] = 'done'
    elseif r == nil or r.st ~= 'running' or r.tk ~= argv[i + 1] then
      out[#out + 1] = 'lost'
    else
      set_fields(c, r, {le = fmt(expires)})
      -- XX: only if it is in the shard's lease index (a run claimed from a ready list is
      -- not: its lease is le alone, recover_lists reads it)
      redis.call('ZADD', c.P .. K.leases, 'XX', fmt(expires), r.id)
      if r.fc then follow(c, 'flow_renew', r.wf, r.ow, r.id) end
      out[#out + 1] = r.cr == '1' and 'cancel' or 'ok'
    end
  end
  return done(c, {out, fmt(expires)})
end)

-- The entry already at position, if it differs from entry: a replay went elsewhere.
local function taken_by_other(c, id, position, entry)
  local stored = redis.call('HGET', c.P .. K.journal .. id, position)
  if stored and entry_of(stored) ~= entry then return entry_of(stored) end
  return nil
end

register('append', function(keys, argv)
  local c = ctx(keys, argv)
  local id, token, position, attempts, entry = argv[4], argv[5], argv[6], argv[7], argv[8]
  local r = fenced_lease(c, id, token)
  local other = journal_add(c, id, position, attempts, token, entry)
  if other then return done(c, {'nondet', other}) end
  return done(c, {'ok', r.cr == '1' and '1' or '0'})
end)

register('consume_signal', function(keys, argv)
  local c = ctx(keys, argv)
  local list, id, token, position = argv[4], argv[5], argv[6], argv[7]
  local attempts, head, ok = argv[8], argv[9], argv[10]
  fenced_lease(c, id, token)
  local stored = redis.call('HGET', c.P .. K.journal .. id, position)
  if stored and string.sub(entry_of(stored), 1, #head) == head then
    return done(c, {'journaled', entry_of(stored)})
  end
  local payload = redis.call('LINDEX', list, 0)
  if not payload then return done(c, {'none'}) end
  if stored then return done(c, {'nondet', entry_of(stored)}) end
  journal_put(c, id, position, attempts, token, head .. ok .. payload)
  redis.call('LPOP', list)
  return done(c, {'consumed', payload})
end)

register('start_child', function(keys, argv)
  local c = ctx(keys, argv)
  local parent, token, position, attempts, entry = argv[4], argv[5], argv[6], argv[7], argv[8]
  fenced_lease(c, parent, token)
  local child_id = argv[9]
  local existing = load_run(c, child_id)
  if existing ~= nil and existing.pa ~= parent then
    fail('STATE', 'a run with id ' .. child_id .. ' already exists')
  end
  local other = journal_add(c, parent, position, attempts, token, entry)
  if other then return done(c, {'nondet', other}) end
  if existing == nil then
    insert_run(c, argv, 9)
  end
  return done(c, {'ok', dump(c, child_id)})
end)

register('check_entry', function(keys, argv)
  local c = ctx(keys, argv)
  fenced_lease(c, argv[4], argv[5])
  local other = taken_by_other(c, argv[4], argv[6], argv[7])
  if other then return done(c, {'nondet', other}) end
  return done(c, {'ok'})
end)

register('append_child', function(keys, argv)
  local c = ctx(keys, argv)
  local parent, token, position, attempts, entry = argv[4], argv[5], argv[6], argv[7], argv[8]
  fenced_lease(c, parent, token)
  local other = journal_add(c, parent, position, attempts, token, entry)
  if other then return done(c, {'nondet', other}) end
  redis.call('SADD', c.P .. K.kids .. parent, argv[9])
  return done(c, {'ok'})
end)

-- finish's work on c's shard, its arguments at a[i..] (finish's ARGV[4..]).
local function finish_at(c, a, i)
  local id, token, status = a[i], a[i + 1], a[i + 2]
  local r = fenced(c, id, token)
  if a[i + 8] ~= nil and a[i + 8] ~= '' then
    local other = journal_add(c, id, a[i + 8], a[i + 9], token, a[i + 10])
    if other then return done(c, {'nondet', other}) end
  end
  local changes = {rs = NIL, er = NIL}
  if a[i + 3] == '1' then changes.rs = a[i + 4] end
  if a[i + 5] == '1' then changes.er = a[i + 6] end
  if a[i + 7] ~= '' then changes.fp = a[i + 7] end
  end_run(c, r, status, changes)
  return done(c, {'ok', pack_run(r)})
end

register('finish', function(keys, argv)
  return finish_at(ctx(keys, argv), argv, 4)
end)

-- Single node only (it touches every shard's keys): several finishes with one TIME.
-- Each is finish's work on its own shard, its error (a lost lease, say) its own: caught,
-- so it stops neither the others nor their writes (every precondition of a finish is
-- checked before its first write). ARGV[2..] namespace, n, then n times: shard, then
-- finish's FINISH_FIELDS arguments (ARGV[4..], the last step's three always there, ''
-- none) -> {{1, finish's reply} or {0, error message}, ...}
register('finish_many', function(keys, argv)
  local now = now_of(argv[1])
  local ns = argv[2]
  local out = {}
  for j = 0, tonumber(argv[3]) - 1 do
    local at = 4 + (1 + FINISH_FIELDS) * j
    local shard = argv[at]
    local c = shard_ctx(shard_prefix(ns, shard), now, ns, shard)
    local ok, reply = pcall(finish_at, c, argv, at + 1)
    if ok then
      out[#out + 1] = {1, reply}
    else
      out[#out + 1] = {0, type(reply) == 'table' and reply.err or tostring(reply)}
    end
  end
  return out
end)

register('release', function(keys, argv)
  local c = ctx(keys, argv)
  local r = fenced(c, argv[4], argv[5])
  local avail = c.now
  if argv[6] ~= '' then avail = tonumber(argv[6]) end
  enqueue(c, r, avail)
  return done(c, '')
end)

register('set_progress', function(keys, argv)
  local c = ctx(keys, argv)
  local r = fenced(c, argv[4], argv[5])
  set_fields(c, r, {ps = argv[6], pi = argv[7], ua = fmt(c.now)})
  return done(c, '')
end)

register('suspend', function(keys, argv)
  local c = ctx(keys, argv)
  local list, id, token, wake_at = argv[4], argv[5], argv[6], argv[7]
  local has_signal, signal, child, child_here = argv[8], argv[9], argv[10], argv[11]
  local r = fenced(c, id, token)
  if has_signal == '1' and redis.call('LLEN', list) > 0 then return done(c, '0') end
  if child ~= '' then
    if child_here == '1' then
      if TERMINAL[require_run(c, child).st] then return done(c, '0') end
    elseif redis.call('SISMEMBER', c.P .. K.kids_done .. id, child) == 1 then
      return done(c, '0')
    end
  end
  if wake_at ~= '' and tonumber(wake_at) <= c.now then return done(c, '0') end
  leave(c, r)
  local status = 'waiting'
  if has_signal ~= '1' and child == '' then status = 'sleeping' end
  local changes = {st = status, ua = fmt(c.now), wa = NIL, ws = NIL, wc = NIL}
  if wake_at ~= '' then changes.wa = wake_at end
  if has_signal == '1' then changes.ws = signal end
  if child ~= '' then changes.wc = child end
  set_fields(c, r, changes)
  if wake_at ~= '' then
    redis.call('ZADD', c.P .. K.timers .. kpart(r.wf), wake_at, member(r))
    redis.call('ZADD', c.P .. K.all_timers, wake_at, member(r))
    c.touched[r.wf] = true
    c.tt[r.wf] = true
    c.timers = true
  end
  return done(c, '1')
end)

-- r's lease expired: queue it again, or, past max_recoveries, add it to dead (with extra,
-- the caller's, after it) for the caller to dead-letter.
local function recover_run(c, r, max_recoveries, requeued, dead, extra)
  local recoveries = tonumber(r.rc or '0') + 1
  if recoveries > max_recoveries then
    dead[#dead + 1] = r.id
    dead[#dead + 1] = r.tk
    if extra then dead[#dead + 1] = extra end
  else
    enqueue(c, r, c.now, {rc = tostring(recoveries)})
    requeued[#requeued + 1] = r.id
  end
end

-- Runs requeued in one call are all queued as of now: FIFO by submission among them
-- (the sequence is per shard: across shards the order is arbitrary, as before).
local function by_submission(a, b) return tonumber(a.r.sq) < tonumber(b.r.sq) end

register('recover', function(keys, argv)
  local c = ctx(keys, argv)
  local max_recoveries, limit = tonumber(argv[4]), tonumber(argv[5])
  local requeued, dead = {}, {}
  if limit > 0 then
    local ids = redis.call('ZRANGEBYSCORE', c.P .. K.leases, '-inf', fmt(c.now), 'LIMIT', 0,
                           limit)
    local lapsed = {}
    for _, id in ipairs(ids) do
      local r = load_run(c, id)
      if r ~= nil and r.st == 'running' and tonumber(r.le) <= c.now then
        lapsed[#lapsed + 1] = {r = r}
      elseif r ~= nil and r.st == 'running' then
        redis.call('ZADD', c.P .. K.leases, r.le, id)  -- a stale score: the lease holds
      else
        redis.call('ZREM', c.P .. K.leases, id)  -- ended, or its record is gone
      end
    end
    table.sort(lapsed, by_submission)
    for _, x in ipairs(lapsed) do recover_run(c, x.r, max_recoveries, requeued, dead) end
  end
  return done(c, {requeued, dead})
end)

-- In-flight entries recover_lists reads per workflow per call, at most: past that, from
-- a cursor kept beside the list (hint prefix 'ic'), shared by every worker's scans, so a
-- long list costs each scan a bounded time and the fleet's scans cover it in turn.
local RECOVER_SCAN = 1000

register('recover_lists', function(keys, argv)
  local now, ns = now_of(argv[1]), argv[2]
  local max_recoveries, limit = tonumber(argv[3]), tonumber(argv[4])
  local lapsed = {}
  for _, field in ipairs(redis.call('HKEYS', keys[1])) do
    if #lapsed >= limit then break end
    if string.sub(field, 1, 2) == 'w:' then
      local hp = hint_prefix(ns, string.sub(field, 3))
      local from, to = 0, -1
      local size = redis.call('LLEN', hp .. 'i')
      if size > RECOVER_SCAN then
        from = tonumber(redis.call('GET', hp .. 'ic') or '0')
        if from >= size then from = 0 end
        to = from + RECOVER_SCAN - 1
        redis.call('SET', hp .. 'ic', tostring(to + 1 < size and to + 1 or 0))
      end
      for _, e in ipairs(redis.call('LRANGE', hp .. 'i', from, to)) do
        if #lapsed >= limit then break end
        local shard, id = split_entry(e)
        local P = shard_prefix(ns, shard)
        local f = redis.call('HMGET', P .. K.run .. id, 'st', 'q', 'le')
        if f[1] ~= 'running' or f[2] ~= 'i' then
          redis.call('LREM', hp .. 'i', 1, e)  -- its record is gone (data loss): drop it
        elseif tonumber(f[3]) <= now then
          local c = shard_ctx(P, now, ns, shard)
          lapsed[#lapsed + 1] = {c = c, r = load_run(c, id), shard = shard}
        end
      end
    end
  end
  table.sort(lapsed, by_submission)
  local requeued, dead = {}, {}
  for _, x in ipairs(lapsed) do
    recover_run(x.c, x.r, max_recoveries, requeued, dead, x.shard)
    done(x.c, '')
  end
  return {requeued, dead}
end)

register('dead_letter', function(keys, argv)
  local c = ctx(keys, argv)
  local r = load_run(c, argv[4])
  if r == nil or r.st ~= 'running' or r.tk ~= argv[5] or tonumber(r.le) > c.now then
    return done(c, '0')
  end
  local recoveries = tonumber(r.rc or '0') + 1
  if recoveries <= tonumber(argv[6]) then return done(c, '0') end
  end_run(c, r, 'dead', {rc = tostring(recoveries), er = argv[7]})
  return done(c, '1')
end)
