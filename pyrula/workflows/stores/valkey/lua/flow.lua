-- flow.lua: rate limits and owner concurrency (shared by every shard, so kept in the
-- namespace's flow slot), and the shard leases workers spread the shards with.
--
-- Flow control (KEYS[1] the flow prefix "ns:{ns:flow}:"; buckets live in its hash "b"
-- as "tokens|updated_at", the maths of stores/flow.py):
--   flow_take   ARGV[2..] the owner's concurrency zset ('' no cap), run_id, cap, rate_key
--               ('' none), rate_per_second, rate_burst, lease_ttl
--               -> {'ok'} | {'cap'} | {'held'} | {'rate', next_token_at}; on 'ok' this
--               call gave the run a concurrency slot (member, scored by its lease expiry)
--               and a token; 'held': the run holds a slot already (another claimer took
--               it: it is theirs to run, and to free), nothing taken
--   flow_state  ARGV[2..] n, n concurrency zsets, then rate keys
--               -> {{running count, ...}, {bucket or '', ...}}
-- Shard leases (KEYS[1] the lease prefix "ns:{ns:leases}:"; "h" maps shard ->
-- "worker|expires", "w" scores live lease holders by expiry):
--   lease_tick     ARGV[2..] worker_id, ttl, shard_count -> the shards it now holds
--   lease_release  ARGV[2] worker_id -> how many shards it gave back

local function bucket_now(state, now, per_second, burst)
  if not state then return burst, now end
  local bar = string.find(state, '|', 1, true)
  local tokens = tonumber(string.sub(state, 1, bar - 1))
  local updated = tonumber(string.sub(state, bar + 1))
  return math.min(burst, tokens + math.max(0, now - updated) * per_second), now
end

register('flow_take', function(keys, argv)
  local now = now_of(argv[1])
  local cap_key, id, cap, rate_key = argv[2], argv[3], tonumber(argv[4]), argv[5]
  local per_second, burst = tonumber(argv[6]), tonumber(argv[7])
  local expires = fmt(now + tonumber(argv[8]))
  if cap_key ~= '' then
    redis.call('ZREMRANGEBYSCORE', cap_key, '-inf', fmt(now))
    if redis.call('ZSCORE', cap_key, id) then return {'held'} end
    if redis.call('ZCARD', cap_key) >= cap then return {'cap'} end
  end
  if rate_key ~= '' then
    local bkey = keys[1] .. 'b'
    local tokens, updated = bucket_now(redis.call('HGET', bkey, rate_key), now, per_second,
                                       burst)
    -- A token accruing within TOKEN_SLACK seconds is taken now (see stores/flow.py).
    if tokens < 1 - TOKEN_SLACK * per_second then
      return {'rate', fmt(updated + (1 - tokens) / per_second)}
    end
    redis.call('HSET', bkey, rate_key, fmt(math.max(0, tokens - 1)) .. '|' .. fmt(updated))
  end
  if cap_key ~= '' then redis.call('ZADD', cap_key, expires, id) end
  return {'ok'}
end)

register('flow_state', function(keys, argv)
  local now = now_of(argv[1])
  local n = tonumber(argv[2])
  local counts, buckets = {}, {}
  for i = 3, 2 + n do
    counts[#counts + 1] = redis.call('ZCOUNT', argv[i], '(' .. fmt(now), '+inf')
  end
  for i = 3 + n, #argv do
    buckets[#buckets + 1] = redis.call('HGET', keys[1] .. 'b', argv[i]) or ''
  end
  return {counts, buckets}
end)

register('lease_tick', function(keys, argv)
  local now = now_of(argv[1])
  local worker, ttl, count = argv[2], tonumber(argv[3]), tonumber(argv[4])
  local h, w = keys[1] .. 'h', keys[1] .. 'w'
  local expires = fmt(now + ttl)
  redis.call('ZREMRANGEBYSCORE', w, '-inf', fmt(now))
  redis.call('ZADD', w, expires, worker)
  local target = math.ceil(count / redis.call('ZCARD', w))
  local holders = {}
  local flat = redis.call('HGETALL', h)
  for i = 1, #flat, 2 do holders[tonumber(flat[i])] = flat[i + 1] end
  local mine, free = {}, {}
  for shard = 0, count - 1 do
    local v = holders[shard]
    if v == nil then
      free[#free + 1] = shard
    else
      local holder, until_ = string.match(v, '^(.*)|([^|]*)$')
      if tonumber(until_) <= now then
        free[#free + 1] = shard
      elseif holder == worker then
        mine[#mine + 1] = shard
      end
    end
  end
  while #mine > target do
    redis.call('HDEL', h, mine[#mine])
    mine[#mine] = nil
  end
  for _, shard in ipairs(free) do
    if #mine >= target then break end
    mine[#mine + 1] = shard
  end
  for _, shard in ipairs(mine) do redis.call('HSET', h, shard, worker .. '|' .. expires) end
  return mine
end)

register('lease_release', function(keys, argv)
  local h = keys[1] .. 'h'
  local flat = redis.call('HGETALL', h)
  local n = 0
  for i = 1, #flat, 2 do
    if string.match(flat[i + 1], '^(.*)|[^|]*$') == argv[2] then
      redis.call('HDEL', h, flat[i])
      n = n + 1
    end
  end
  redis.call('ZREM', keys[1] .. 'w', argv[2])
  return n
end)
