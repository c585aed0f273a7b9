-- sliding_window_log.lua: an exact sliding window. Every admitted hit is
-- logged with its time; a request is allowed when the hits logged in the
-- last period, plus its own, stay within limit. The chunk returns the
-- load/decide/store table take.lua calls for every key whose algorithm is
-- sliding_window_log.
--
-- State: a sorted set with one member per admitted hit, scored by its time
-- (µs of Redis TIME). A hit at time t counts while t > now - period. Members
-- are "<t>-<n>": the hits logged at one microsecond are numbered 1, 2, 3...
-- (ZCOUNT of that score gives the next number, as expired hits are trimmed
-- by whole scores; it is 0 unless the newest logged hit is at now), so hits
-- in the same microsecond stay distinct.
--
-- Memory: hits are logged only when they fit, and every write trims the
-- expired ones first, so the set never holds more than limit members (for
-- a period after a rule edit, limits of two periods may share the key and
-- the log keeps the longer one's window):
-- about 30 bytes per hit up to 128 members (Redis's compact listpack), about
-- 120 beyond (see BENCHMARKS.md). That makes this the algorithm for small
-- limits: for thousands of hits per window prefer sliding_window_counter,
-- which keeps three numbers in ~170 bytes.
local M = {}

-- longest[key]: the longest period any limit of this call counted key over.
-- store keeps that much of the log, so when limits of different periods
-- share a key (a rule's period edited while its key lives), a write by the
-- shorter one does not drop hits the longer one still counts.
local longest = {}

local function us(x)
	return string.format("%.0f", x)
end

-- logged returns the hits logged in the window of period ending at now and
-- the time of the newest logged hit (nil when none is in the window).
local function logged(key, now, period)
	local base = redis.call("ZCOUNT", key, "(" .. us(now - period), "+inf")
	local newest
	if base > 0 then
		newest = tonumber(redis.call("ZRANGE", key, -1, -1, "WITHSCORES")[2])
	end
	return base, newest
end

function M.load(key, now, period)
	local base, newest = logged(key, now, period)
	-- base: hits logged in the window of period; added: hits admitted by
	-- this script call, all at now, not yet written; at_now: some logged hit
	-- is at now.
	return { base = base, period = period, added = 0, newest = newest, at_now = newest == now }
end

function M.decide(key, st, now, limit, period, _, hits, _, _, force)
	longest[key] = math.max(longest[key] or 0, period)
	local base, newest = st.base, st.newest
	if period ~= st.period then
		-- One key under limits of different periods (a rule edited while
		-- its key lives, Takes of both coalesced into one call): count this
		-- period's window. Nothing is written before the call ends, and the
		-- hits added in it are at now, inside every window.
		base, newest = logged(key, now, period)
	end
	local count = base + st.added
	if st.added > 0 then
		newest = now
	end
	local rem0, reset0 = limit - count, 0
	if count > 0 then
		-- The window is empty once its newest hit has left.
		reset0 = newest + period - now
	end
	local allowed, retry = count + hits <= limit, 0
	if not allowed then
		local k = count + hits - limit -- hits that must leave the window first
		if hits > limit then
			retry = period -- never fits; a whole window is the best to report
		elseif k <= base then
			-- The k-th oldest logged hit of the window leaves at its time + period.
			local expired = redis.call("ZCOUNT", key, "-inf", us(now - period))
			local e = redis.call("ZRANGE", key, expired + k - 1, expired + k - 1, "WITHSCORES")
			retry = tonumber(e[2]) + period - now
		else
			retry = period -- it is one admitted in this call, at now
		end
	end
	if hits > 0 and (allowed or force) then
		return allowed, retry, 0, rem0, reset0, { base = st.base, period = st.period, added = st.added + hits, newest = now, at_now = st.at_now, removed = st.removed },
			limit - count - hits, period
	end
	return allowed, retry, 0, rem0, reset0, nil, rem0, reset0
end

-- refund unlogs hits logged at now (the refunded Take's time): first those
-- this call added and has not written, then, at store, the highest-numbered
-- logged at now, so numbers at now stay 1..n. Hits at one time are
-- interchangeable, so this is exact.
function M.refund(_, st, _, _, _, _, hits)
	local undo = math.min(st.added, hits)
	local removed = hits - undo -- store removes at most what is logged at now
	return { base = math.max(st.base - removed, 0), period = st.period, added = st.added - undo, newest = st.newest,
		at_now = st.at_now, removed = (st.removed or 0) + removed }
end

function M.store(key, st, now, period)
	period = math.max(period, longest[key] or 0)
	redis.call("ZREMRANGEBYSCORE", key, "-inf", us(now - period))
	local t = us(now)
	local seq = 0
	if st.removed and st.removed > 0 then
		local c = redis.call("ZCOUNT", key, t, t)
		for i = c, math.max(c - st.removed + 1, 1), -1 do
			redis.call("ZREM", key, t .. "-" .. us(i))
		end
	end
	-- Hits may be logged at now when the newest is at now, or later (a
	-- Take judged at another node's time, which may be behind this key's
	-- last writer), or after a refund.
	if st.at_now or (st.newest ~= nil and st.newest > now) or st.removed then
		seq = redis.call("ZCOUNT", key, t, t)
	end
	local args = {}
	for i = 1, st.added do
		args[#args + 1] = t
		args[#args + 1] = t .. "-" .. us(seq + i)
		if #args >= 1000 then -- stay far below Lua's unpack limit
			redis.call("ZADD", key, unpack(args))
			args = {}
		end
	end
	if #args > 0 then
		redis.call("ZADD", key, unpack(args))
	end
	-- The newest hit leaves the window after one period.
	redis.call("PEXPIRE", key, math.max(1, math.ceil(period / 1000)))
end

return M
