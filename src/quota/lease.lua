-- One node's exchange with one tenant's bucket: the arithmetic of
-- src/quota/bucket.rs (FleetBucket::exchange), on Redis' own clock.
--
-- KEYS[1]  the tenant's bucket: a hash of `pool`, `last` (microseconds of
--          Redis' TIME) and one `n:<node>` field per node with a share,
--          "<demand> <credit> <seen>"
-- ARGV     node, rate, burst, asked, demand, charge, returned, leaving (0/1),
--          share TTL (microseconds), key TTL (milliseconds)
-- Returns  { granted, available }
local key = KEYS[1]
local node = ARGV[1]
local rate = tonumber(ARGV[2])
local burst = tonumber(ARGV[3])
local asked = tonumber(ARGV[4])
local demand = tonumber(ARGV[5])
local charge = tonumber(ARGV[6])
local returned = tonumber(ARGV[7])
local leaving = ARGV[8] == '1'
local share_ttl = tonumber(ARGV[9])
local key_ttl = tonumber(ARGV[10])
local max_nodes = 1024

local time = redis.call('TIME')
local now = tonumber(time[1]) * 1000000 + tonumber(time[2])

-- Read the bucket; a missing one is made full (an expired bucket would
-- have refilled by then).
local pool, last
local nodes = {}
local count = 0
local fields = redis.call('HGETALL', key)
for i = 1, #fields, 2 do
  local field, value = fields[i], fields[i + 1]
  if field == 'pool' then
    pool = tonumber(value)
  elseif field == 'last' then
    last = tonumber(value)
  elseif string.sub(field, 1, 2) == 'n:' then
    local d, c, s = string.match(value, '^(%S+) (%S+) (%S+)$')
    if d then
      nodes[string.sub(field, 3)] = { demand = tonumber(d), credit = tonumber(c), seen = tonumber(s) }
      count = count + 1
    end
  end
end
if pool == nil or last == nil then
  pool = burst
  last = now
end

local elapsed = now - last
if elapsed < 0 then elapsed = 0 end
if now > last then last = now end

-- Nodes not heard from for the share TTL are gone, with their credit;
-- the caller is not.
local stale_before = now - share_ttl
for id, share in pairs(nodes) do
  if share.seen < stale_before and id ~= node then
    nodes[id] = nil
    count = count - 1
  end
end

local mine = nodes[node]
if mine == nil then
  mine = { demand = 0, credit = 0, seen = now }
  nodes[node] = mine
  count = count + 1
end
mine.demand = demand
mine.seen = now
if count > max_nodes then
  local oldest, oldest_seen = nil, nil
  for id, share in pairs(nodes) do
    if id ~= node and (oldest_seen == nil or share.seen < oldest_seen) then
      oldest, oldest_seen = id, share.seen
    end
  end
  if oldest then
    nodes[oldest] = nil
    count = count - 1
  end
end

-- Refill, divided by demand, each node capped at its share of the burst.
local refill = rate * elapsed / 1000000
local total_demand = 0
for _, share in pairs(nodes) do total_demand = total_demand + share.demand end
if total_demand <= 0 then
  pool = pool + refill
else
  local overflow = 0
  for _, share in pairs(nodes) do
    local fraction = share.demand / total_demand
    local offered = refill * fraction
    local room = burst * fraction - share.credit
    if room < 0 then room = 0 end
    local taken = offered
    if taken > room then taken = room end
    share.credit = share.credit + taken
    overflow = overflow + offered - taken
  end
  pool = pool + overflow
end

-- Fallback spending is charged, never into debt.
if charge > 0 then
  local from_credit = mine.credit
  if from_credit > charge then from_credit = charge end
  mine.credit = mine.credit - from_credit
  pool = pool - (charge - from_credit)
  if pool < 0 then pool = 0 end
end
pool = pool + returned

local function cap()
  local credits = 0
  for _, share in pairs(nodes) do credits = credits + share.credit end
  if credits > burst then
    local scale = burst / credits
    for _, share in pairs(nodes) do share.credit = share.credit * scale end
    pool = 0
  else
    if pool > burst - credits then pool = burst - credits end
    if pool < 0 then pool = 0 end
  end
end
cap()

-- Grant from the caller's credit first, then the pool; floored.
local from_credit = mine.credit
if from_credit > asked then from_credit = asked end
local from_pool = asked - from_credit
if from_pool > pool then from_pool = pool end
local granted = math.floor(from_credit + from_pool)
local taken = mine.credit
if taken > granted then taken = granted end
mine.credit = mine.credit - taken
pool = pool - (granted - taken)
if pool < 0 then pool = 0 end
local available = math.floor(mine.credit + pool)
if leaving then
  pool = pool + mine.credit
  nodes[node] = nil
  cap()
end

-- Write it back whole, with its TTL.
redis.call('DEL', key)
local out = { 'pool', string.format('%.17g', pool), 'last', string.format('%d', last) }
for id, share in pairs(nodes) do
  out[#out + 1] = 'n:' .. id
  out[#out + 1] = string.format('%.17g %.17g %d', share.demand, share.credit, share.seen)
end
redis.call('HSET', key, unpack(out))
redis.call('PEXPIRE', key, key_ttl)
return { granted, available }
