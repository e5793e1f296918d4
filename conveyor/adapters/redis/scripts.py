"""Lua scripts: each runs atomically on the server, so checks and writes cannot interleave.

Lease values are ``"<token> <owner>"``; a script that is told the value its caller
holds refuses to act when the key holds anything else (fencing).
"""

# Acknowledgements carry their entry ids as one space-separated argument: redis-py
# packs each argument in Python (~0.5 µs apiece), a split in Lua costs next to nothing.
# Callers send at most 4000 ids per call (unpack's limit is ~8000).

# KEYS: stream, lease, fenced-acks counter. ARGV: group, lease value, "id id ...".
# Returns the number acknowledged, or -1 when the caller's lease is gone.
ACK_FENCED = """
local ids = {}
for id in string.gmatch(ARGV[3], '%S+') do ids[#ids + 1] = id end
if redis.call('GET', KEYS[2]) ~= ARGV[2] then
  redis.call('HINCRBY', KEYS[3], ARGV[2], #ids)
  return -1
end
local n = 0
if #ids > 0 then n = redis.call('XACK', KEYS[1], ARGV[1], unpack(ids)) end
local t = redis.call('TIME')
return {n, t[1], t[2]}
"""

# KEYS: stream. ARGV: group, "id id ...". Unfenced (no lease): the number acknowledged.
ACK = """
local ids = {}
for id in string.gmatch(ARGV[2], '%S+') do ids[#ids + 1] = id end
if #ids == 0 then return 0 end
return redis.call('XACK', KEYS[1], ARGV[1], unpack(ids))
"""

# Publishing, idempotently. KEYS: stream, marker ("PREFIX:pub:{STREAM}:BATCHID", the
# stream's name as its hash tag: both keys live in one cluster slot). ARGV: marker ttl
# ms, then per entry: the number of its extra fields (cv-attempt, user headers: names
# and values), cv-ns, cv-key, cv-id, content-type, cv-ts, body, the extra fields.
# A batch already written (the marker exists: a retry whose first attempt landed but
# whose reply was lost) writes nothing and returns what the first attempt returned.
# Returns {ids, replayed}: the new entry ids as runs "MS-SEQ COUNT ..." (one run unless
# the clock ticked during the batch), replayed 1 when nothing was written.
# The metadata's field names are written here, not sent: redis-py packs every argument
# in Python (~0.5 us each), and the fields as separate arguments cost Redis far less
# than one packed argument cut up in Lua (3.5 against 11 us an entry, measured).
ENQUEUE = """
local done = redis.call('GET', KEYS[2])
if done then return {done, 1} end
local call, stream, ids, n, i, argc = redis.call, KEYS[1], {}, 0, 2, #ARGV
while i <= argc do
  local extra = tonumber(ARGV[i])
  n = n + 1
  ids[n] = call('XADD', stream, '*', 'cv-ns', ARGV[i + 1], 'cv-key', ARGV[i + 2],
                'cv-id', ARGV[i + 3], 'content-type', ARGV[i + 4], 'cv-ts', ARGV[i + 5],
                'body', ARGV[i + 6], unpack(ARGV, i + 7, i + 6 + extra))
  i = i + 7 + extra
end
if n == 0 then return {'', 0} end
local function split(id)
  local dash = string.find(id, '-', 1, true)
  local seq = string.sub(id, dash + 1)
  return string.sub(id, 1, dash - 1), #seq <= 15 and tonumber(seq) or nil
end
local first_ms, first_seq = split(ids[1])
local last_ms, last_seq = split(ids[n])
local result
if first_ms == last_ms and first_seq and last_seq and last_seq - first_seq == n - 1 then
  result = ids[1] .. ' ' .. n  -- one run: ids within one ms rise by one
else
  local runs, start, count, prev_ms, prev_seq = {}, ids[1], 1, first_ms, first_seq
  for k = 2, n do
    local ms, seq = split(ids[k])
    if ms == prev_ms and seq and prev_seq and seq == prev_seq + 1 then
      count = count + 1
    else
      runs[#runs + 1] = start .. ' ' .. count
      start, count = ids[k], 1
    end
    prev_ms, prev_seq = ms, seq
  end
  runs[#runs + 1] = start .. ' ' .. count
  result = table.concat(runs, ' ')
end
redis.call('SET', KEYS[2], result, 'PX', ARGV[1])
return {result, 0}
"""

# Storing dead letters, idempotently like ENQUEUE. KEYS: dead-letter stream, marker
# ("PREFIX:dlq-batch:{DLQ STREAM}:BATCHID", in the stream's slot). ARGV: marker ttl ms,
# max entries (0: unbounded), then per letter: its number of fields x 2, the fields.
# A batch already stored (its reply was lost, the call retried) stores nothing again.
# Returns how many letters the exact MAXLEN trim evicted (0 on a replay).
DEAD_LETTER = """
if redis.call('GET', KEYS[2]) then return 0 end
local i, argc = 3, #ARGV
while i <= argc do
  local n = tonumber(ARGV[i])
  redis.call('XADD', KEYS[1], '*', unpack(ARGV, i + 1, i + n))
  i = i + 1 + n
end
redis.call('SET', KEYS[2], '1', 'PX', ARGV[1])
if tonumber(ARGV[2]) > 0 then
  return redis.call('XTRIM', KEYS[1], 'MAXLEN', '=', ARGV[2])
end
return 0
"""

# KEYS: stream, lease. ARGV: group, consumer, lease value ('' = unleased), count.
# Moves every pending entry of the group to this consumer: {claimed, deleted}, deleted
# being the pending entries no longer in the stream (XDEL, XTRIM by another client),
# which Redis >= 7 drops from the pending list as it claims; -1 when the lease is gone.
CLAIM_ALL = """
if ARGV[3] ~= '' and redis.call('GET', KEYS[2]) ~= ARGV[3] then return -1 end
local cursor, n, gone = '0-0', 0, 0
repeat
  local r = redis.call('XAUTOCLAIM', KEYS[1], ARGV[1], ARGV[2], 0, cursor,
                       'COUNT', ARGV[4], 'JUSTID')
  cursor = r[1]
  n = n + #r[2]
  if r[3] then gone = gone + #r[3] end
until cursor == '0-0'
return {n, gone}
"""

# KEYS: stream, lease. ARGV: group, consumer, lease value ('' = unleased), "id id ...".
# XCLAIM ... RETRYCOUNT 0 JUSTID of unstarted entries, so that the next owner counts them
# as first deliveries: the number claimed, or -1 (nothing done) when the lease is gone:
# a daemon stalled past its lease must not pull entries back from the new owner.
HAND_BACK = """
if ARGV[3] ~= '' and redis.call('GET', KEYS[2]) ~= ARGV[3] then return -1 end
local args = {'XCLAIM', KEYS[1], ARGV[1], ARGV[2], 0}
for id in string.gmatch(ARGV[4], '%S+') do args[#args + 1] = id end
if #args == 5 then return 0 end
args[#args + 1] = 'RETRYCOUNT'
args[#args + 1] = 0
args[#args + 1] = 'JUSTID'
return #redis.call(unpack(args))
"""

# KEYS: stream, lease. ARGV: group, consumer, lease value, count.
# Entries pending for another consumer of the group than the lease holder: read by a
# daemon that stalled between checking its lease and its read reaching the server, after
# the new owner's claim (see RedisReceiver.get_messages). Up to `count` of them, read, not
# claimed: flat triples of id, fields (false: deleted meanwhile), times delivered. -1 when
# the lease is gone. Nothing is moved, so a lost reply strands nothing: the owner's
# acknowledgement takes an entry out of whichever consumer's list holds it.
STRAYS = """
if redis.call('GET', KEYS[2]) ~= ARGV[3] then return -1 end
local summary = redis.pcall('XPENDING', KEYS[1], ARGV[1])
local out, left = {}, tonumber(ARGV[4])
-- No stream or group (deleted): nothing pending; the next read re-creates the group.
if summary.err or summary[1] == 0 or not summary[4] then return out end
for _, c in ipairs(summary[4]) do
  if c[1] ~= ARGV[2] and left > 0 then
    for _, row in ipairs(redis.call('XPENDING', KEYS[1], ARGV[1], '-', '+', left, c[1])) do
      local e = redis.call('XRANGE', KEYS[1], row[1], row[1])
      out[#out + 1] = row[1]
      out[#out + 1] = e[1] and e[1][2] or false
      out[#out + 1] = row[4]
      left = left - 1
    end
  end
end
return out
"""

# KEYS: stream. ARGV: newest ms that may be trimmed (retention).
# Trims entries below every group's floor: its oldest pending entry, or, with nothing
# pending, the entry after its last delivered one. Nothing unread is ever trimmed.
# Ids are handled as strings: Lua numbers are doubles, exact only below 2^53, and a
# group rewound to a point in time sits at "<ms>-18446744073709551615" (the last id of
# that ms), whose successor is "<ms+1>-0". A sequence too long to add to exactly is
# kept as it is (one entry fewer trimmed, never one too many).
TRIM_ACKED = """
if redis.call('EXISTS', KEYS[1]) == 0 then return 0 end
local groups = redis.call('XINFO', 'GROUPS', KEYS[1])
if #groups == 0 then return 0 end
local best_ms, best_seq = tonumber(ARGV[1]), 0
local best = ARGV[1] .. '-0'
for _, g in ipairs(groups) do
  local name, last
  for i = 1, #g, 2 do
    if g[i] == 'name' then name = g[i + 1] elseif g[i] == 'last-delivered-id' then
      last = g[i + 1] end
  end
  local p = redis.call('XPENDING', KEYS[1], name)
  local id, inc = last, true
  if p[1] > 0 then id, inc = p[2], false end
  local dash = string.find(id, '-', 1, true)
  local ms_s, seq_s = string.sub(id, 1, dash - 1), string.sub(id, dash + 1)
  if inc then
    if seq_s == '18446744073709551615' then
      ms_s, seq_s = string.format('%.0f', tonumber(ms_s) + 1), '0'
    elseif #seq_s <= 15 then
      seq_s = string.format('%.0f', tonumber(seq_s) + 1)
    end
  end
  local ms, seq = tonumber(ms_s), tonumber(seq_s)
  if ms < best_ms or (ms == best_ms and seq < best_seq) then
    best_ms, best_seq, best = ms, seq, ms_s .. '-' .. seq_s
  end
end
if best_ms <= 0 and best_seq <= 0 then return 0 end
return redis.call('XTRIM', KEYS[1], 'MINID', best)
"""

# KEYS: stream. ARGV: group, at most how many entries to count. Entries added after the
# group's position that are gone before it read them: an XTRIM (MAXLEN, MINID) by
# another client deletes a prefix of the stream, and once it reaches unread entries,
# Redis' lag of the group (entries added minus entries read) stays above the entries
# the stream holds after the group's position, for good. Conveyor trims nothing unread.
# Counted (XRANGE) only up to ARGV[2] entries, so a long backlog costs nothing: it is
# counted once it is shorter. Returns how many are gone (0: none, or not known now: a
# backlog longer than that; lag nil after an XDEL ahead of the group; a position past
# the last id, set by a rewind forward), after setting the group's read counter
# (XGROUP SETID ... ENTRIESREAD, the position unchanged) so that its lag is what is
# left: each loss is counted once.
UNREAD_DELETED = """
if redis.call('EXISTS', KEYS[1]) == 0 then return 0 end
local lag, last = false, false
for _, g in ipairs(redis.call('XINFO', 'GROUPS', KEYS[1])) do
  local name, l, d
  for i = 1, #g, 2 do
    if g[i] == 'name' then name = g[i + 1]
    elseif g[i] == 'lag' then l = g[i + 1]
    elseif g[i] == 'last-delivered-id' then d = g[i + 1] end
  end
  if name == ARGV[1] then lag, last = l, d end
end
if not lag or lag == 0 then return 0 end
local cap = tonumber(ARGV[2])
local unread = #redis.call('XRANGE', KEYS[1], '(' .. last, '+', 'COUNT', cap)
if unread >= lag or unread == cap then return 0 end
local info = redis.call('XINFO', 'STREAM', KEYS[1])
local added, top
for i = 1, #info, 2 do
  if info[i] == 'entries-added' then added = info[i + 1]
  elseif info[i] == 'last-generated-id' then top = info[i + 1] end
end
local function parts(id)
  local dash = string.find(id, '-', 1, true)
  return tonumber(string.sub(id, 1, dash - 1)), string.sub(id, dash + 1)
end
local lms, lseq = parts(last)
local tms, tseq = parts(top)
if lms > tms or (lms == tms and (#lseq > #tseq or (#lseq == #tseq and lseq > tseq))) then
  return 0
end
redis.call('XGROUP', 'SETID', KEYS[1], ARGV[1], last, 'ENTRIESREAD', added - unread)
return lag - unread
"""

# KEYS: stream. ARGV: first id (exclusive), last id (inclusive), at most how many.
# Counts entries in (first, last] without sending them: {count, id of the last counted}
# (the id is '' when none). Callers count a long range in bounded steps.
COUNT_RANGE = """
local r = redis.call('XRANGE', KEYS[1], '(' .. ARGV[1], ARGV[2], 'COUNT', ARGV[3])
if #r == 0 then return {0, ''} end
return {#r, r[#r][1]}
"""

# KEYS: the queue's delivery records (Keys.starts). ARGV: the start's field, the hash's
# ttl in s, a recorded stall's field. Counts a redelivered message's start and returns
# {starts, the recorded stall or false}: one round trip where three were.
COUNT_START = """
local n = redis.call('HINCRBY', KEYS[1], ARGV[1], 1)
redis.call('EXPIRE', KEYS[1], ARGV[2])
return {n, redis.call('HGET', KEYS[1], ARGV[3])}
"""

# KEYS: stream. {entries ever added, last generated id} from one XINFO STREAM;
# entries added is -1 on servers older than Redis 7 (no such counter).
STREAM_ADDED = """
local info = redis.call('XINFO', 'STREAM', KEYS[1])
local added, last = -1, '0-0'
for i = 1, #info, 2 do
  if info[i] == 'entries-added' then added = info[i + 1]
  elseif info[i] == 'last-generated-id' then last = info[i + 1] end
end
return {added, last}
"""

# KEYS: stream. {'stream', the id of its last entry ('0-0' when it has none)}, or
# {the key's type} where no stream is ('none': no key): the end a group's position is
# compared with (a group set past it by a rewind has nothing to read, whatever XINFO's
# lag says). XREVRANGE rather than XINFO STREAM, which reads the first entry too.
STREAM_TAIL = """
local kind = redis.call('TYPE', KEYS[1])['ok']
if kind ~= 'stream' then return {kind} end
local last = redis.call('XREVRANGE', KEYS[1], '+', '-', 'COUNT', 1)
if #last == 0 then return {kind, '0-0'} end
return {kind, last[1][1]}
"""

# KEYS: stream. {last generated id ('0-0' where no stream), the server's TIME}: where the
# next XADD * puts its entry (above that id, at the clock's ms at least), read on the
# stream's own node.
STREAM_NEXT = """
local last = '0-0'
if redis.call('EXISTS', KEYS[1]) == 1 then
  local info = redis.call('XINFO', 'STREAM', KEYS[1])
  for i = 1, #info, 2 do
    if info[i] == 'last-generated-id' then last = info[i + 1] end
  end
end
local t = redis.call('TIME')
return {last, t[1], t[2]}
"""

# Counters (fencing tokens, the leases' generation, the membership's version) must never
# repeat a value, even across a server that lost its data (restarted empty, a key
# evicted): a repeated token would let a stale owner's acknowledgements through the
# fence, a repeated generation or version could make a balancer believe nothing moved.
# So a missing counter starts at the server's clock in ms, past every value the lost one
# reached (it would have had to count faster than once a millisecond). seeded(key)
# creates it so and returns the key, for INCR or GET.
_SEEDED = """
local function seeded(key)
  if redis.call('EXISTS', key) == 0 then
    local t = redis.call('TIME')
    local ms = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
    redis.call('SET', key, string.format('%.0f', ms))
  end
  return key
end
"""

# KEYS: lease, fence counter, leases generation (left out on a cluster, where the
# caller bumps it apart). ARGV: owner, ttl ms.
# Returns {token} when granted, {0, pttl} when someone else holds it. A grant or a
# release counts in the generation, which balancers poll to know that nothing moved.
LEASE_ACQUIRE = _SEEDED + """
local held = redis.call('GET', KEYS[1])
if held then
  local owner = string.sub(held, string.find(held, ' ', 1, true) + 1)
  if owner ~= ARGV[1] then return {0, redis.call('PTTL', KEYS[1])} end
end
local token = redis.call('INCR', seeded(KEYS[2]))
redis.call('SET', KEYS[1], token .. ' ' .. ARGV[1], 'PX', ARGV[2])
if KEYS[3] then redis.call('INCR', seeded(KEYS[3])) end
return {token}
"""

# KEYS: a counter (the leases' generation on a cluster). Its next value.
COUNTER_BUMP = _SEEDED + """
return redis.call('INCR', seeded(KEYS[1]))
"""

# KEYS: a counter. Its value (created as seeded() does if missing).
COUNTER_READ = _SEEDED + """
return tonumber(redis.call('GET', seeded(KEYS[1])))
"""

# KEYS: lease. ARGV: lease value, ttl ms. 1 renewed, 0 held by another, -1 gone (it
# expired, or the server lost it: restarted empty, the key evicted).
LEASE_RENEW = """
local held = redis.call('GET', KEYS[1])
if held == ARGV[1] then
  redis.call('PEXPIRE', KEYS[1], ARGV[2])
  return 1
end
if held then return 0 end
return -1
"""

# KEYS: lease, leases generation (left out on a cluster). ARGV: lease value.
LEASE_RELEASE = _SEEDED + """
if redis.call('GET', KEYS[1]) == ARGV[1] then
  if KEYS[2] then redis.call('INCR', seeded(KEYS[2])) end
  return redis.call('DEL', KEYS[1])
end
return 0
"""

# Membership: KEYS members zset (id -> expiry, server clock), info hash (id -> json),
# view version counter. The version grows whenever the set of ids changes (a join, a
# leave, a lapse) and never on a heartbeat, so a daemon can poll it for a few bytes
# instead of reading every record. Every script first drops lapsed members. The counter
# is seeded (from the server's clock) only where it is about to change: a read of an app
# nobody runs (``conveyor status --app TYPO``) leaves no key behind, and reads 0.
_PRUNE = _SEEDED + """
local t = redis.call('TIME')
local now = t[1] * 1000 + math.floor(t[2] / 1000)
local gone = redis.call('ZRANGEBYSCORE', KEYS[1], '-inf', now)
if #gone > 0 then
  redis.call('ZREMRANGEBYSCORE', KEYS[1], '-inf', now)
  redis.call('HDEL', KEYS[2], unpack(gone))
  redis.call('INCR', seeded(KEYS[3]))
end
"""

# ARGV: id, info json, ttl ms ('' = leave).
MEMBER_PUT = _PRUNE + """
seeded(KEYS[3])
if ARGV[3] == '' then
  if redis.call('ZREM', KEYS[1], ARGV[1]) == 1 then redis.call('INCR', KEYS[3]) end
  redis.call('HDEL', KEYS[2], ARGV[1])
  return 0
end
if redis.call('ZADD', KEYS[1], now + tonumber(ARGV[3]), ARGV[1]) == 1 then
  redis.call('INCR', KEYS[3])
end
redis.call('HSET', KEYS[2], ARGV[1], ARGV[2])
return 1
"""

# Returns {version, id, info, id, info, ...} by id.
MEMBERS = _PRUNE + """
local ids = redis.call('ZRANGEBYSCORE', KEYS[1], '(' .. now, '+inf')
table.sort(ids)
local out = {tonumber(redis.call('GET', KEYS[3]) or '0')}
for _, id in ipairs(ids) do
  out[#out + 1] = id
  out[#out + 1] = redis.call('HGET', KEYS[2], id) or ''
end
return out
"""

# Returns {version, id, id, ...} by id, without the records.
MEMBER_IDS = _PRUNE + """
local ids = redis.call('ZRANGEBYSCORE', KEYS[1], '(' .. now, '+inf')
table.sort(ids)
table.insert(ids, 1, tonumber(redis.call('GET', KEYS[3]) or '0'))
return ids
"""

# Returns the view's version.
MEMBERS_VERSION = _PRUNE + """
return tonumber(redis.call('GET', KEYS[3]) or '0')
"""

# KEYS: dead-letter stream, queue stream. ARGV: letter id, then the message's fields.
# Replays one dead letter (``conveyor dlq replay``): the XADD and the XDEL happen together
# or not at all, so a replay killed at any point never loses or doubles a letter. Returns
# the new entry's id, or false when the letter is no longer stored (nothing published).
REPLAY_LETTER = """
if #redis.call('XRANGE', KEYS[1], ARGV[1], ARGV[1]) == 0 then return false end
local id = redis.call('XADD', KEYS[2], '*', unpack(ARGV, 2))
redis.call('XDEL', KEYS[1], ARGV[1])
return id
"""

# Cluster mode, where the dead-letter stream and the queue's stream live in different
# slots and no script can touch both. KEYS: queue stream, replay marker (in the
# stream's slot: "PREFIX:replayed:{STREAM}:APP:LETTER"). ARGV: marker ttl ms, then the
# message's fields. Appends the message unless the marker says this letter was appended
# already (a replay cut before it deleted the letter, run again), and returns the
# entry's id either way; the caller then deletes the letter.
REPLAY_MARKED = """
local done = redis.call('GET', KEYS[2])
if done then return done end
local id = redis.call('XADD', KEYS[1], '*', unpack(ARGV, 2))
redis.call('SET', KEYS[2], id, 'PX', ARGV[1])
return id
"""
