-- events.lua: batch triggers' event buffers and named cursors (stores/base.py, "batch
-- triggers and cursors"). None of these touch a shard; each works on one slot of its own.
--
-- Buffers (KEYS[1] a trigger's prefix "ns:{ns:ev:<n>:<trigger>}:"; EV.events is its
-- list, oldest first, EV.seq its counter):
--   events_append   ARGV[2..] payloads -> the first one's seq (0: none given)
--   events_consume  ARGV[2..] first_seq, count -> 1 | 0
-- read_events is a plain LRANGE of the list (events.py), get_cursor a plain GET.
--
-- A buffer is a list of "seq|created_at|payload" entries rather than a stream: the
-- oldest `limit` are one LRANGE (O(limit)), consuming `count` is one LTRIM (O(count)),
-- and a list entry costs a few bytes beside its payload where a stream entry also keeps
-- field names and ids. The counter is a key of its own that outlives an emptied list,
-- so seqs are never given out twice. Entries have no TTL: they stay until consumed.
-- Seqs are consecutive within a trigger (an append takes a range of the counter,
-- consume removes from the head), but consume still reads the head's own seq.
--
-- Cursors (KEYS[1] a cursor's key "ns:{ns:cur:<n>:<name>}:v", a string):
--   cursor_swap     ARGV[2..] has_expected ('1'/'0'), expected, value -> 1 | 0
--
-- Payloads and cursor values are opaque strings: never decoded, kept byte for byte.

local function seq_text(n) return string.format('%d', n) end

register('events_append', function(keys, argv)
  local P, now = keys[1], now_of(argv[1])
  local n = #argv - 1
  if n <= 0 then return 0 end
  local last = redis.call('INCRBY', P .. EV.seq, n)
  local first = last - n + 1
  local stamp = '|' .. fmt(now) .. '|'
  local entries = {}
  for i = 1, n do entries[i] = seq_text(first + i - 1) .. stamp .. argv[i + 1] end
  call_many('RPUSH', P .. EV.events, entries)
  return first
end)

register('events_consume', function(keys, argv)
  local key = keys[1] .. EV.events
  local first, count = tonumber(argv[2]), tonumber(argv[3])
  if first == nil or count == nil or count <= 0 then return 0 end
  if redis.call('LLEN', key) < count then return 0 end
  local head = redis.call('LINDEX', key, 0)
  local bar = string.find(head, '|', 1, true)
  if tonumber(string.sub(head, 1, bar - 1)) ~= first then return 0 end
  redis.call('LTRIM', key, count, -1)
  return 1
end)

register('cursor_swap', function(keys, argv)
  local has_expected, expected, value = argv[2], argv[3], argv[4]
  local current = redis.call('GET', keys[1])
  if has_expected == '1' then
    if current ~= expected then return 0 end
  elseif current then
    return 0
  end
  redis.call('SET', keys[1], value)
  return 1
end)
