-- take.lua: the driver of the limiter script, appended after the algorithm
-- chunks (script.go assembles them: algorithm(code) returns the module of
-- the algorithm file with that code, built on first use in a call). One call decides one
-- or more Takes, in order, as if each ran alone: a Take sees every earlier
-- Take of the call that was committed, and each Take is all-or-nothing on
-- its own.
--
-- Every algorithm chunk returns a table of three functions:
--   load(key, now, period)  reads the key's state from Redis: any value but
--       nil (a number for the buckets, a table for the windows);
--   decide(key, st, now, limit, period, cap, hits, cal, max_delay, force)
--       decides one request against state st, never modifying st, and
--       returns eight values:
--         allowed      whether this key alone admits the request;
--         retry        µs until it would (when not allowed);
--         delay        µs the request should wait before proceeding (shaping);
--         rem0, reset0 remaining and µs until reset of the untouched state;
--         state        the new state, when the request takes something
--                      (hits > 0) and is allowed (or force is set), else nil;
--         rem, reset   remaining and reset after the request (= rem0, reset0
--                      when state is nil);
--   store(key, st, now, period)  writes state st back, with a TTL;
--   refund(key, st, now, limit, period, cap, hits, cal)  returns the state
--       st would be had a Take of hits at now (this call's time, the
--       Take's) not been committed, or nil when there is nothing to give
--       back (the state moved on past it: the window ended, the bucket
--       refilled).
-- Nothing is written until every Take of the call is decided, and each dirty
-- key is written once.
--
-- The body runs on every call, so it avoids what costs there (callgrind on
-- Redis 7.0): a table (~1,000 instructions with its garbage collection),
-- tonumber of an argument (strtod), a function call. A Take of one request
-- (nearly all) skips the scratch array several requests need; repeated Take
-- arguments and limits (a hot key) are recognized by comparing strings; no
-- table is made per request; library functions are locals.
--
-- KEYS       one state key per request, in order (a key may repeat).
-- ARGV[1]    the clock of the call:
--              ""   the time from Redis TIME (nearly every call);
--              "?"  the time from TIME, returned after the decisions (the
--                   first call of a Take spanning Redis Cluster slots);
--              "~N" N µs, the time the first call of the Take read on its
--                   node, kept within MAX_SKEW of this node's TIME (the
--                   other calls of that Take: one "now" for the whole Take);
--              "N"  exactly N µs (refunds, which run at their take's time,
--                   and tests).
--            Every form but "" appends the time used to the reply.
-- ARGV[2]    the number S of distinct limits in the call, then six values per
--            limit: algorithm code, limit, period (µs), capacity (burst of a
--            bucket, limit of a window), calendar (0 none, 1 day, 2 week,
--            3 month, 4 year), max delay (µs, 0 = never delay). Requests
--            refer to them by number, so a hot limit's parameters are sent
--            and parsed once per call, not once per request.
-- Then, per Take, one argument when it has one request (nearly all do),
-- else one argument and then one per request:
--   <mode><j>:<hits>  a Take of one request, e.g. "t1:1";
--   <mode><count>     a Take of count requests, e.g. "t3", followed by
--   <j>:<hits>        for each of its requests, e.g. "1:1";
--   where mode is
--     "t": take: commit only if every request is allowed;
--     "c": check: decide, never commit (a dry run);
--     "f": force: commit every request, allowed or not;
--     "r": refund: give back the hits a "t" Take of these requests took at
--          this call's time (ARGV[1] "N", the time that Take used), when
--          another slot of the same Redis Cluster Take refused; reports
--          each limit as the refund leaves it;
--   j is the request's limit number (1..S) and hits its hits (0 = peek).
--   (One argument rather than four per Take: Redis spends about as much on
--   each argument, parsing it and handing it to Lua, as the script spends
--   deciding; and a call repeats a few distinct arguments, so each is
--   parsed once per call.)
-- Returns    five integers per request: allowed (1|0), remaining,
--            reset_after (µs), retry_after (µs), delay (µs), then the time
--            used (µs) unless ARGV[1] is "". Rounding and clamping happen
--            here, once.

-- Redis < 5 replicates scripts verbatim, which forbids writes after TIME;
-- newer servers replicate effects anyway (the call is a no-op there).
if redis.replicate_commands then
	redis.replicate_commands()
end

local KEYS, ARGV, tonumber, floor, ceil = KEYS, ARGV, tonumber, math.floor, math.ceil
local MAX_US = 9000000000000000 -- ~285 years: fits int64 ns in Go and a double exactly

-- MAX_SKEW bounds how far a Take's shared time ("~N") may be from this
-- node's own clock: masters' clocks agree within milliseconds under NTP,
-- and the call follows the first one by about a round trip.
local MAX_SKEW = 100000 -- µs

local clock = ARGV[1]
local now
if clock == "" or clock == "?" then
	local t = redis.call("TIME")
	now = tonumber(t[1]) * 1000000 + tonumber(t[2])
elseif string.byte(clock) == 126 then -- "~"
	local t = redis.call("TIME")
	local own = tonumber(t[1]) * 1000000 + tonumber(t[2])
	now = tonumber(string.sub(clock, 2))
	if now == nil or now < own - MAX_SKEW then
		now = own - MAX_SKEW
	elseif now > own + MAX_SKEW then
		now = own + MAX_SKEW
	end
else
	now = tonumber(clock)
end

-- The limits of this call: limit j's algorithm, limit, period, capacity,
-- calendar and max delay are L[6j-5..6j].
local nlimits = tonumber(ARGV[2])
local L = {}
local a = 3
for j = 1, nlimits do
	local alg = algorithm(ARGV[a])
	if alg == nil then
		return redis.error_reply("ERR sluice limiter: unknown algorithm " .. tostring(ARGV[a]))
	end
	local ls, cs, cal, md = ARGV[a + 1], ARGV[a + 3], 0, 0
	local limit = tonumber(ls)
	local cap = limit
	if cs ~= ls then
		cap = tonumber(cs)
	end
	if ARGV[a + 4] ~= "0" then
		cal = tonumber(ARGV[a + 4])
	end
	if ARGV[a + 5] ~= "0" then
		md = tonumber(ARGV[a + 5])
	end
	local b = 6 * j
	L[b - 5], L[b - 4], L[b - 3], L[b - 2], L[b - 1], L[b] = alg, limit, tonumber(ARGV[a + 2]), cap, cal, md
	a = a + 6
end

local states = {} -- key → committed state (loaded, or changed by an earlier Take)
-- dirty[key] is the limit number of the key's last committed change, and
-- dirty[1..ndirty] the dirty keys in first-change order, so writes are
-- deterministic (keys are strings: the two never collide).
local dirty, ndirty = {}, 0
local out, n = {}, 0

-- keep records state as key's committed state, changed by limit j, to be
-- written at the end.
local function keep(key, state, j)
	states[key] = state
	if dirty[key] == nil then
		ndirty = ndirty + 1
		dirty[ndirty] = key
	end
	dirty[key] = j
end

-- clamp keeps x within 0..hi; NaN (x ~= x) becomes 0.
local function clamp(x, hi)
	if x ~= x or x < 0 then
		return 0
	elseif x > hi then
		return hi
	end
	return x
end

-- emit appends one request's five reply values, rounded and clamped once,
-- here: a rejection (ok 0) always says to wait at least 1 µs, anything else
-- not at all.
local function emit(ok, remaining, reset, retry, delay, cap)
	if ok == 0 then
		retry = clamp(ceil(retry), MAX_US)
		if retry < 1 then
			retry = 1
		end
	else
		retry = 0
	end
	out[n + 1], out[n + 2], out[n + 3], out[n + 4], out[n + 5] =
		ok, clamp(floor(remaining), cap), clamp(ceil(reset), MAX_US), retry, clamp(ceil(delay), MAX_US)
	n = n + 5
end

-- The current Take's requests, RS values each at R[(i-1)*RS + 1..RS]; made
-- on the first Take of several requests and reused. (Multiple return values
-- and one reused table rather than a table per request: this loop runs for
-- every request a node sends.)
local R, RS = nil, 11

-- Parsed per-Take arguments, by their text: mode, and j and hits (a request)
-- or count (a Take of several). Request arguments start with a digit, Take
-- arguments with a letter, so they share the tables, made on first use.
local T_mode, T_j, T_hits, T_count
local find, sub = string.find, string.sub

local function parse(tok)
	if T_mode == nil then
		T_mode, T_j, T_hits, T_count = {}, {}, {}, {}
	end
	local m, from = sub(tok, 1, 1), 2
	if m ~= "t" and m ~= "c" and m ~= "f" and m ~= "r" then
		m, from = nil, 1
	end
	local colon = find(tok, ":", from, true)
	if colon == nil then
		local count = tonumber(sub(tok, from))
		if m ~= nil and count ~= nil then
			T_mode[tok], T_count[tok] = m, count
			return
		end
	else
		local j, hits = tonumber(sub(tok, from, colon - 1)), tonumber(sub(tok, colon + 1))
		if j ~= nil and hits ~= nil then
			T_mode[tok], T_j[tok], T_hits[tok] = m, j, hits
			return
		end
	end
	error("sluice limiter: malformed argument " .. tostring(tok))
end

-- refund gives back hits of limit j on key (mode "r") and emits the limit
-- as the refund leaves it.
local function refund(key, j, hits)
	local b = 6 * j
	local ralg, rlimit, rperiod, rcap, rcal, rmd = L[b - 5], L[b - 4], L[b - 3], L[b - 2], L[b - 1], L[b]
	local st = states[key]
	if st == nil then
		st = ralg.load(key, now, rperiod)
		states[key] = st
	end
	if hits > 0 then
		local state = ralg.refund(key, st, now, rlimit, rperiod, rcap, hits, rcal)
		if state ~= nil then
			keep(key, state, j)
			st = state
		end
	end
	local _, _, _, rem0, reset0 = ralg.decide(key, st, now, rlimit, rperiod, rcap, 0, rcal, rmd, false)
	emit(1, rem0, reset0, 0, 0, rcap)
end

local k = 1
local nargv = #ARGV
-- The previous Take's argument and what it says, and the previous one-request
-- Take's limit: a call often repeats both (a hot key), which then costs no
-- lookup at all.
local ptok, tmode, tj, thits, tcount
local pj, alg, limit, period, cap, cal, md
while a <= nargv do
	local tok = ARGV[a]
	a = a + 1
	if tok ~= ptok then
		ptok = tok
		if tok == "t1:1" then -- the usual one
			tmode, tj, thits = "t", 1, 1
		else
			if T_mode == nil or T_mode[tok] == nil then
				parse(tok)
			end
			tmode, tj, thits, tcount = T_mode[tok], T_j[tok], T_hits[tok], T_count[tok]
		end
	end
	local force = tmode == "f"
	if tmode == "r" then
		if tj ~= nil then
			refund(KEYS[k], tj, thits)
			k = k + 1
		else
			for _ = 1, tcount do
				local rt = ARGV[a]
				if T_j[rt] == nil then
					parse(rt)
				end
				refund(KEYS[k], T_j[rt], T_hits[rt])
				k, a = k + 1, a + 1
			end
		end
	elseif tj ~= nil then
		-- One request: what the general loop below does, without its
		-- scratch array (it commits iff the request is allowed, or forced).
		local key = KEYS[k]
		k = k + 1
		if tj ~= pj then
			pj = tj
			local b = 6 * tj
			alg, limit, period, cap, cal, md = L[b - 5], L[b - 4], L[b - 3], L[b - 2], L[b - 1], L[b]
		end
		local st = states[key]
		if st == nil then
			st = alg.load(key, now, period)
			states[key] = st
		end
		local allowed, retry, delay, rem0, reset0, state, remaining, reset =
			alg.decide(key, st, now, limit, period, cap, thits, cal, md, force)
		local ok = 1
		if force or (tmode == "t" and allowed) then
			if state ~= nil then
				keep(key, state, tj)
			end
		else
			remaining, reset = rem0, reset0
			if not allowed then
				ok, delay = 0, 0
			end
		end
		emit(ok, remaining, reset, retry, delay, cap)
	else
		if R == nil then
			R = {}
		end
		-- key → state after this Take's earlier requests; only a Take of
		-- several requests can name a key twice.
		local tentative = {}
		local all = true
		for i = 1, tcount do
			local key = KEYS[k]
			local rt = ARGV[a]
			if T_j[rt] == nil then
				parse(rt)
			end
			local j, hits = T_j[rt], T_hits[rt]
			k, a = k + 1, a + 1
			local l = 6 * j
			local ralg, rperiod = L[l - 5], L[l - 3]
			local st = tentative[key]
			local dup = st ~= nil
			if st == nil then
				st = states[key]
				if st == nil then
					st = ralg.load(key, now, rperiod)
					states[key] = st
				end
			end
			local allowed, retry, delay, rem0, reset0, state, rem, reset =
				ralg.decide(key, st, now, L[l - 4], rperiod, L[l - 2], hits, L[l - 1], L[l], force)
			if state ~= nil then
				tentative[key] = state
			end
			if not allowed then
				all = false
			end
			local b = (i - 1) * RS
			R[b + 1], R[b + 2], R[b + 3], R[b + 4], R[b + 5], R[b + 6] = key, j, allowed, retry, delay, rem0
			R[b + 7], R[b + 8], R[b + 9], R[b + 10], R[b + 11] = reset0, state, rem, reset, dup
		end

		local commit = force or (tmode == "t" and all)
		for i = 1, tcount do
			local b = (i - 1) * RS
			local key, j = R[b + 1], R[b + 2]
			local l = 6 * j
			local ok, remaining, reset, retry, delay = 1, R[b + 9], R[b + 10], 0, R[b + 5]
			if commit then
				local state = R[b + 8]
				if state ~= nil then
					keep(key, state, j)
				end
			else
				remaining, reset = R[b + 6], R[b + 7]
				if R[b + 11] then
					-- An earlier request of this Take used the key; report the
					-- state the rejected Take leaves, not its tentative one.
					local _
					_, _, _, remaining, reset = L[l - 5].decide(key, states[key], now,
						L[l - 4], L[l - 3], L[l - 2], 0, L[l - 1], L[l], false)
				end
				if not R[b + 3] then
					ok, retry, delay = 0, R[b + 4], 0
				elseif tmode == "t" then
					delay = 0 -- the Take was rejected: nobody waits
				end
			end
			emit(ok, remaining, reset, retry, delay, L[l - 2])
		end
	end
end

for i = 1, ndirty do
	local key = dirty[i]
	local l = 6 * dirty[key]
	L[l - 5].store(key, states[key], now, L[l - 3])
end
if clock ~= "" then
	out[n + 1] = now
end
return out
