-- purge.lua: purging the runs of a workflow that wait to start (Python's purging.py,
-- ValkeyStore's queued_purge.py), a page at a time, each page one atomic call.
--
-- A run is purged when it is queued, never started (no started_at) and was created at
-- or before the time the purge began: it ends as cancel() leaves a queued run
-- (cancelled, cancel_requested), and so do its descendants. Others (started once and
-- queued again, or sent since) are kept, and each call resumes just after the last
-- run it kept: no call reads again what an earlier one read, so a page costs the runs
-- it reads, however long the queue.
--
--   purge_queued  shard function (contract in common.lua) ARGV[4..] workflow, began,
--                 limit, from_default, from_named -> {purged, next_default, next_named,
--                 more ('1' when either queue may have runs left to read)}
--                 (the default owner's queue, then the named owners' due index; a
--                 place is '' (from the start) or "score member", the last run kept)
--   purge_ready   (single node) KEYS[1] the workflow's hint prefix; ARGV[2..] namespace,
--                 began, limit, from_entry, from_index -> {{purged, next_entry,
--                 next_index, more}, {}, {}, followups}: the ready list, from its head

local PURGE_TOMB = '-:purged'  -- a ready-list entry on its way out (parses as an entry)

-- Whether a run (HMGET st, q, sa, ca) waits to start and was sent by began; on_list
-- says where it must wait: the ready list (q 'r') or a shard's queue (no q).
local function purgeable(f, began, on_list)
  if f[1] ~= 'queued' or f[3] or tonumber(f[4]) > began then return false end
  if on_list then return f[2] == 'r' end
  return f[2] == false or f[2] == ''
end

-- End r (queued, loaded in full) as cancel does, then its descendants.
local function purge_run(c, r)
  end_run(c, r, 'cancelled', {cr = '1'})
  local out = {runs = {}, away = {}}
  tree(c, r.id, out)
  cancel_runs(c, out)
end

-- Purge from key (the default owner's queue, members "%012d:run", or with by_id the due
-- index of the named owners, members run ids) after from ('' or "score member": the last
-- run kept), reading at most limit runs -> purged, runs read, the next from, done.
local function purge_zset(c, key, by_id, named, began, limit, from)
  if limit <= 0 then return 0, 0, from, false end
  local start = 0
  if from ~= '' then
    local sp = string.find(from, ' ', 1, true)
    local rank = redis.call('ZRANK', key, string.sub(from, sp + 1))
    -- The run kept last left meanwhile (claimed, cancelled): from its score on (at most
    -- the runs of that very score are read again, and kept again).
    start = rank and rank + 1 or redis.call('ZCOUNT', key, '-inf', '(' .. string.sub(from, 1, sp - 1))
  end
  local got = redis.call('ZRANGE', key, start, start + limit - 1, 'WITHSCORES')
  local purged = 0
  for i = 1, #got, 2 do
    local m = got[i]
    local id = by_id and m or member_id(m)
    local f = redis.call('HMGET', c.P .. K.run .. id, 'st', 'q', 'sa', 'ca', 'ow')
    if purgeable(f, began, false) and (f[5] ~= '') == named then
      purge_run(c, load_run(c, id))  -- (a descendant purged before it is not queued)
      purged = purged + 1
    else
      from = got[i + 1] .. ' ' .. m
    end
  end
  return purged, #got / 2, from, #got < 2 * limit
end

register('purge_queued', function(keys, argv)
  local c = ctx(keys, argv)
  local wf, began, limit = argv[4], tonumber(argv[5]), tonumber(argv[6])
  local w = kpart(wf)
  local purged, read, from_default, done_default = purge_zset(
    c, qkey(c, wf, ''), false, false, began, limit, argv[7])
  local more, from_named, done_named = 0, argv[8], false
  if done_default then
    more, read, from_named, done_named = purge_zset(
      c, c.P .. K.due .. w, true, true, began, limit - read, argv[8])
  end
  local left = (done_default and done_named) and '0' or '1'
  return done(c, {tostring(purged + more), from_default, from_named, left})
end)

register('purge_ready', function(keys, argv)
  local hp, ns, began, limit = keys[1], argv[2], tonumber(argv[3]), tonumber(argv[4])
  local from, at = argv[5], tonumber(argv[6])
  if ns == '' then fail('INTERNAL', 'purge_ready is for a single node') end
  local list = hp .. 'r'
  -- Just after the entry kept last: at its index unless claims took entries before it
  -- meanwhile (then found again; from the head if it is gone too).
  local start = 0
  if from ~= '' then
    if redis.call('LINDEX', list, at) == from then
      start = at + 1
    else
      local pos = redis.call('LPOS', list, from)
      start = pos and pos + 1 or 0
    end
  end
  local got = redis.call('LRANGE', list, start, start + limit - 1)
  local now = now_of(argv[1])
  local shards, chosen, left = {}, {}, '1'
  -- First every entry to go becomes a tombstone, while the indexes still hold (ending a
  -- run's descendants may take other entries off the list).
  for i, e in ipairs(got) do
    local shard, id = split_entry(e)
    local c = shards[shard] or shard_ctx(shard_prefix(ns, shard), now, ns, shard)
    shards[shard] = c
    local f = redis.call('HMGET', c.P .. K.run .. id, 'st', 'q', 'sa', 'ca')
    if purgeable(f, began, true) then
      redis.call('LSET', list, start + i - 1, PURGE_TOMB)
      chosen[#chosen + 1] = {c, id}
    else
      from, at = e, start + i - 1 - #chosen
      -- Sent after the purge began: so was every entry behind it (the list is FIFO).
      if f[1] == 'queued' and tonumber(f[4]) > began then
        left = '0'
        break
      end
    end
  end
  local purged = 0
  for _, x in ipairs(chosen) do
    local r = load_run(x[1], x[2])
    if r ~= nil and r.st == 'queued' then  -- (not ended already, as the descendant of another)
      r.q = 'x'  -- its entry is a tombstone, which goes below with the others
      purge_run(x[1], r)
      purged = purged + 1
    end
  end
  if #chosen > 0 then redis.call('LREM', list, #chosen, PURGE_TOMB) end
  if #got < limit then left = '0' end
  local follow = {}
  for _, c in pairs(shards) do
    for _, x in ipairs(done(c, '')[4]) do follow[#follow + 1] = x end
  end
  return {{tostring(purged), from, tostring(at or 0), left}, {}, {}, follow}
end)
