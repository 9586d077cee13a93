-- admin.lua: schedules, worker heartbeats and the namespace's recorded settings.
-- None of these touch a shard; each works on one namespace-wide slot.
--
--   meta_check      KEYS[1] the meta hash; ARGV[2..] field, value pairs
--                   -> the recorded value of each field (the given one if it was unset)
--   heartbeat       KEYS[1] the workers hash; ARGV[2..] its sequence counter key,
--                   worker_id, info -> ''   (stored "last_seen|first_seen_seq|info")
-- Schedules (KEYS[1] the schedule prefix "ns:{ns:sched}:"; a schedule is the hash
-- "s:<id>", "next" holds enabled ones by next_fire_at, "ids" every id, and the stream
-- "chg" (one entry, MAXLEN 1) gets an entry on every create, update and delete: its
-- last id is the change marker schedule loops block on with XREAD):
--   sched_create    ARGV[2..] id, replace, enabled, next_fire_at, has_last, last_fire_at,
--                   last_run_id ('' none), then field, value pairs of the definition
--                   -> schedule (a replace keeps the stored lf and lr)
--   sched_update    ARGV[2..] id, enabled ('' keep), has_params, params,
--                   next_fire_at ('' keep) -> schedule
--   sched_delete    ARGV[2] id -> 1 | 0
--   sched_due       ARGV[2] limit -> {schedule, ...} due, earliest first
--   sched_list      -> {schedule, ...} ordered by id
--   sched_fire      ARGV[2..] id, expected_next, fired_slot, next_fire_at, run_id
--                   -> 1 | 0; run_id is the run holding the slot (kept as lr), or ''
--                   to skip the slot (overlap 'skip'): only nf moves, lf and lr stay

register('meta_check', function(keys, argv)
  local out = {}
  for i = 2, #argv, 2 do
    redis.call('HSETNX', keys[1], argv[i], argv[i + 1])
    out[#out + 1] = redis.call('HGET', keys[1], argv[i])
  end
  return out
end)

register('heartbeat', function(keys, argv)
  local now = now_of(argv[1])
  local seq_key, worker, info = argv[2], argv[3], argv[4]
  local old = redis.call('HGET', keys[1], worker)
  local seq
  if old then
    local a = string.find(old, '|', 1, true)
    seq = string.sub(old, a + 1, string.find(old, '|', a + 1, true) - 1)
  else
    seq = tostring(redis.call('INCR', seq_key))
  end
  redis.call('HSET', keys[1], worker, fmt(now) .. '|' .. seq .. '|' .. info)
  return ''
end)

local function sched_changed(P)
  redis.call('XADD', P .. 'chg', 'MAXLEN', '1', '*', 'c', '1')
end

local function sched_index(P, id, enabled, next_fire_at)
  redis.call('ZADD', P .. 'ids', 0, id)
  if enabled == '1' then
    redis.call('ZADD', P .. 'next', next_fire_at, id)
  else
    redis.call('ZREM', P .. 'next', id)
  end
end

register('sched_create', function(keys, argv)
  local P, now = keys[1], now_of(argv[1])
  local id, replace, enabled, next_fire_at = argv[2], argv[3], argv[4], argv[5]
  local key = P .. 's:' .. id
  local old = redis.call('HMGET', key, 'ca', 'lf', 'lr')
  local exists = redis.call('EXISTS', key) == 1
  if exists and replace ~= '1' then fail('SCHEDEXISTS', id) end
  local created, last, last_run = fmt(now), nil, nil
  if argv[6] == '1' then last = argv[7] end
  if argv[8] ~= '' then last_run = argv[8] end
  if exists then created, last, last_run = old[1], old[2], old[3] end
  redis.call('DEL', key)
  local fields = {'en', enabled, 'nf', next_fire_at, 'ca', created, 'ua', fmt(now)}
  if last then
    fields[#fields + 1] = 'lf'
    fields[#fields + 1] = last
  end
  if last_run then
    fields[#fields + 1] = 'lr'
    fields[#fields + 1] = last_run
  end
  for i = 9, #argv do fields[#fields + 1] = argv[i] end
  redis.call('HSET', key, unpack(fields))
  sched_index(P, id, enabled, next_fire_at)
  sched_changed(P)
  return redis.call('HGETALL', key)
end)

register('sched_update', function(keys, argv)
  local P, now = keys[1], now_of(argv[1])
  local id, enabled, has_params, params, next_fire_at = argv[2], argv[3], argv[4], argv[5],
                                                         argv[6]
  local key = P .. 's:' .. id
  if redis.call('EXISTS', key) == 0 then fail('SCHEDNOTFOUND', id) end
  local fields = {'ua', fmt(now)}
  if enabled ~= '' then
    fields[#fields + 1] = 'en'
    fields[#fields + 1] = enabled
  end
  if has_params == '1' then
    fields[#fields + 1] = 'p'
    fields[#fields + 1] = params
  end
  if next_fire_at ~= '' then
    fields[#fields + 1] = 'nf'
    fields[#fields + 1] = next_fire_at
  end
  redis.call('HSET', key, unpack(fields))
  local state = redis.call('HMGET', key, 'en', 'nf')
  sched_index(P, id, state[1], state[2])
  sched_changed(P)
  return redis.call('HGETALL', key)
end)

register('sched_delete', function(keys, argv)
  local P, id = keys[1], argv[2]
  redis.call('ZREM', P .. 'ids', id)
  redis.call('ZREM', P .. 'next', id)
  local deleted = redis.call('DEL', P .. 's:' .. id)
  if deleted == 1 then sched_changed(P) end
  return deleted
end)

local function sched_records(P, ids)
  local out = {}
  for _, id in ipairs(ids) do out[#out + 1] = redis.call('HGETALL', P .. 's:' .. id) end
  return out
end

register('sched_due', function(keys, argv)
  local ids = redis.call('ZRANGEBYSCORE', keys[1] .. 'next', '-inf', fmt(now_of(argv[1])),
                         'LIMIT', 0, tonumber(argv[2]))
  return sched_records(keys[1], ids)
end)

register('sched_list', function(keys, argv)
  return sched_records(keys[1], redis.call('ZRANGE', keys[1] .. 'ids', 0, -1))
end)

register('sched_fire', function(keys, argv)
  local P, now = keys[1], now_of(argv[1])
  local id, expected, slot, next_fire_at, run_id = argv[2], argv[3], argv[4], argv[5], argv[6]
  local key = P .. 's:' .. id
  local state = redis.call('HMGET', key, 'en', 'nf')
  if state[1] ~= '1' or tonumber(state[2]) ~= tonumber(expected) then return 0 end
  if run_id == '' then
    redis.call('HSET', key, 'nf', next_fire_at, 'ua', fmt(now))  -- a skipped slot
  else
    redis.call('HSET', key, 'lf', slot, 'nf', next_fire_at, 'lr', run_id, 'ua', fmt(now))
  end
  redis.call('ZADD', P .. 'next', next_fire_at, id)
  return 1
end)
