-- fixed_window.lua: a counter per window. Windows are consecutive multiples
-- of period since the Unix epoch (so minute windows start on the minute), or,
-- when calendar is set, UTC calendar days, ISO weeks (Monday), months or
-- years. The chunk returns the load/decide/store table take.lua calls for
-- every key whose algorithm is fixed_window.
--
-- State: one string key "<window start µs>:<count>". Storing the window's
-- start (rather than relying on the key expiring at the window's end) keeps
-- the count right whatever the key's TTL; the key still expires at the end
-- of its window, so idle keys vanish.
local M = {}

local DAY = 86400000000 -- µs

-- days_from_civil and civil_from_days convert between a proleptic Gregorian
-- date and days since 1970-01-01 (Howard Hinnant's algorithms). Lua numbers
-- are doubles; every value here is a small integer, so the arithmetic is
-- exact, and math.floor gives the floored division the algorithms need.
local function days_from_civil(y, m, d)
	if m <= 2 then
		y = y - 1
	end
	local era = math.floor(y / 400)
	local yoe = y - era * 400
	local mp = (m + 9) % 12 -- March = 0
	local doy = math.floor((153 * mp + 2) / 5) + d - 1
	local doe = yoe * 365 + math.floor(yoe / 4) - math.floor(yoe / 100) + doy
	return era * 146097 + doe - 719468
end

local function civil_from_days(z)
	z = z + 719468
	local era = math.floor(z / 146097)
	local doe = z - era * 146097
	local yoe = math.floor((doe - math.floor(doe / 1460) + math.floor(doe / 36524) - math.floor(doe / 146096)) / 365)
	local doy = doe - (365 * yoe + math.floor(yoe / 4) - math.floor(yoe / 100))
	local mp = math.floor((5 * doy + 2) / 153)
	local m = mp + 3
	if mp >= 10 then
		m = mp - 9
	end
	local y = yoe + era * 400
	if m <= 2 then
		y = y + 1
	end
	return y, m
end

-- window returns the start and end (µs) of the window holding now.
local function window(now, period, cal)
	if cal == 0 then
		local start = now - now % period
		return start, start + period
	end
	local days = math.floor(now / DAY)
	if cal == 1 then
		return days * DAY, (days + 1) * DAY
	elseif cal == 2 then
		-- 1970-01-01 was a Thursday, three days after a Monday.
		local monday = days - (days + 3) % 7
		return monday * DAY, (monday + 7) * DAY
	end
	local y, m = civil_from_days(days)
	if cal == 3 then
		local ny, nm = y, m + 1
		if nm > 12 then
			ny, nm = y + 1, 1
		end
		return days_from_civil(y, m, 1) * DAY, days_from_civil(ny, nm, 1) * DAY
	end
	return days_from_civil(y, 1, 1) * DAY, days_from_civil(y + 1, 1, 1) * DAY
end

-- M.window is window, for the async flush (async.lua), which counts hits in
-- the window of the time they were admitted.
M.window = window

function M.load(key)
	local v = redis.call("GET", key)
	if v then
		local start, count = string.match(v, "^(%-?%d+):(%d+)$")
		if start then
			return { start = tonumber(start), count = tonumber(count) }
		end
	end
	return {}
end

function M.decide(_, st, now, limit, period, _, hits, cal, _, force)
	local start, stop = window(now, period, cal)
	local count = 0
	if st.start == start then
		count = st.count
	elseif st.start ~= nil and st.start > now then
		-- The state is of a later window than now says: a Take judged at a
		-- time another node read (a Redis Cluster Take spanning slots) may
		-- be behind this key's last writer. Count in the later window
		-- rather than overwrite it.
		start, stop = window(st.start, period, cal)
		count = st.count
	end
	local rem0, reset0 = limit - count, stop - now
	local allowed, retry = count + hits <= limit, 0
	if not allowed then
		-- Only a new window makes room (even for hits > limit, which never
		-- fit: the new window is the best there is to report).
		retry = stop - now
	end
	if hits > 0 and (allowed or force) then
		return allowed, retry, 0, rem0, reset0, { start = start, count = count + hits, stop = stop }, limit - count - hits, reset0
	end
	return allowed, retry, 0, rem0, reset0, nil, rem0, reset0
end

-- refund takes hits off the count of now's window (exact), if the state is
-- still that window's.
function M.refund(_, st, now, _, period, _, hits, cal)
	local start, stop = window(now, period, cal)
	if st.start ~= start then
		return nil
	end
	return { start = start, count = math.max(st.count - hits, 0), stop = stop }
end

function M.store(key, st, now)
	local ttl = math.max(1, math.ceil((st.stop - now) / 1000))
	redis.call("SET", key, string.format("%.0f:%.0f", st.start, st.count), "PX", ttl)
end

return M
