-- take.lua: the driver of the limiter script, appended after the algorithm
-- chunks (script.go assembles them; each algorithm's file becomes
-- algorithms[code]). One call decides one or more Takes, in order, as if each
-- ran alone: a Take sees every earlier Take of the call that was committed,
-- and each Take is all-or-nothing on its own.
--
-- Every algorithm chunk returns a table of three functions:
--   load(key, now, p)             reads the key's state from Redis into a table;
--   decide(key, st, now, p, force) decides one request against state st (never
--                                  modifying st) and returns a result table:
--       allowed     whether this key alone admits the request;
--       retry       µs until it would (only when not allowed);
--       delay       µs the request should wait before proceeding (shaping);
--       rem0,reset0 remaining and µs until reset of the untouched state st;
--       state       the new state, when the request takes something (hits > 0)
--                   and is allowed (or force is set); nil otherwise;
--       rem,reset   remaining and reset after the request (= rem0, reset0
--                   when state is nil);
--   store(key, st, now, p)        writes state st back, with a TTL.
-- Nothing is written until every Take of the call is decided, and each dirty
-- key is written once.
--
-- KEYS       one state key per request, in order (a key may repeat).
-- ARGV[1]    "" to take the time from Redis TIME; otherwise a time in µs that
--            overrides it (tests only: production never sets it).
-- Then, per Take:
--   mode     "t": take: commit only if every request is allowed;
--            "c": check: decide, never commit (a dry run);
--            "f": force: commit every request, allowed or not (the second
--                 phase of a Take spanning Redis Cluster slots, whose check
--                 already passed);
--   count    the number of requests in the Take;
--   and seven values per request: algorithm code, limit, period (µs),
--   capacity (burst of a bucket, limit of a window), hits (0 = peek),
--   calendar (0 none, 1 day, 2 week, 3 month, 4 year), max delay (µs,
--   0 = never delay).
-- Returns    five integers per request: allowed (1|0), remaining,
--            reset_after (µs), retry_after (µs), delay (µs). Rounding and
--            clamping happen here, once.

-- Redis < 5 replicates scripts verbatim, which forbids writes after TIME;
-- newer servers replicate effects anyway (the call is a no-op there).
if redis.replicate_commands then
	redis.replicate_commands()
end

local MAX_US = 9000000000000000 -- ~285 years: fits int64 ns in Go and a double exactly

local function clamp(x, lo, hi)
	if x ~= x or x < lo then -- x ~= x: NaN
		return lo
	end
	if x > hi then
		return hi
	end
	return x
end

local now
if ARGV[1] ~= "" then
	now = tonumber(ARGV[1])
else
	local t = redis.call("TIME")
	now = tonumber(t[1]) * 1000000 + tonumber(t[2])
end

local states = {} -- key → committed state (loaded, or changed by an earlier Take)
local dirty = {}  -- key → {algorithm, params} of the last committed change
local order = {}  -- dirty keys in first-change order, so writes are deterministic
local out = {}
local a, k = 2, 1

while a <= #ARGV do
	local mode = ARGV[a]
	local count = tonumber(ARGV[a + 1])
	a = a + 2
	local tentative = {} -- key → state after this Take's earlier requests
	local results = {}
	local all = true
	for i = 1, count do
		local key = KEYS[k]
		k = k + 1
		local alg = algorithms[ARGV[a]]
		if alg == nil then
			return redis.error_reply("ERR sluice limiter: unknown algorithm " .. tostring(ARGV[a]))
		end
		local p = {
			limit = tonumber(ARGV[a + 1]),
			period = tonumber(ARGV[a + 2]),
			cap = tonumber(ARGV[a + 3]),
			hits = tonumber(ARGV[a + 4]),
			cal = tonumber(ARGV[a + 5]),
			max_delay = tonumber(ARGV[a + 6]),
		}
		a = a + 7
		local st = tentative[key]
		local dup = st ~= nil
		if st == nil then
			st = states[key]
			if st == nil then
				st = alg.load(key, now, p)
				states[key] = st
			end
		end
		local r = alg.decide(key, st, now, p, mode == "f")
		r.key, r.alg, r.p, r.dup = key, alg, p, dup
		results[i] = r
		if r.state ~= nil then
			tentative[key] = r.state
		end
		if not r.allowed then
			all = false
		end
	end

	local commit = mode == "f" or (mode == "t" and all)
	for i = 1, count do
		local r = results[i]
		local allowed, remaining, reset, retry, delay = 1, r.rem, r.reset, 0, r.delay
		if commit then
			if r.state ~= nil then
				states[r.key] = r.state
				if dirty[r.key] == nil then
					order[#order + 1] = r.key
				end
				dirty[r.key] = { r.alg, r.p }
			end
		else
			remaining, reset = r.rem0, r.reset0
			if r.dup then
				-- An earlier request of this Take used the key; report the
				-- state the rejected Take leaves, not its tentative one.
				local p0 = {}
				for name, v in pairs(r.p) do
					p0[name] = v
				end
				p0.hits = 0
				local r0 = r.alg.decide(r.key, states[r.key], now, p0, false)
				remaining, reset = r0.rem0, r0.reset0
			end
			if not r.allowed then
				-- A rejection always says to wait at least 1 µs.
				allowed, retry, delay = 0, clamp(math.ceil(r.retry), 1, MAX_US), 0
			elseif mode == "t" then
				delay = 0 -- the Take was rejected: nobody waits
			end
		end
		local n = #out
		out[n + 1] = allowed
		out[n + 2] = clamp(math.floor(remaining), 0, r.p.cap)
		out[n + 3] = clamp(math.ceil(reset), 0, MAX_US)
		out[n + 4] = retry
		out[n + 5] = clamp(math.ceil(delay), 0, MAX_US)
	end
end

for _, key in ipairs(order) do
	local d = dirty[key]
	d[1].store(key, states[key], now, d[2])
end
return out
