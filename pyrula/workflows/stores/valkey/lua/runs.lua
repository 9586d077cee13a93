-- runs.lua: creating, cancelling, terminating, retrying, listing and signalling runs.
--
-- Shard functions (contract in common.lua: KEYS[1] shard prefix, ARGV[1..3] clock,
-- inline-hint namespace, shard number; they return {payload, hints, timer_hint, followups}):
--   create_ready  (single node) the commonest create, with less work; unlike the shard
--                 functions it returns its payload alone ({'created', at, seq} or
--                 {'owned'}: see the function), never through _shard/_after
--   create        ARGV[4..] run_id, workflow, params, owner, has_key ('1'), key, delay,
--                 start_at ('' none), parent ('' none), rate_key, rate_per_second,
--                 rate_burst, owner_concurrency ('' none), expires_at ('' none), the error
--                 to store if it expires, allow_existing ('1': a run with this id and key
--                 is the one the key's reservation names)
--                 -> {'created'|'existing', run}
--   cancel        ARGV[4] run_id -> run            (non-local children become followups)
--   terminate     ARGV[4] run_id -> run
--   retry         ARGV[4] run_id, seen claims ('' any), then the journal positions to
--                 remove -> run
--   list          ARGV[4..] has_workflow, workflow, status ('' any), has_owner, owner,
--                 limit, budget, from -> {{run_id, run, ...} newest first, next}
--                 (walks the shard's history, a budget of it a call: see the function)
--   list_queued   ARGV[4..] has_owner, owner, limit, workflows... -> the same, of the
--                 runs in the shard's queues (see list_ready for the ready lists)
--   send_signal   ARGV[4..] the signal list key, run_id, name, payload -> ''
--   child_ended   ARGV[4..] parent_id, child_id -> ''   (a child on another shard ended)
--   delete_run    ARGV[4] run_id -> '1' deleted, '0' no such run (a live one: STATE)
--   purge         ARGV[4..] ended_before, limit -> how many runs it forgot
-- Plain functions:
--   idem_reserve  KEYS[1] the key's shard prefix; ARGV[2..] key, then the NewRun (run_id,
--                 workflow, params, owner, delay, start_at, parent, rate_key,
--                 rate_per_second, rate_burst, owner_concurrency, expires_at)
--                 -> {'reserved', {}} or {'exists', reservation fields}
--   idem_release  KEYS[1] the key's shard prefix; ARGV[2..] key, run_id -> 0|1

local RETRYABLE = {failed = true, cancelled = true, terminated = true, dead = true}

-- Store a new queued run from a[i..i+14] (create's ARGV[4..18]); the id must be free.
local function insert_run(c, a, i)
  local id, wf, params, owner = a[i], a[i + 1], a[i + 2], a[i + 3]
  local has_key, ikey, delay, start_at, parent = a[i + 4], a[i + 5], a[i + 6], a[i + 7], a[i + 8]
  local fk, fr, fb, fc, ex, xe = a[i + 9], a[i + 10], a[i + 11], a[i + 12], a[i + 13],
                                 a[i + 14]
  local seq = redis.call('INCR', c.P .. K.seq)
  local avail = c.now + tonumber(delay)
  if start_at ~= '' then avail = tonumber(start_at) end
  local r = {id = id, wf = wf}  -- enqueue reads r.wf before it writes the fields
  local fields = {wf = wf, p = params, ow = owner, ca = fmt(c.now), sq = tostring(seq)}
  if has_key == '1' then fields.ik = ikey end
  if parent ~= '' then fields.pa = parent end
  if fk ~= '' then fields.fk, fields.fr, fields.fb = fk, fr, fb end
  if fc ~= '' then fields.fc = fc end
  if ex ~= '' then fields.ex, fields.xe = ex, xe end
  if c.ns ~= '' and owner ~= '' then mark_owned(c, wf) end  -- single node: see list_entry
  enqueue(c, r, avail, fields)
  redis.call('ZADD', c.P .. K.all, fmt(c.now), member(r))
  if parent ~= '' then
    if redis.call('EXISTS', c.P .. K.run .. parent) == 1 then
      redis.call('SADD', c.P .. K.kids .. parent, id)
    else
      follow(c, 'add_kid', parent, id)
    end
  end
  return r
end

register('create', function(keys, argv)
  local c = ctx(keys, argv)
  local id, has_key, ikey, parent, allow = argv[4], argv[8], argv[9], argv[12], argv[19]
  local r = load_run(c, id)
  if r ~= nil then
    if (parent ~= '' and r.pa == parent)
        or (allow == '1' and has_key == '1' and r.ik == ikey) then
      return done(c, {'existing', dump(c, id)})
    end
    fail('STATE', 'a run with id ' .. id .. ' already exists')
  end
  return done(c, {'created', pack_run(insert_run(c, argv, 4))})
end)

-- Single node: create's work for the commonest run, the least Lua for it (the server
-- pays for every line a call runs): no idempotency key, parent, owner, flow control,
-- delay or start_at, so it goes to the tail of its workflow's ready list (see
-- list_entry), with the fields insert_run and enqueue write. A workflow an owned run was
-- submitted to (mark_owned) takes create instead.
-- KEYS[1] the shard prefix; ARGV[2..] namespace, shard, run_id, workflow, params,
-- expires_at ('' none), the error to store if it expires
-- -> {'created', created_at, seq} | {'owned'} (nothing written: call create)
register('create_ready', function(keys, argv)
  local P, ns, shard, id, wf = keys[1], argv[2], argv[3], argv[4], argv[5]
  if ns == '' then fail('INTERNAL', 'create_ready is for a single node') end
  local key = P .. K.run .. id
  local hp = hint_prefix(ns, wf)
  -- Neither the run nor the workflow's owned mark, the common case: one EXISTS for both.
  if redis.call('EXISTS', key, hp .. 'm') > 0 then
    if redis.call('EXISTS', key) == 1 then
      fail('STATE', 'a run with id ' .. id .. ' already exists')
    end
    return {'owned'}
  end
  local now = now_of(argv[1])
  local seq = tostring(redis.call('INCR', P .. K.seq))
  local at = fmt(now)
  local fields = {'wf', wf, 'p', argv[6], 'ow', '', 'ca', at, 'sq', seq, 'st', 'queued',
                  'aa', at, 'ua', at, 'q', 'r'}
  if argv[7] ~= '' then
    for _, x in ipairs({'ex', argv[7], 'xe', argv[8]}) do fields[#fields + 1] = x end
  end
  redis.call('HSET', key, unpack(fields))
  redis.call('RPUSH', hp .. 'r', shard .. ':' .. id)
  redis.call('ZADD', P .. K.all, at, member({sq = seq, id = id}))
  push_wake(hp, WAKE_READY)
  return {'created', at, seq}
end)

-- Non-terminal descendants on this shard, parents before children; others followed up.
local function tree(c, id, out)
  for _, kid in ipairs(redis.call('SMEMBERS', c.P .. K.kids .. id)) do
    local k = load_run(c, kid)
    if k == nil then
      out.away[#out.away + 1] = kid
    else
      if not TERMINAL[k.st] then out.runs[#out.runs + 1] = k end
      tree(c, kid, out)
    end
  end
end

-- The run (which must not have ended) and its descendants, as tree() returns them.
local function live_tree(c, id)
  local out = {runs = {require_live(c, id)}, away = {}}
  tree(c, id, out)
  return out
end

-- Cancel the runs tree() found (parents before children): one that is running is asked
-- to stop, the others end cancelled; those on other shards are followed up.
local function cancel_runs(c, out)
  for _, t in ipairs(out.runs) do
    t = load_run(c, t.id)
    if t.st == 'running' then
      set_fields(c, t, {cr = '1', ua = fmt(c.now)})
      if t.wk then follow(c, 'news', t.wk) end  -- its worker renews at once
    elseif not TERMINAL[t.st] then
      end_run(c, t, 'cancelled', {cr = '1'})
    end
  end
  for _, kid in ipairs(out.away) do follow(c, 'cancel', kid) end
end

register('cancel', function(keys, argv)
  local c = ctx(keys, argv)
  local id = argv[4]
  cancel_runs(c, live_tree(c, id))
  return done(c, dump(c, id))
end)

register('terminate', function(keys, argv)
  local c = ctx(keys, argv)
  local id = argv[4]
  local out = live_tree(c, id)
  for _, t in ipairs(out.runs) do
    t = load_run(c, t.id)
    if not TERMINAL[t.st] then
      if t.st == 'running' and t.wk then follow(c, 'news', t.wk) end
      -- A new token (see start_lease), so no lease still held matches it.
      end_run(c, t, 'terminated', {tk = fence_token(t)})
    end
  end
  for _, kid in ipairs(out.away) do follow(c, 'terminate', kid) end
  return done(c, dump(c, id))
end)

register('retry', function(keys, argv)
  local c = ctx(keys, argv)
  local id = argv[4]
  local r = require_run(c, id)
  if not RETRYABLE[r.st] then
    fail('STATE', 'run ' .. id .. ' is ' .. r.st
      .. '; only failed, cancelled, terminated or dead runs can be retried')
  end
  local claims = r.cl or '0'
  if argv[5] ~= '' and argv[5] ~= claims then
    fail('STATE', 'run ' .. id .. ' was claimed again since its journal was read ('
      .. claims .. ' claims, not ' .. argv[5] .. '): read it again to retry it')
  end
  -- The entries the engine chose (engine/rerun.py: the step that failed the run).
  local remove = {}
  for i = 6, #argv do remove[#remove + 1] = argv[i] end
  call_many('HDEL', c.P .. K.journal .. id, remove)
  redis.call('DEL', c.P .. K.done .. id)
  redis.call('ZREM', c.P .. K.ended, id)
  enqueue(c, r, c.now, {fa = NIL, er = NIL, rs = NIL, cr = NIL, rc = NIL, fp = NIL})
  return done(c, dump(c, id))
end)

-- ARGV[4..] has_workflow, workflow, status ('' any), has_owner, owner, limit, budget,
-- from -> {{run_id, run, ...}, next}: the shard's runs matching the filters, newest first,
-- until limit of them or after looking at budget entries of its history index; from is
-- '' (the newest) or where the previous call stopped ("score member"), and next is ''
-- when the history is done or the limit reached, else where to go on. The budget bounds
-- how long one call keeps the server busy with a long history.
register('list', function(keys, argv)
  local c = ctx(keys, argv)
  local has_wf, wf, status, has_owner, owner = argv[4], argv[5], argv[6], argv[7], argv[8]
  local limit, budget = tonumber(argv[9]), tonumber(argv[10])
  local idx, max, after = c.P .. K.all, '+inf', nil
  if argv[11] ~= '' then
    local sp = string.find(argv[11], ' ', 1, true)
    max, after = string.sub(argv[11], 1, sp - 1), string.sub(argv[11], sp + 1)
  end
  local out, n, looked, offset, last = {}, 0, 0, 0, nil
  while n < limit and looked < budget do
    local chunk = redis.call('ZRANGE', idx, max, '-inf', 'BYSCORE', 'REV', 'LIMIT', offset,
                             100, 'WITHSCORES')
    if #chunk == 0 then return done(c, {out, ''}) end
    offset = offset + #chunk / 2
    for i = 1, #chunk, 2 do
      local m, score = chunk[i], chunk[i + 1]
      -- Entries of the resumed score at or above where the last call stopped were seen.
      if after == nil or score ~= max or m < after then
        looked = looked + 1
        last = score .. ' ' .. m
        local id = member_id(m)
        local f = redis.call('HMGET', c.P .. K.run .. id, 'wf', 'st', 'ow')
        if (has_wf ~= '1' or f[1] == wf) and (status == '' or f[2] == status)
            and (has_owner ~= '1' or f[3] == owner) then
          out[#out + 1] = id
          out[#out + 1] = dump(c, id)
          n = n + 1
          if n >= limit then return done(c, {out, ''}) end
        end
        if looked >= budget then break end
      end
    end
  end
  return done(c, {out, last or ''})
end)

-- The shard's queued runs of the workflows ARGV[7..] (of owner ARGV[5] if ARGV[4] is
-- '1'), newest first, at most ARGV[6], as list returns them; from the shard's queues,
-- not its history, so it costs the runs queued here, however many runs it keeps.
-- With limit 0 it only counts them (ZCARDs): the caller reads the queues when that is
-- cheap, and walks the history when a backlog makes it the dearer way.
register('list_queued', function(keys, argv)
  local c = ctx(keys, argv)
  local has_owner, owner, limit = argv[4], argv[5], tonumber(argv[6])
  local members, count = {}, 0
  for i = 7, #argv do
    local wf = argv[i]
    local owners = {owner}
    if has_owner ~= '1' then
      owners = redis.call('ZRANGE', c.P .. K.owners .. kpart(wf), 0, -1)
      owners[#owners + 1] = ''  -- the default owner, in the rotation or solo
    end
    local seen = {}
    for _, o in ipairs(owners) do
      if not seen[o] then
        seen[o] = true
        if limit == 0 then
          count = count + redis.call('ZCARD', qkey(c, wf, o))
        else
          for _, m in ipairs(redis.call('ZRANGE', qkey(c, wf, o), 0, -1)) do
            members[#members + 1] = m
          end
        end
      end
    end
  end
  if limit == 0 then return done(c, tostring(count)) end
  table.sort(members, function(a, b) return a > b end)  -- "%012d:run": by submission
  local out, n = {}, 0
  for _, m in ipairs(members) do
    if n >= limit then break end
    local id = member_id(m)
    if redis.call('HGET', c.P .. K.run .. id, 'st') == 'queued' then
      out[#out + 1] = id
      out[#out + 1] = dump(c, id)
      n = n + 1
    end
  end
  return done(c, out)
end)

-- Single node only (it reads every shard's runs): the queued runs on the ready lists of
-- the workflows ARGV[6..] (of owner ARGV[4] if ARGV[3] is '1'), newest first (by
-- created_at, then submission), at most ARGV[5] and those tied with the last of them (the
-- caller orders ties by id); with ARGV[5] 0, how many entries the lists hold. KEYS[1] the
-- first one's hint prefix, ARGV[2] the namespace -> {run_id, run, ...} or the count
register('list_ready', function(keys, argv)
  local ns, has_owner, owner, limit = argv[2], argv[3], argv[4], tonumber(argv[5])
  if ns == '' then fail('INTERNAL', 'list_ready is for a single node') end
  if limit == 0 then
    local count = 0
    for i = 6, #argv do count = count + redis.call('LLEN', hint_prefix(ns, argv[i]) .. 'r') end
    return tostring(count)
  end
  if has_owner == '1' and owner ~= '' then return {} end  -- only the default owner's wait there
  local found = {}
  for i = 6, #argv do
    for _, e in ipairs(redis.call('LRANGE', hint_prefix(ns, argv[i]) .. 'r', 0, -1)) do
      local shard, id = split_entry(e)
      local P = shard_prefix(ns, shard)
      local f = redis.call('HMGET', P .. K.run .. id, 'st', 'q', 'ca', 'sq')
      if f[1] == 'queued' and f[2] == 'r' then
        found[#found + 1] = {tonumber(f[3]), tonumber(f[4]), id, P}
      end
    end
  end
  table.sort(found, function(a, b)
    if a[1] ~= b[1] then return a[1] > b[1] end
    return a[2] > b[2]
  end)
  local out = {}
  for i, x in ipairs(found) do
    local cut = found[limit]
    if i > limit and (x[1] ~= cut[1] or x[2] ~= cut[2]) then break end
    out[#out + 1] = x[3]
    out[#out + 1] = dump({P = x[4]}, x[3])
  end
  return out
end)

register('send_signal', function(keys, argv)
  local c = ctx(keys, argv)
  local list, id, name, payload = argv[4], argv[5], argv[6], argv[7]
  local r = require_live(c, id)
  redis.call('RPUSH', list, payload)
  redis.call('SADD', c.P .. K.signal_names .. id, name)
  if r.st == 'waiting' and r.ws == name then enqueue(c, r, c.now) end
  return done(c, '')
end)

register('child_ended', function(keys, argv)
  local c = ctx(keys, argv)
  local parent, child = argv[4], argv[5]
  local p = load_run(c, parent)
  if p ~= nil then
    redis.call('SADD', c.P .. K.kids_done .. parent, child)
    if p.st == 'waiting' and p.wc == child then enqueue(c, p, c.now) end
  end
  return done(c, '')
end)

-- Forget r, a run that ended: everything of it on this shard (UNLINK: a big journal is
-- freed in the background); its parent's child set and its idempotency key (elsewhere
-- on a cluster) through follow-ups.
local function forget(c, r)
  local id = r.id
  for _, name in ipairs(redis.call('SMEMBERS', c.P .. K.signal_names .. id)) do
    redis.call('UNLINK', c.P .. K.signal .. kpart(id) .. ':' .. name)
  end
  redis.call('UNLINK', c.P .. K.run .. id, c.P .. K.journal .. id, c.P .. K.signal_names .. id,
             c.P .. K.kids .. id, c.P .. K.kids_done .. id, c.P .. K.done .. id)
  redis.call('ZREM', c.P .. K.all, member(r))
  redis.call('ZREM', c.P .. K.ended, id)
  if r.pa then
    if redis.call('EXISTS', c.P .. K.run .. r.pa) == 1 then
      redis.call('SREM', c.P .. K.kids .. r.pa, id)
    else
      follow(c, 'drop_kid', r.pa, id)
    end
  end
  if r.ik then follow(c, 'drop_key', r.ik, id) end
end

-- The part of a run id before its first '.' (keys.py shard_root): an engine child run
-- "<parent>.<n>" has its parent's, so it lives on its parent's shard.
local function id_root(id)
  local dot = string.find(id, '.', 1, true)
  return dot and string.sub(id, 1, dot - 1) or id
end

register('delete_run', function(keys, argv)
  local c = ctx(keys, argv)
  local id = argv[4]
  local r = load_run(c, id)
  if r == nil then return done(c, '0') end
  if not TERMINAL[r.st] then
    fail('STATE', 'run ' .. id .. ' is ' .. r.st .. '; only a run that ended can be deleted')
  end
  forget(c, r)
  return done(c, '1')
end)

-- Put into the ended index the runs that ended without it: under a build that had none
-- (before an upgrade, or on an old-build worker during a rolling deploy). A walk over the
-- shard's listing index, oldest first, BACKFILL entries a call and round again at the
-- end; its place ("score member") is kept in P .. K.ended_scan.
local BACKFILL = 100

local function backfill(c)
  local key, idx = c.P .. K.ended_scan, c.P .. K.all
  local from = redis.call('GET', key)
  local min, after = '-inf', nil
  if from then
    local sp = string.find(from, ' ', 1, true)
    min, after = string.sub(from, 1, sp - 1), string.sub(from, sp + 1)
  end
  local looked, offset, last = 0, 0, nil
  while looked < BACKFILL do
    local chunk = redis.call('ZRANGE', idx, min, '+inf', 'BYSCORE', 'LIMIT', offset, 100,
                             'WITHSCORES')
    if #chunk == 0 then
      redis.call('DEL', key)  -- the walk is done: the next one starts over
      return
    end
    offset = offset + #chunk / 2
    for i = 1, #chunk, 2 do
      local m, score = chunk[i], chunk[i + 1]
      if after == nil or score ~= min or m > after then  -- (not seen by the last call)
        looked = looked + 1
        last = score .. ' ' .. m
        local id = member_id(m)
        local f = redis.call('HMGET', c.P .. K.run .. id, 'st', 'fa')
        if TERMINAL[f[1]] and f[2] then redis.call('ZADD', c.P .. K.ended, 'NX', f[2], id) end
        if looked >= BACKFILL then break end
      end
    end
  end
  redis.call('SET', key, last)
end

-- Forget up to ARGV[5] runs of this shard that ended before ARGV[4], those that ended
-- first first -> how many (after a step of the backfill above). A child run whose parent is still there (on this shard: an
-- engine child always is) is kept, for the parent may not have read its result yet; its
-- entry moves to now, so it is looked at again a retention later instead of at every
-- call. The ended index (end_run adds to it) may name a run that is gone or was retried
-- by a build that did not take it out: that entry just goes.
register('purge', function(keys, argv)
  local c = ctx(keys, argv)
  backfill(c)
  local ended = c.P .. K.ended
  local ids = redis.call('ZRANGEBYSCORE', ended, '-inf', '(' .. argv[4], 'LIMIT', 0,
                         tonumber(argv[5]))
  local n, now, cutoff = 0, fmt(c.now), tonumber(argv[4])
  for _, id in ipairs(ids) do
    local r = load_run(c, id)
    if r == nil or not TERMINAL[r.st] then
      redis.call('ZREM', ended, id)
    elseif r.fa == nil or tonumber(r.fa) >= cutoff then
      -- Retried and ended again by a build that kept the old entry: its real end counts.
      redis.call('ZADD', ended, r.fa or now, id)
    elseif r.pa and id_root(r.pa) == id_root(id)
        and redis.call('EXISTS', c.P .. K.run .. r.pa) == 1 then
      redis.call('ZADD', ended, now, id)
    else
      forget(c, r)
      n = n + 1
    end
  end
  return done(c, tostring(n))
end)

register('idem_reserve', function(keys, argv)
  local key = keys[1] .. K.idem .. argv[2]
  local existing = redis.call('HGETALL', key)
  if #existing > 0 then return {'exists', existing} end
  redis.call('HSET', key, 'id', argv[3], 'wf', argv[4], 'p', argv[5], 'ow', argv[6],
             'dl', argv[7], 'sa', argv[8], 'pa', argv[9], 'fk', argv[10], 'fr', argv[11],
             'fb', argv[12], 'fc', argv[13], 'ex', argv[14])
  return {'reserved', {}}
end)

register('idem_release', function(keys, argv)
  local key = keys[1] .. K.idem .. argv[2]
  if redis.call('HGET', key, 'id') == argv[3] then return redis.call('DEL', key) end
  return 0
end)
