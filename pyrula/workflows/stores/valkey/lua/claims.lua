-- claims.lua: fair claiming on one shard, timers, and the shard hints claimers read.
--
-- Shard functions (contract in common.lua):
--   claim      ARGV[4..] workflow, worker_id, limit, lease_ttl, ahead (seconds: runs due by
--              then are taken too), then three counted lists:
--              n, n admitted run ids (through flow control already); m, m owners at
--              their concurrency cap; h, h (owner, rate_key) pairs out of tokens
--              -> {{run_id, packed run, ...}, blocked} where blocked is {} or the head run the
--              caller must pass through flow control first: {run_id, owner, rate_key,
--              rate_per_second, rate_burst, owner_concurrency}
--   fire       ARGV[4] limit -> how many sleeping/waiting runs were queued
--   claim_due  (single node) hint_read and claim in one call: see claim_due.lua
--   next_due   ARGV[4..] workflows -> per workflow {future_due, future_timer,
--              rate_heads, capped_future} (see Python's next_due_at)
--   sync       ARGV[4..] workflows -> ''   (recompute this shard's hints)
-- Hint functions (KEYS[1] a workflow's hint prefix "ns:{ns:w:<wf>}:", or the timer
-- hint prefix):
--   hint_read  ARGV[1] clock, ARGV[2] ahead -> "shard,shard,..." due by now + ahead; clears
--              the wake list
--   hint_set   ARGV[2..] shard, version, due, timer, wake, ... (cluster mode)
--   timer_hint_set  ARGV[2..] shard, version, timer
--   timer_due  ARGV[1] clock -> {shard, score, ...} whose earliest timer is due

-- Byte-wise a < b (Lua's own < follows the server's locale).
local function bytes_lt(a, b)
  for i = 1, math.min(#a, #b) do
    local x, y = string.byte(a, i), string.byte(b, i)
    if x ~= y then return x < y end
  end
  return #a < #b
end

-- An owner's first due run not held by a rate key in held (a set), within the window,
-- and, without held keys, whether the owner has another queued run after it (more) and
-- whether that one is due too (more_due). With held keys both are nil (not known).
local function effective_head(c, wf, owner, held)
  if held == nil then
    local two = redis.call('ZRANGE', qkey(c, wf, owner), 0, 1, 'WITHSCORES')
    if two[1] == nil or tonumber(two[2]) > c.due then return nil end
    return member_id(two[1]), two[3] ~= nil, two[3] ~= nil and tonumber(two[4]) <= c.now
  end
  local due = redis.call('ZRANGEBYSCORE', qkey(c, wf, owner), '-inf', fmt(c.due), 'LIMIT', 0,
                         RATE_SKIP_WINDOW)
  for _, m in ipairs(due) do
    local id = member_id(m)
    local key = redis.call('HGET', c.P .. K.run .. id, 'fk')
    if not key or not held[key] then return id end
  end
  return nil
end

-- The owner to serve next: lowest (turn, name) among those not skipped. Owners with
-- held rate keys have their turn computed from their effective head. first: the owners
-- zset's first 32 members with scores, when the caller has just read them.
local function next_owner(c, wf, okey, skip, held, first)
  local best, best_turn, best_head = nil, nil, nil
  local start = 0
  while best == nil do
    local chunk = first or redis.call('ZRANGE', okey, start, start + 31, 'WITHSCORES')
    first = nil
    if #chunk == 0 then break end
    for i = 1, #chunk, 2 do
      local o = chunk[i]
      if not skip[o] and not held[o] then
        best, best_turn = o, tonumber(chunk[i + 1])
        break
      end
    end
    start = start + 32
  end
  for o, keys in pairs(held) do
    if not skip[o] then
      local head = effective_head(c, wf, o, keys)
      if head == nil then
        skip[o] = true
      else
        local turn = tonumber(redis.call('HGET', c.P .. K.run .. head, 'sp') or '0')
        local served = redis.call('HGET', c.P .. K.served .. kpart(wf), o)
        if served then turn = math.max(turn, tonumber(served)) end
        if best == nil or turn < best_turn or (turn == best_turn and bytes_lt(o, best)) then
          best, best_turn, best_head = o, turn, head
        end
      end
    end
  end
  return best, best_head
end

-- r, queued and due, becomes running under a lease of worker's; the caller takes it out
-- of the queue indexes and adds it to the lease index (lz), or, with lz nil, has moved it
-- into the in-flight list (see list_entry). Its fencing token is one more than the
-- greater of its claim count and its last token, so a run's tokens only go up (terminate
-- moves the token on too: fence_token) and a claim costs no counter write.
-- The hot path of every claim: one HSET spelled out (no set_fields tables), r mirrored.
local function start_lease(c, r, worker, ttl, leases, lz)
  local now = fmt(c.now)
  local expires = fmt(c.now + ttl)
  local key = c.P .. K.run .. r.id
  r.st, r.wk, r.tk, r.le, r.ua = 'running', worker, fence_token(r), expires, now
  -- A run claimed ahead of its time starts at it (the worker holds it until then).
  r.cl, r.sa = tostring(tonumber(r.cl or '0') + 1), r.sa or (tonumber(r.aa) > c.now and r.aa or now)
  -- From the in-flight list: q = 'i'. From a shard: no q, unless a stale mark is left (a
  -- previous build queued it without clearing it): cleared, so that renewals and the
  -- finish use the shard's lease index.
  local q = nil
  if lz == nil then
    q = 'i'
  elseif r.q ~= nil and r.q ~= '' then
    q = ''
  end
  if q == nil then
    redis.call('HSET', key, 'st', r.st, 'wk', worker, 'tk', r.tk, 'le', expires, 'cl', r.cl,
               'ua', now, 'sa', r.sa)
  else
    r.q = q
    redis.call('HSET', key, 'st', r.st, 'wk', worker, 'tk', r.tk, 'le', expires, 'cl', r.cl,
               'ua', now, 'sa', r.sa, 'q', q)
  end
  if lz ~= nil then
    lz[#lz + 1] = expires
    lz[#lz + 1] = r.id
  end
  if r.ex or r.xe then
    redis.call('HDEL', key, 'ex', 'xe')
    r.ex, r.xe = nil, nil
  end
  leases[#leases + 1] = r.id
  leases[#leases + 1] = pack_run(r)
end

local function flow_blocked(r)
  return {r.id, r.ow, r.fk or '', r.fr or '', r.fb or '', r.fc or ''}
end

-- Expired before any worker started it: it ends, costing its owner no turn, and is
-- reported to the claimer as it ended (followup 'expired': Python's Claimed.expired).
local function expired(c, r)
  if r.ex and tonumber(r.ex) <= c.now then
    end_run(c, r, 'cancelled', {er = r.xe, xe = NIL})
    follow(c, 'expired', r.id, pack_run(r))
    return true
  end
  return false
end

-- One owner alone on the shard: FIFO from its queue, up to limit runs in one pass. The
-- DRR counter goes up once for the whole batch, not once per run: with no other owner
-- queued, no turn lies between the two, so every later comparison comes out the same.
-- lone: the owner is the solo default owner (see solo() in common.lua), outside the
-- owners zset: no counter, turn or served stamp to keep.
local function claim_alone(c, wf, owner, worker, limit, ttl, admitted, lone)
  local w = kpart(wf)
  local q = qkey(c, wf, owner)
  local leases, blocked, lz = {}, {}, {}
  local claimed, turn = 0, nil
  while true do
    local want = limit - claimed
    local got = redis.call('ZRANGE', q, 0, want, 'WITHSCORES')
    local members, ids = {}, {}
    local i = 1
    while i < #got and #ids < want and tonumber(got[i + 1]) <= c.due do
      local r = load_run(c, member_id(got[i]))
      if not expired(c, r) then
        if (r.fk or r.fc) and not admitted[r.id] then
          blocked = flow_blocked(r)
          break
        end
        if not lone then turn = turn or redis.call('INCR', c.P .. K.counter .. w) end
        start_lease(c, r, worker, ttl, leases, lz)
        members[#members + 1] = got[i]
        ids[#ids + 1] = r.id
      end
      i = i + 2
    end
    if #ids > 0 then
      call_many('ZREM', q, members)
      if owner ~= '' then call_many('ZREM', c.P .. K.due .. w, ids) end  -- see first_due
      c.touched[wf] = true
      c.removed[wf] = true
      claimed = claimed + #ids
    end
    if got[i] ~= nil then
      c.keep[wf] = tonumber(got[i + 1]) <= c.now or nil
      if turn then redis.call('ZADD', c.P .. K.owners .. w, turn, owner) end
      if lone then c.solo_due[wf] = got[i + 1] end
      break
    elseif #got < 2 * (want + 1) then
      if not lone then redis.call('ZREM', c.P .. K.owners .. w, owner) end  -- queue empty
      c.keep[wf] = nil
      if lone then c.solo_due[wf] = '' end
      break
    end
    -- Every fetched run was claimed or had expired, and more may be queued: go on.
  end
  if turn then redis.call('HSET', c.P .. K.served .. w, owner, turn) end
  call_many('ZADD', c.P .. K.leases, lz)
  return leases, blocked
end

-- Claim up to limit runs of wf on c's shard, fairly across its owners. Returns the
-- leases {run_id, packed run, ...} and blocked ({} or the head run that must pass flow
-- control first: {run_id, owner, rate_key, rate_per_second, rate_burst, cap}).
local function claim_shard(c, wf, worker, limit, ttl, admitted, skip, held)
  local w = kpart(wf)
  local okey = c.P .. K.owners .. w
  local first = redis.call('ZRANGE', okey, 0, 31, 'WITHSCORES')
  local plain = next(skip) == nil and next(held) == nil
  if #first == 0 then
    -- Only the default owner can have runs here, solo (see solo() in common.lua).
    if plain then return claim_alone(c, wf, '', worker, limit, ttl, admitted, true) end
    if skip[''] or redis.call('EXISTS', qkey(c, wf, '')) == 0 then return {}, {} end
    -- Flow control held some of its runs: the DRR path below handles that; it joins.
    redis.call('ZADD', okey, redis.call('GET', c.P .. K.counter .. w) or '0', '')
    first = nil
  elseif plain and #first == 2 then
    if first[1] == '' then
      redis.call('ZREM', okey, '')  -- alone again: solo from now on
      return claim_alone(c, wf, '', worker, limit, ttl, admitted, true)
    end
    return claim_alone(c, wf, first[1], worker, limit, ttl, admitted, false)
  end
  local leases, blocked, lz = {}, {}, {}
  local claimed = 0
  while claimed < limit do
    local owner, head = next_owner(c, wf, okey, skip, held, first)
    first = nil
    if owner == nil then break end
    local more, more_due = nil, nil
    if head == nil then head, more, more_due = effective_head(c, wf, owner, nil) end
    if head == nil then
      skip[owner] = true
    else
      local r = load_run(c, head)
      if expired(c, r) then
        -- ended: nothing else to do
      elseif (r.fk or r.fc) and not admitted[r.id] then
        blocked = flow_blocked(r)
        break
      else
        local counter = redis.call('INCR', c.P .. K.counter .. w)
        redis.call('HSET', c.P .. K.served .. w, owner, counter)
        redis.call('ZREM', qkey(c, wf, owner), member(r))
        if owner ~= '' then redis.call('ZREM', c.P .. K.due .. w, r.id) end
        if more == nil then
          refresh_owner(c, wf, owner)
        elseif more then
          -- Its next run was stamped before this claim: the turn is the claim's counter.
          redis.call('ZADD', okey, counter, owner)
        else
          redis.call('ZREM', okey, owner)
        end
        c.touched[wf] = true
        c.removed[wf] = true
        c.keep[wf] = more_due or nil
        start_lease(c, r, worker, ttl, leases, lz)
        claimed = claimed + 1
      end
    end
  end
  call_many('ZADD', c.P .. K.leases, lz)
  return leases, blocked
end

register('claim', function(keys, argv)
  local c = ctx(keys, argv)
  local wf, worker, limit, ttl = argv[4], argv[5], tonumber(argv[6]), tonumber(argv[7])
  c.due = c.now + tonumber(argv[8])
  local i = 9
  local admitted, skip, held = {}, {}, {}
  for j = 1, tonumber(argv[i]) do admitted[argv[i + j]] = true end
  i = i + tonumber(argv[i]) + 1
  for j = 1, tonumber(argv[i]) do skip[argv[i + j]] = true end
  i = i + tonumber(argv[i]) + 1
  for j = 1, tonumber(argv[i]) do
    local owner, key = argv[i + 2 * j - 1], argv[i + 2 * j]
    held[owner] = held[owner] or {}
    held[owner][key] = true
  end
  local leases, blocked = claim_shard(c, wf, worker, limit, ttl, admitted, skip, held)
  return done(c, {leases, blocked})
end)

register('fire', function(keys, argv)
  local c = ctx(keys, argv)
  local due = redis.call('ZRANGEBYSCORE', c.P .. K.all_timers, '-inf', fmt(c.now), 'LIMIT', 0,
                         tonumber(argv[4]))
  table.sort(due)  -- all are queued as of now: FIFO by submission ("%012d:run" members)
  for _, m in ipairs(due) do enqueue(c, load_run(c, member_id(m)), c.now) end
  return done(c, tostring(#due))
end)

local FUTURE_SCAN = 64

register('next_due', function(keys, argv)
  local c = ctx(keys, argv)
  local out = {}
  for i = 4, #argv do
    local wf = argv[i]
    local w = kpart(wf)
    local after = '(' .. fmt(c.now)
    -- Queued runs not yet due: the first one without an owner cap decides; capped ones
    -- before it are returned so the caller can check their cap.
    -- The named owners' due index and the default owner's queue (see first_due).
    local future, capped = '', {}
    for k, key in ipairs({c.P .. K.due .. w, qkey(c, wf, '')}) do
      local ids = redis.call('ZRANGEBYSCORE', key, after, '+inf', 'WITHSCORES', 'LIMIT', 0,
                             FUTURE_SCAN)
      for j = 1, #ids, 2 do
        local id = ids[j]
        if k == 2 then id = member_id(id) end  -- a queue's member
        local f = redis.call('HMGET', c.P .. K.run .. id, 'ow', 'fc')
        if f[2] then
          for _, x in ipairs({ids[j + 1], f[1], f[2]}) do capped[#capped + 1] = x end
        else
          if future == '' or tonumber(ids[j + 1]) < tonumber(future) then
            future = ids[j + 1]
          end
          break
        end
      end
    end
    -- Due owner heads held by a rate limit become due when their bucket refills.
    local heads = {}
    local owners = redis.call('ZRANGE', c.P .. K.owners .. w, 0, -1)
    if #owners == 0 then owners = {''} end  -- the solo default owner, if it has runs
    for _, owner in ipairs(owners) do
      local head = redis.call('ZRANGE', qkey(c, wf, owner), 0, 0, 'WITHSCORES')
      if head[1] ~= nil and tonumber(head[2]) <= c.now then
        local f = redis.call('HMGET', c.P .. K.run .. member_id(head[1]), 'fk', 'fr', 'fb', 'fc')
        if f[1] then
          for _, x in ipairs({head[2], owner, f[1], f[2], f[3], f[4] or ''}) do
            heads[#heads + 1] = x
          end
        end
      end
    end
    local timer = redis.call('ZRANGEBYSCORE', c.P .. K.timers .. w, after, '+inf', 'WITHSCORES',
                             'LIMIT', 0, 1)[2] or ''
    out[#out + 1] = {future, timer, heads, capped}
  end
  return done(c, out)
end)

register('sync', function(keys, argv)
  local c = ctx(keys, argv)
  for i = 4, #argv do
    c.touched[argv[i]] = true
    c.tt[argv[i]] = true
  end
  c.timers = true
  return done(c, '')
end)

register('hint_read', function(keys, argv)
  local due = now_of(argv[1]) + tonumber(argv[2])
  redis.call('DEL', keys[1] .. 'wake')
  -- One string, not an array: a client parses one reply element far faster than 64.
  return table.concat(redis.call('ZRANGEBYSCORE', keys[1] .. 'd', '-inf', fmt(due)), ',')
end)

register('hint_set', function(keys, argv)
  for i = 2, #argv, 5 do
    apply_hint_at(keys[1], argv[i], argv[i + 1], argv[i + 2], argv[i + 3], argv[i + 4])
  end
  return 1
end)

register('timer_hint_set', function(keys, argv)
  for i = 2, #argv, 3 do
    apply_hint_at(keys[1], argv[i], argv[i + 1], argv[i + 2], nil, nil)
  end
  return 1
end)

register('timer_due', function(keys, argv)
  return redis.call('ZRANGEBYSCORE', keys[1] .. 'd', '-inf', fmt(now_of(argv[1])), 'WITHSCORES')
end)
